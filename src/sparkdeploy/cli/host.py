"""`sparkdeploy host setup [--dry-run] [--apply-network]`: earlyoom, sshd OOM protection, optional netplan."""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.markup import escape

from sparkdeploy.cli.options import chosen_service, inventory_option, selected_services
from sparkdeploy.errors import RemoteError
from sparkdeploy.remote.ssh import Pool, target_of
from sparkdeploy.steps.host import host_setup
from sparkdeploy.verdict import Status

err = Console(stderr=True, highlight=False, soft_wrap=True)
_STYLE = {Status.OK: "green", Status.WOULD_CHANGE: "yellow", Status.SKIPPED: "dim", Status.CHANGED: "yellow",
          Status.FAILED: "red bold"}


@click.group()
def host() -> None:
    """Host guard rails on every node (earlyoom, sshd OOM protection, CX-7 netplan)."""


@host.command()
@inventory_option()
@click.option("--dry-run", is_flag=True, help="show the diff and the actions; change nothing")
@click.option("--apply-network", is_flag=True,
              help="also write /etc/netplan/40-cx7.yaml (one /24 per CX-7 twin, MTU 9000) and `netplan apply`")
@click.option("--json", "as_json", is_flag=True, help="print the items per node as JSON on stdout")
@click.option("--trust-new-hosts", is_flag=True, help="accept and record SSH host keys not seen before")
def setup(inventory_file, dry_run, apply_network, as_json, trust_new_hosts):
    """Install and configure earlyoom (prefer vllm/python/ray, avoid sshd/dockerd/containerd/systemd), pin sshd's
    OOMScoreAdjust=-1000, and with --apply-network the CX-7 netplan. Shows the diff first; idempotent."""
    # every node of the inventory, whichever service it serves or none (a ring's idle node needs its guard rails
    # and netplan too); --service: that service's nodes
    nodes = {n.name: n for inv in selected_services(inventory_file)
             for n in (*inv.nodes, *(() if chosen_service() else inv.elsewhere))}
    with Pool([target_of(n.name, n.ssh) for n in nodes.values()], trust_new_hosts=trust_new_hosts) as pool:
        res = host_setup(pool, nodes, dry_run=dry_run, apply_network=apply_network)
    for name, its in res.items.items():
        for it in its:
            if it.diff:
                err.print(it.diff.rstrip("\n"), markup=False, highlight=False)
    for name, its in res.items.items():
        for it in its:
            detail = it.note if it.status in (Status.FAILED, Status.SKIPPED) or not it.what else "; ".join(it.what)
            style = _STYLE.get(it.status, "yellow")
            err.print(f"  [{style}]{it.status.value:<12}[/{style}] {name:<9} {it.name:<17} {detail}")
            if it.note and it.what and it.status not in (Status.FAILED, Status.SKIPPED):
                err.print(f"{'':>42}[dim]{it.note}[/dim]")
        if dry_run:
            for e in res.effects[name]:
                err.print(f"{'':>42}[dim]{escape(e)}[/dim]")
    for name, why in res.failed.items():
        err.print(f"[red bold]{name}: {why}[/red bold]")
    verb = "would change" if dry_run else "changed"
    err.print(f"host setup: {res.changes} item(s) {verb}" + (", nothing to do" if res.changes == 0 else "")
              + (f"; FAILED on {', '.join(sorted(res.failed))}" if res.failed else ""))
    if as_json:
        click.echo(json.dumps(res.to_dict(dry_run), indent=2))
    if res.failed:
        raise RemoteError(f"host setup failed on {', '.join(sorted(res.failed))}")


COMMANDS = [host]
