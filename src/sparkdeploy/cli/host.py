"""`sparkdeploy host setup [--dry-run] [--apply-network]`: earlyoom, sshd OOM protection, optional netplan."""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.markup import escape

from sparkdeploy import hostsetup as hs
from sparkdeploy.cli.options import chosen_service, inventory_option, selected_services
from sparkdeploy.connection import recording
from sparkdeploy.errors import RemoteError
from sparkdeploy.remote import Pool
from sparkdeploy.remote import target_of

err = Console(stderr=True, highlight=False, soft_wrap=True)
_STYLE = {hs.OK: "green", hs.CHANGE: "yellow", hs.SKIPPED: "dim", "changed": "yellow", "failed": "red bold"}


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
        errors = pool.open()
        for name, e in errors.items():
            err.print(f"[red bold]{name}: {e}[/red bold]")

        def read(conn):
            n = nodes[conn.name]
            sudo = hs.sudo_prefix(n.ssh.user)
            hca = tuple(dict.fromkeys(dev for link in n.data_links() for dev in link.hca))  # every link's
            state = hs.read_state(conn, hca, sudo=sudo)
            return hs.plan_items(conn.name, state, netdev=n.netdev, data_ip=n.data_ip, hca=hca,
                                 links=n.data_links(), apply_network=apply_network)

        planned = pool.map(read)
        failed = dict(errors)
        items = {}
        for name, res in planned.items():
            if isinstance(res, Exception):
                failed[name] = res
            else:
                items[name] = res
        for name, its in items.items():
            for it in its:
                if it.diff:
                    err.print(it.diff.rstrip("\n"), markup=False, highlight=False)
        done = {}
        todo = [n for n, its in items.items() if any(i.status == hs.CHANGE for i in its)]
        with recording(dry=dry_run) as made:  # a dry run lists the exact commands and writes; makes none
            applied = pool.map(lambda c: hs.apply_items(c, items[c.name], sudo=hs.sudo_prefix(nodes[c.name].ssh.user)),
                               todo)
        effects = {n: [e for e in made if e.startswith(f"{n}: ")] for n in items}
        for name, res in applied.items():
            if isinstance(res, Exception):
                failed[name] = res
            else:
                done[name] = res
    for name, its in items.items():
        outcome = {a.item: a for a in done.get(name, [])}
        for it in its:
            status, detail = it.status, "; ".join(it.what) or it.note
            if it.name in outcome and not dry_run:
                status = outcome[it.name].status
                detail = outcome[it.name].detail if status != "changed" else detail
            elif status == hs.CHANGE:
                status = "would change"
            style = _STYLE.get(status, "yellow")
            err.print(f"  [{style}]{status:<12}[/{style}] {name:<9} {it.name:<17} {detail}")
            if it.note and it.what:
                err.print(f"{'':>42}[dim]{it.note}[/dim]")
        if dry_run:
            for e in effects[name]:
                err.print(f"{'':>42}[dim]{escape(e)}[/dim]")
    for name, its in done.items():
        if any(a.status == "failed" for a in its):
            failed.setdefault(name, next(a.detail for a in its if a.status == "failed"))
    for name, e in failed.items():
        err.print(f"[red bold]{name}: {e}[/red bold]")
    changes = sum(1 for its in items.values() for i in its if i.status == hs.CHANGE)
    verb = "would change" if dry_run else "changed"
    err.print(f"host setup: {changes} item(s) {verb}" + (", nothing to do" if changes == 0 else "")
              + (f"; FAILED on {', '.join(sorted(failed))}" if failed else ""))
    if as_json:
        click.echo(json.dumps({"dry_run": dry_run, "changes": changes, "effects": effects,
                               "failed": {k: str(v) for k, v in failed.items()},
                               "nodes": {k: [i.to_dict() for i in v] for k, v in items.items()}}, indent=2))
    if failed:
        raise RemoteError(f"host setup failed on {', '.join(sorted(failed))}")


COMMANDS = [host]
