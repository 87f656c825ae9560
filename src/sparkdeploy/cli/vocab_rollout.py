"""`sparkdeploy vocab rollout | history | rollback`: change the live draft list (attached to the `vocab` group).

Exit codes: 0 live (or nothing to change, or a clean dry run); 2 the list was refused (nothing contacted);
1 the rollout failed and was rolled back, or could not run.
"""

from __future__ import annotations

import json
import sys
import time

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
from sparkdeploy.cli.vocab import vocab
from sparkdeploy.model import inventory as I
from sparkdeploy.steps import deploy as D
from sparkdeploy.steps.context import Options
from sparkdeploy.verdict import Status

err = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 160)


def _log(msg: str) -> None:
    err.print(f"[dim]·[/dim] {msg}")


def _common(f):
    f = inventory_option("inventory")(f)
    f = click.option("--trust-new-hosts", is_flag=True, help="accept and record SSH host keys not seen before")(f)
    f = click.option("--json", "as_json", is_flag=True, help="print the result as JSON on stdout")(f)
    return f


def _gate_options(f):
    f = click.option("--tokenizer", "-t", "spec", default=None,
                     help="the served model's tokenizer (default: deploy/tokenizers.yaml for the profile's model)")(f)
    f = click.option("--ready-timeout", type=float, default=900, show_default=True,
                     help="seconds the new release has to answer a real completion")(f)
    f = click.option("--max-tokens", type=int, default=32, show_default=True, help="tokens per golden prompt")(f)
    f = click.option("--category", "categories", multiple=True,
                     help="golden prompt categories of the bench prompt set (default: all)")(f)
    f = click.option("--live/--restart", "live", default=True, show_default=True,
                     help="--live: swap the list inside the running engine where its release and the list's size "
                          "allow (else a restart rollout, saying why); --restart: restart the engine on a new "
                          "release")(f)
    return f


def _path(inventory) -> str:
    return inventory or str(paths.default_inventory())


def _load(inventory):
    return I.load(_path(inventory), chosen_service())


def _views(inventory) -> tuple:
    """What the command acts on, one at a time: --service's service, each of its replicas; else the only one."""
    return selected_services(inventory) if chosen_service() else (_load(inventory),)


def _acc(fig) -> str:
    if not fig:
        return "-"
    return f"{fig['acceptance_length']:.3f}"


def _report(res) -> None:
    d = res.diff or {}
    err.print(f"  list      {res.to_version} ({res.size} ids), live before: {res.from_version or '?'}")
    if res.path:
        err.print(f"  path      {res.path}: {res.path_reason}")
    if d.get("added") is not None:
        err.print(f"  diff      +{d['added']} ids, -{d['removed']} ids ({d['old_size']} -> {d['new_size']})"
                  + (f"; added e.g. {d['added_examples']}" if d.get("added_examples") else "")
                  + (f"; removed e.g. {d['removed_examples']}" if d.get("removed_examples") else ""))
    for row in res.coverage:
        old = "?" if row["miss_old"] is None else f"{row['miss_old']:.2%}"
        err.print(f"  coverage  {row['text']}: off-list {old} -> {row['miss_new']:.2%} of {row['tokens']:,} tokens")
    for a in res.actions if res.status == Status.WOULD_CHANGE else []:
        err.print(f"  [yellow]would[/yellow]     {a}")
    for e in res.effects:  # a dry run: the exact writes and commands, as the rollout will make them
        err.print(f"{'':>12}[dim]{escape(e)}[/dim]")
        for line in getattr(e, "diff", "").splitlines():
            err.print(f"{'':>14}{escape(line)}")
    cats = sorted(set(res.acceptance_before) | set(res.acceptance_after))
    if cats:
        err.print("  acceptance per step (mean accepted length), before -> after:")
        for c in cats:
            err.print(f"    {c:<16} {_acc(res.acceptance_before.get(c))} -> {_acc(res.acceptance_after.get(c))}")
    if res.golden_identical is not None:
        same = "byte-identical" if res.golden_identical else "DIFFER"
        err.print(f"  golden    {res.golden_prompts} prompts, {same}")
    for n in res.notes:
        err.print(f"  [dim]note      {n}[/dim]")
    for n, v in res.nodes.items():
        err.print(f"  node      {n}: release {v.get('release')}, list {v.get('version')} "
                  + ("[green]ok[/green]" if not v.get("problem") else f"[red]{v['problem']}[/red]"))
    if res.timings:
        err.print("  seconds   " + ", ".join(f"{k} {v}" for k, v in res.timings.items()) + f"; total {res.seconds}")
    style = "green" if res.ok else "red bold"
    err.print(f"[{style}]{res.message}[/{style}]")


@vocab.command("rollout")
@click.argument("list_path", metavar="LIST")
@click.option("--dry-run", is_flag=True, help="validate, read the nodes and show the change; change nothing")
@click.option("--samples", multiple=True, metavar="TEXT", help="text file(s): coverage of the old and new list")
@click.option("--allow-no-manifest", is_flag=True, help="accept a list without a manifest (tokenizer hash unchecked)")
@click.option("--allow-lower-acceptance", is_flag=True,
              help="keep a live-swapped list whose acceptance on the golden prompts fell beyond noise (a list "
                   "tuned for other traffic); the fall is still reported")
@_gate_options
@_common
@sentinel_option
def rollout_cmd(list_path, dry_run, samples, allow_no_manifest, allow_lower_acceptance, spec, ready_timeout,
                max_tokens, categories, live, inventory, trust_new_hosts, as_json, sentinel, allow_slower):
    """Put LIST live on every node: validate, golden outputs, new release, then a live swap in the running
    engine (where its release and the list's size allow) or a restart workers-first, verify; any failure puts
    the previous list back (live, or by a rollback to the previous release)."""
    from sparkdeploy.steps import vocab_rollout as R

    views = _views(inventory)
    opts = R.RolloutOptions(max_tokens=max_tokens, categories=list(categories) or None, samples=list(samples),
                            restart=not live, allow_lower_acceptance=allow_lower_acceptance)
    run = Options(dry_run=dry_run, trust_new_hosts=trust_new_hosts, ready_timeout=ready_timeout, log=_log)
    tok, cand = R.validate_locally(views[0], list_path, tokenizer_spec=spec, allow_no_manifest=allow_no_manifest)
    err.print(f"[green]valid[/green] {list_path}: {cand.size} ids for {tok.name} ({tok.content_hash[:19]}), "
              f"version {cand.version}")
    _roll(_path(inventory), views, lambda c: cand, opts, tok, run, "vocab rollout", sentinel, allow_slower, as_json)


def _roll(path: str, views, candidate, opts, tok, run: Options, what: str, sentinel: bool, allow_slower: bool,
          as_json: bool) -> None:
    """Roll out `candidate(context)` on each view in turn (rollout.service: one that fails, or a signal, ends the
    turn); report each; exit 0, 1, or 3 (live but slower beyond noise, unless --allow-slower)."""
    from sparkdeploy.steps.vocab_rollout.service import rollout_service

    measure = (lambda cx, number: speed_after_gate(cx, number, _log)) if sentinel else None
    turns = D.until_one_fails([v.key for v in views],
                              lambda key: rollout_service(path, run, key, candidate, opts, tok, what, measure),
                              lambda served: served.result.ok, _RollProgress(len(views) > 1, allow_slower))
    results = {k: served.result for k, served in turns.runs.items()}
    if as_json:
        payload = next(iter(results.values())).to_dict() if len(views) == 1 else \
            {"ok": turns.ok, "services": {k: r.to_dict() for k, r in results.items()}}
        click.echo(json.dumps(payload, indent=2, default=str))
    raise click.exceptions.Exit(deploy_exit_code(turns.ok, [s.speed for s in turns.runs.values()], allow_slower))


class _RollProgress:
    """Prints each service's rollout as its turn ends."""

    def __init__(self, several: bool, allow_slower: bool):
        self.several, self.allow_slower = several, allow_slower

    def begin(self, key: str | None) -> None:
        if self.several:
            err.print(f"[bold]service {key}[/bold]")

    def end(self, key: str | None, served) -> None:
        _report(served.result)
        print_speed(err, served.speed, self.allow_slower)


@vocab.command("rollback")
@click.argument("version", required=False)
@_gate_options
@_common
@sentinel_option
def rollback_cmd(version, spec, ready_timeout, max_tokens, categories, live, inventory, trust_new_hosts, as_json,
                 sentinel, allow_slower):
    """Put a stored list back (VERSION = a sha256 prefix from `vocab history`; default: the one live before)."""
    from sparkdeploy.model import served_tokenizer
    from sparkdeploy.steps import vocab_rollout as R

    views = _views(inventory)
    opts = R.RolloutOptions(max_tokens=max_tokens, categories=list(categories) or None, require_golden=False,
                            restart=not live, action="rollback")
    run = Options(trust_new_hosts=trust_new_hosts, ready_timeout=ready_timeout, log=_log)
    tok = served_tokenizer.resolve(views[0], spec)
    _roll(_path(inventory), views, lambda c: R.stored_candidate(c, version, tok), opts, tok, run, "vocab rollback",
          sentinel, allow_slower, as_json)


@vocab.command("history")
@_common
def history_cmd(inventory, trust_new_hosts, as_json):
    """Every switch of the live list (rollouts, rollbacks, automatic rollbacks) and the stored versions."""
    from sparkdeploy.steps import vocab_rollout as R

    h = R.history(_load(inventory), trust_new_hosts=trust_new_hosts)
    if as_json:
        click.echo(json.dumps(h, indent=2, default=str))
        return
    for e in h["history"]:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.get("at", 0)))
        line = (f"{when}  {e.get('action', '?'):<13} {str(e.get('version'))[:12]:<12} release {e.get('release')}"
                f"  from {str(e.get('from'))[:12]}")
        if e.get("reason"):
            line += f"  reason: {e['reason']}"
        click.echo(line)
    live = {n: v.get("version") for n, v in h["nodes"].items()}
    for s in h["stored"]:
        mark = " live" if s["version"] in live.values() else ""
        click.echo(f"stored {s['version']}  {s.get('size', '?')} ids  {s.get('source') or ''}{mark}")
    for n, v in h["nodes"].items():
        click.echo(f"node {n}: release {v.get('release')}, list {v.get('version')}"
                   + (f"  PROBLEM: {v['problem']}" if v.get("problem") else ""))


COMMANDS: list = []  # attached to the `vocab` group above
