"""`sparkdeploy vocab capture [on|off|clear|status]` (attached to the `vocab` group); `vocab learn` with no
COUNTS pulls what it gathered (`steps.capture.pull`).

Exit codes: 0 done (or nothing to change, or a clean dry run); 1 a node refused or could not be reached.
"""

from __future__ import annotations

import json

import click

from sparkdeploy.cli.options import connected, inventory_option
from sparkdeploy.cli.vocab import vocab


@vocab.command("capture")
@click.argument("mode", type=click.Choice(["on", "off", "clear", "status"]), default="status")
@click.option("--dry-run", is_flag=True, help="show what would change on each node; change nothing")
@inventory_option("inventory")
@click.option("--trust-new-hosts", is_flag=True, help="accept and record SSH host keys not seen before")
@click.option("--json", "as_json", is_flag=True, help="print each node's capture state as JSON on stdout")
def capture_cmd(mode, dry_run, inventory, trust_new_hosts, as_json) -> None:
    """Count the token ids the service emits, for `vocab learn` (opt-in; ids only: no text, no prompts).

    `on` and `off` take effect within a second, without restarting the engine; `off` keeps what was counted,
    `clear` deletes it. Counts build up in /var/lib/sparkdeploy/capture on the node that runs the engine core
    (the head), flushed every 10 s; `vocab learn` (no COUNTS) pulls them and makes a list from them."""
    from sparkdeploy.steps import capture

    with connected(inventory, trust_new_hosts) as cluster:
        outcomes = [] if mode == "status" else capture.switch(cluster, mode, dry_run=dry_run)
        now = capture.states(cluster)
    if as_json:
        click.echo(json.dumps({"mode": mode, "dry_run": dry_run, "nodes": {n: s.to_dict() for n, s in now.items()},
                               "outcomes": [o.to_dict() for o in outcomes]}, indent=2))
        return
    for o in outcomes:
        click.echo(f"{o.node}: {o.status}" + "".join(f"\n  {'would ' if dry_run else ''}{a}" for a in o.actions))
    for n, s in now.items():
        state = "on" if s.on else "off"
        if not s.wired:
            state += " (not wired into the serving release: run `sparkdeploy up`)"
        held = ", ".join(f"{p} ({size:,} bytes)" for p, size in s.files.items()) or "no counts"
        click.echo(f"{n}: capture {state}; {held}")


COMMANDS: list = []  # attached to the `vocab` group above
