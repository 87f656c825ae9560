"""Deploy commands: up, down, status, health, logs, rollback (the orchestration lives in sparkdeploy.steps)."""

from __future__ import annotations

import json
import subprocess
import sys

import click
from rich.console import Console
from rich.markup import escape

from sparkdeploy import paths
from sparkdeploy.cli.options import (
    chosen_service,
    deploy_exit_code,
    inventory_option,
    print_speed,
    selected_services,
    sentinel_option,
    speed_after_gate,
)
from sparkdeploy.steps import deploy as D
from sparkdeploy.steps.base import CHANGED, FAILED, OK, WARN, WOULD
from sparkdeploy.steps.deploy import Options, load_context
from sparkdeploy.verdict import Status

err = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 160)

_STYLE = {OK: "green", CHANGED: "yellow", WOULD: "yellow", WARN: "yellow", FAILED: "red bold", "skipped": "dim"}


_inventory_option = inventory_option("inventory")


def _trust_option(f):
    return click.option("--trust-new-hosts", is_flag=True,
                        help="accept and record SSH host keys not seen before (changed keys are always refused)")(f)


def _inv(path: str | None) -> str:
    return path or str(paths.default_inventory())


def _log(msg: str) -> None:
    err.print(f"[dim]·[/dim] {msg}")


def _print_outcomes(outcomes) -> None:
    for o in outcomes:
        style = _STYLE.get(o.status, "")
        line = f"  [{style}]{o.status:<12}[/{style}] {o.step:<13} {o.node or '-':<10}"
        if o.detail:
            line += f" {o.detail}"
        err.print(line)
        for a in o.actions:
            err.print(f"{'':>39}[dim]- {a}[/dim]")
        if o.status == WOULD:  # a dry run: the exact commands and writes, as the real run will make them
            for e in o.effects:
                err.print(f"{'':>41}[dim]{escape(e)}[/dim]")
                for line in getattr(e, "diff", "").splitlines():  # a file write: its change to the node's file
                    err.print(f"{'':>43}{escape(line)}")


@click.command()
@_inventory_option
@click.option("--nodes", type=int, default=None, help="how many nodes to deploy on (default: all of the inventory)")
@click.option("--dry-run", is_flag=True, help="read the nodes and show every change; change nothing")
@click.option("--json", "as_json", is_flag=True, help="print the result as JSON on stdout")
@_trust_option
@click.option("--ready-timeout", type=float, default=900, show_default=True,
              help="seconds to wait for the engine to answer a real completion (also the watchdog's start grace)")
@click.option("--watchdog-grace", type=float, default=None,
              help="seconds the watchdog lets a (re)started pair get ready (default: --ready-timeout)")
@click.option("--watchdog-backoff", type=float, default=30, show_default=True, help="first coupled-restart backoff (s)")
@click.option("--watchdog-cap", type=int, default=4, show_default=True, help="coupled restarts before the watchdog stops")
@sentinel_option
def up(inventory, nodes, dry_run, as_json, trust_new_hosts, ready_timeout, watchdog_grace, watchdog_backoff,
       watchdog_cap, sentinel, allow_slower):
    """Converge the nodes on the plan: image, files, units, then start workers-first and gate on health. With
    `services:` and no --service, every service in turn (a signal stops the turn at the service it hit); a dry
    run reads them side by side. A service's replicas go one at a time, each out of the router's rotation while it
    restarts; one that fails leaves the next on their release. Exit 0 served, 1 failed, 3 served but slower than
    before beyond noise."""
    opts = Options(nodes=nodes, dry_run=dry_run, trust_new_hosts=trust_new_hosts, ready_timeout=ready_timeout,
                   watchdog_grace=watchdog_grace, watchdog_backoff_s=watchdog_backoff, watchdog_cap=watchdog_cap,
                   log=_log)
    progress = _UpProgress(dry_run, allow_slower)
    turns = D.up_turns(_inv(inventory), opts, selected_services(inventory), _measure(sentinel), progress)
    if turns.router is not None:
        _print_router(turns.router)
    if as_json:
        results = progress.results
        payload = dict(next(iter(results.values()))) if len(results) == 1 else {"ok": turns.ok, "services": results}
        click.echo(json.dumps({**payload, **({"router": turns.router.to_dict()} if turns.router else {})}, indent=2))
    raise click.exceptions.Exit(deploy_exit_code(turns.ok, [r["sentinel"] for r in progress.results.values()],
                                                 allow_slower))


class _UpProgress:
    """Prints each service's `up` as its turn ends; keeps its JSON for --json."""

    def __init__(self, dry_run: bool, allow_slower: bool):
        self.dry_run, self.allow_slower, self.results = dry_run, allow_slower, {}

    def begin(self, key: str | None) -> None:
        if key is not None:
            err.print(f"[bold]service {key}[/bold]")

    def end(self, key: str | None, run: D.Served | None) -> None:
        if run is None:
            err.print(f"[yellow]skipped: an earlier replica of {key.split('/')[0]} failed; {key} keeps its "
                      "release[/yellow]")
            self.results[key] = {"healthy": False, "skipped": True, "sentinel": None}
            return
        res = run.result
        _print_outcomes(res.outcomes)
        style = "green" if D.served(run, self.dry_run) else "red bold"
        err.print(f"[{style}]{res.message}[/{style}]  ({res.changes} change(s), {res.seconds:.1f} s)")
        print_speed(err, run.speed, self.allow_slower)
        self.results[key] = dict(res.to_dict(), sentinel=run.speed)

    def begin_router(self) -> None:
        err.print("[bold]router[/bold]")


def _measure(sentinel: bool) -> D.Measure | None:
    """The speed sentinel as the verbs call it after a gate (None: --no-sentinel)."""
    return (lambda cx, number, against=None: speed_after_gate(cx, number, _log, against=against)) if sentinel \
        else None


def _print_router(router: D.RouterResult) -> None:
    _print_outcomes(router.outcomes)
    err.print(f"[green]{router.message}[/green]" if router.ok else f"[red bold]{router.message}[/red bold]")


def _services(inventory) -> list[str | None]:
    """What the command acts on, one by one: each service, each replica of a replicated one (`NAME/R`)."""
    return [inv.key for inv in selected_services(inventory)]


@click.command()
@_inventory_option
@click.option("--keep-enabled", is_flag=True, help="stop the engine but leave the units enabled (back at next boot)")
@click.option("--dry-run", is_flag=True, help="print the exact commands down would run; change nothing")
@_trust_option
def down(inventory, keep_enabled, dry_run, trust_new_hosts):
    """Stop the service (watchdog, head, then workers); units are disabled unless --keep-enabled."""
    with load_context(_inv(inventory), Options(dry_run=dry_run, trust_new_hosts=trust_new_hosts, log=_log),
                      chosen_service()) as cx:
        out = D.down(cx, keep_enabled)
    _print_outcomes(out)


def _health(inventory, trust_new_hosts, probe_timeout=60.0) -> dict[str | None, object]:
    """The health report of --service's service, else of every service of the inventory (key None: the only
    one of an inventory without `services:`)."""
    from sparkdeploy.ops import health as H
    from sparkdeploy.plan.router import plan_router

    reports = {}
    views = selected_services(inventory)
    for name in [v.key for v in views]:
        with load_context(_inv(inventory), Options(trust_new_hosts=trust_new_hosts, probe_timeout=probe_timeout),
                          name) as cx:
            reports[name] = D.health(cx)
    router = plan_router(views) if chosen_service() is None else None
    if router is not None:
        reports["router"] = H.check_router(router, views[0].auth.api_key(), probe_timeout=probe_timeout)
    return reports


@click.command()
@_inventory_option
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON on stdout")
@click.option("--probe-timeout", type=float, default=60, show_default=True, help="seconds for the generation probe")
@_trust_option
def health(inventory, as_json, probe_timeout, trust_new_hosts):
    """Every check with its verdict and reason, per node and overall; exit 0 healthy, 1 unhealthy. With
    `services:` and no --service, every service (healthy only if each is)."""
    reports = _health(inventory, trust_new_hosts, probe_timeout)
    healthy = all(rep.healthy for rep in reports.values())
    if as_json:
        click.echo(next(iter(reports.values())).to_json() if len(reports) == 1 else json.dumps(
            {"healthy": healthy, "services": {n: json.loads(rep.to_json()) for n, rep in reports.items()}}, indent=2))
    else:
        for name, rep in reports.items():
            if len(reports) > 1:
                err.print(f"[bold]{'' if name == 'router' else 'service '}{name}[/bold]")
            for c in rep.checks:
                mark = ("[yellow]warn[/yellow]" if c.status is Status.WARN else "[green]ok  [/green]") if c.ok \
                    else "[red bold]FAIL[/red bold]"
                err.print(f"  {mark} {c.node or 'service':<10} {c.name:<17} {c.reason}")
            err.print("[green]healthy[/green]" if rep.healthy else "[red bold]UNHEALTHY[/red bold]: "
                      + "; ".join(f"{c.node or 'service'} {c.name}" for c in rep.failed()))
    raise click.exceptions.Exit(0 if healthy else 1)


@click.command()
@_inventory_option
@click.option("--json", "as_json", is_flag=True)
@_trust_option
def status(inventory, as_json, trust_new_hosts):
    """The short form of health: one line per node and one overall (with several services, per service)."""
    reports = _health(inventory, trust_new_hosts, 30.0)
    healthy = all(rep.healthy for rep in reports.values())
    nodes: dict[str, list] = {}
    for name, rep in reports.items():
        for c in rep.checks:
            nodes.setdefault(c.node or ("service" if len(reports) == 1 else f"service {name}"), []).append(c)
    if as_json:
        click.echo(json.dumps({"healthy": healthy, "nodes": {n: all(c.ok for c in cs) for n, cs in nodes.items()}}))
    else:
        for n, cs in nodes.items():
            bad = [f"{c.name} ({c.reason})" if c.name == "release" else c.name for c in cs if not c.ok]
            click.echo(f"{n:<10} {'ok' if not bad else 'FAIL: ' + ', '.join(bad)}")
        click.echo("healthy" if healthy else "unhealthy")
    raise click.exceptions.Exit(0 if healthy else 1)


class _RollbackProgress:
    """Prints each replica's rollback as its turn ends."""

    def __init__(self, several: bool, dry_run: bool, allow_slower: bool):
        self.several, self.dry_run, self.allow_slower = several, dry_run, allow_slower

    def begin(self, key: str | None) -> None:
        if self.several:
            err.print(f"[bold]service {key}[/bold]")

    def end(self, key: str | None, run: D.Served | None) -> None:
        res = run.result
        if self.dry_run:
            _print_outcomes(res.outcomes)
        err.print(("[green]" if D.rolled_back(run, self.dry_run) else "[red bold]") + res.message)
        print_speed(err, run.speed, self.allow_slower)


@click.command()
@_inventory_option
@click.argument("number", type=int, required=False)
@click.option("--ready-timeout", type=float, default=900, show_default=True)
@click.option("--dry-run", is_flag=True, help="read the nodes, print the exact commands of the switch and restart; "
              "change nothing")
@_trust_option
@sentinel_option
def rollback(inventory, number, ready_timeout, dry_run, trust_new_hosts, sentinel, allow_slower):
    """Switch every node back to release NUMBER (default: the last healthy one before the current) and restart.

    The sentinel compares the release with its own earlier speed record (how fast it was when it served).
    Exit 0 served (or a dry run found the release to go back to), 1 failed, 3 served but slower than that
    record beyond noise. A service with replicas rolls back one replica at a time, each out of the router's
    rotation while it restarts, each to its own last healthy release (NUMBER needs --service NAME/R)."""
    opts = Options(dry_run=dry_run, trust_new_hosts=trust_new_hosts, ready_timeout=ready_timeout, log=_log)
    names = _services(inventory) if chosen_service() else [None]
    if number is not None and len(names) > 1:
        raise click.UsageError(f"{chosen_service()} has replicas ({', '.join(map(str, names))}), each with its own "
                               "release numbers: give NUMBER with --service NAME/R")
    turns = D.rollback_turns(_inv(inventory), opts, names, number, _measure(sentinel),
                             _RollbackProgress(len(names) > 1, dry_run, allow_slower))
    ok, speeds = turns.ok, [run.speed for run in turns.runs.values()]
    raise click.exceptions.Exit(deploy_exit_code(ok, speeds, allow_slower))


@click.command()
@_inventory_option
@click.argument("node", required=False)
@click.option("-f", "--follow", is_flag=True, help="keep printing new lines")
@click.option("-n", "--lines", type=int, default=100, show_default=True)
@click.option("--journal", is_flag=True, help="the unit's journal instead of the container's log")
@_trust_option
def logs(inventory, node, follow, lines, journal, trust_new_hosts):
    """The engine's log on NODE (default: the head): docker logs, or the unit's journal with --journal."""
    from sparkdeploy.remote.ssh import LocalConn

    with load_context(_inv(inventory), Options(trust_new_hosts=trust_new_hosts), chosen_service()) as cx:
        name = node or cx.inv.head.name
        try:
            cx.inv.node(name)
        except KeyError:
            raise click.BadParameter(f"no node {name!r} in the inventory", param_hint="NODE") from None
        cx.connect([], [name])
        c = cx.conn(name)
        argv = (["journalctl", "-u", cx.lay.unit, "-n", str(lines), "--no-pager"] + (["-f"] if follow else [])
                if journal else
                ["docker", "logs", "--tail", str(lines)] + (["-f"] if follow else []) + [cx.lay.container])
        if isinstance(c, LocalConn):
            subprocess.run(argv)
            return
        p = c.popen(["sh", "-c", 'exec "$@" 2>&1', "logs", *argv])  # vLLM logs to stderr: merge, stream live
        p.close_stdin()
        try:
            while True:
                chunk = p.read()
                if not chunk:
                    break
                sys.stdout.buffer.write(chunk)
                sys.stdout.flush()
        except KeyboardInterrupt:
            p.kill()
        rc, stderr = p.wait(30)
        sys.stdout.write(stderr)  # docker logs writes the container's stderr there


COMMANDS = [up, down, status, health, logs, rollback]
