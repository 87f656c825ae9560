"""`sparkdeploy doctor [--json]`: preflight every node; each check with status, reason and the fix."""

from __future__ import annotations

import json

import click
from rich.console import Console

from sparkdeploy import paths
from sparkdeploy.checks import doctor as doctor_mod
from sparkdeploy.cli.options import chosen_service, inventory_option
from sparkdeploy.model import inventory as inventory_mod
from sparkdeploy.verdict import Status

err = Console(stderr=True, highlight=False, soft_wrap=True)
_STYLE = {Status.OK: "green", Status.WARN: "yellow", Status.FAILED: "red bold", Status.SKIPPED: "dim"}


@click.command()
@inventory_option()
@click.option("--json", "as_json", is_flag=True, help="print every result as JSON on stdout")
@click.option("--facts", "facts_file", default=None, metavar="FILE",
              help="facts YAML (as for `plan --facts`): its gpu_name/driver per node replace what nvidia-smi says "
                   "(simulated nodes have none; also rehearses a driver mismatch)")
@click.option("--dir", "checkpoint_dir", default=None, metavar="PATH",
              help="checkpoint directory on the nodes (default: the profile's model.host_dir)")
@click.option("--trust-new-hosts", is_flag=True, help="accept and record SSH host keys not seen before")
def doctor(inventory_file, as_json, facts_file, checkpoint_dir, trust_new_hosts):
    """Check every node before a deployment: SSH, GPU/driver, SM clock and thermal slowdown, kernel (the known-bad
    list) and modules, RoCE twins, MTU 9000, GID index (against the running release's and across nodes),
    earlyoom, sshd OOM protection, disk, Docker + NVIDIA runtime, other GPU processes, stale units, memory,
    every path that must work (peers, the head's master port, the router to each service head), bandwidth per
    pair against the ports' negotiated speed, and clock skew. Exit 0 when nothing fails (warnings allowed),
    1 otherwise."""
    inv = inventory_mod.load(inventory_file or paths.default_inventory(), chosen_service())
    exam = doctor_mod.examine(inv, facts_file=facts_file, checkpoint_dir=checkpoint_dir,
                              trust_new_hosts=trust_new_hosts)
    if as_json:
        click.echo(json.dumps(exam.to_dict(), indent=2))
    else:
        for r in exam.results:
            style = _STYLE[r.status]
            err.print(f"  [{style}]{r.status.value:<11}[/{style}] {r.node:<9} {r.check:<17} {r.reason}")
            if r.fix and r.status in (Status.FAILED, Status.WARN):
                err.print(f"{'':>41}[dim]fix: {r.fix}[/dim]")
        counts = {v: sum(r.status is v for r in exam.results) for v in _STYLE}
        summary = ", ".join(f"{n} {v.value}" for v, n in counts.items() if n)
        style = _STYLE[exam.status]
        err.print(f"[{style}]doctor: {exam.status.value}[/{style}] ({summary}; {exam.seconds:.1f} s)")
    failed = [f"{r.node} {r.check}" for r in exam.results if r.status is Status.FAILED]
    if failed:  # an error, not click's Exit: the CLI turns it into exit status 1
        raise doctor_mod.ChecksFailed(f"doctor: {len(failed)} check(s) failed: {', '.join(failed)}")


COMMANDS = [doctor]
