"""`sparkdeploy bench`: probe, harness, turn2, compare, record + sentinel, report (see sparkdeploy.bench)."""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from sparkdeploy.bench import client, context, prompts, results, sentinel
from sparkdeploy.bench.prompts import SENTINEL_CATEGORIES
from sparkdeploy.cli.options import chosen_service, inventory_option
from sparkdeploy.errors import BenchError, InputError
from sparkdeploy.model import credentials
from sparkdeploy.node import layout

_err = Console(stderr=True, highlight=False)


def _out() -> Console:
    """stdout console: wide when piped, so tables stay one row per metric in logs and files."""
    return Console(width=None if sys.stdout.isatty() else 160, highlight=False)


def _ints(value: str, option: str) -> list[int]:
    try:
        out = [int(v) for v in value.replace(" ", "").split(",") if v]
    except ValueError as err:
        raise InputError(f"{option} {value}: expected comma-separated integers") from err
    if not out or any(v <= 0 for v in out):
        raise InputError(f"{option} {value}: expected positive integers")
    return out


def _service(url: str | None, inventory: str | None, model: str | None,
             api_key_file: str | None = None) -> tuple[client.Service, dict]:
    key = credentials.read_secret(Path(api_key_file).expanduser(), "--api-key-file") if api_key_file else None
    if url:
        svc = client.discover(url, model=model, api_key=key or os.environ.get("VLLM_API_KEY") or None)
        return svc, context.from_url(svc.url)
    path = inventory or "inventory.yaml"
    if not Path(path).exists():
        raise InputError(f"{path}: no inventory; pass --url http://host:port or --inventory FILE")
    inv = context.load_inventory(path, chosen_service())
    auth = getattr(inv, "auth", None)  # a bench context may be any inventory-shaped object
    key = key or (auth.api_key() if auth else None)
    errors = []
    for candidate in context.api_urls(inv):
        try:
            svc = client.discover(candidate, model=model, api_key=key)
            break
        except BenchError as err:
            errors.append(str(err))
    else:
        raise BenchError(f"{path}: no API answered: " + "; ".join(errors))
    return svc, context.from_inventory(inv, path)


def _service_options(fn):
    fn = click.option("--model", help="Served model name (default: the first one /v1/models lists).")(fn)
    fn = inventory_option("inventory", help="Inventory: the head node's API address; its release facts are recorded.")(fn)
    fn = click.option("--url", help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000.")(fn)
    fn = click.option("--api-key-file", type=click.Path(dir_okay=False),
                      help="File (mode 0600) holding the API key [default: the inventory's auth.api_key_file; "
                           "with --url, $VLLM_API_KEY].")(fn)
    return fn


def _run_options(fn):
    fn = click.option("--json", "as_json", is_flag=True, help="Print the results JSON on stdout.")(fn)
    fn = click.option("--out", type=click.Path(dir_okay=False),
                      help="Results file (default bench-results/<kind>-<time>.json).")(fn)
    fn = click.option("--warmup", default=1, show_default=True, type=click.IntRange(0), help="Warm-up runs.")(fn)
    fn = click.option("--runs", default=3, show_default=True, type=click.IntRange(1),
                      help="Kept runs per group; the median is reported.")(fn)
    return fn


def _progress(msg: str) -> None:
    _err.print(f"[dim]bench[/dim] {msg}", soft_wrap=True)


def _finish(result: dict, out: str | None, as_json: bool) -> None:
    path = Path(out) if out else Path("bench-results") / (
        f"{result['kind']}-{dt.datetime.now().strftime('%Y%m%d-%H%M%S')}.json")
    results.save(result, path)
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        table = Table(title=f"{result['kind']}: {result['service']['model']} at {result['service']['url']}")
        for col in ("group", "metric", "median", "min", "max", "n", "unit"):
            table.add_column(col)
        for m in result["metrics"].values():
            f = (lambda v: "–" if v is None else f"{v:.4g}")
            table.add_row(m["group"], m["name"], f(m["median"]), f(m["min"]), f(m["max"]), str(m["n"]), m["unit"])
        _out().print(table)
        for d in result["discarded"]:
            click.echo(f"discarded {d['group']} #{d['index']}: {d['reason']}")
    _err.print(f"results written to {path}")


@click.group("bench")
def bench() -> None:
    """Measure the running service: medians of repeats, counter-checked runs, noise-aware A/B."""


@bench.command("probe")
@_service_options
@click.option("--category", "categories", multiple=True,
              help="Category (or prefix, e.g. prose_zh) from the prompt set; repeatable. Default: code.")
@click.option("--prompts", "prompt_file", type=click.Path(dir_okay=False), help="Prompt set YAML.")
@click.option("--prompt-index", default=0, show_default=True, type=click.IntRange(0))
@click.option("--tokens", default=256, show_default=True, type=click.IntRange(2), help="Output tokens per request.")
@_run_options
def probe_cmd(url, api_key_file, inventory, model, categories, prompt_file, prompt_index, tokens, runs, warmup, out, as_json):
    """One stream at temperature 0: decode tok/s, TTFT, acceptance per position, and joules per generated token
    where this machine reads the service's GPU power (nvidia-smi; else it says why not)."""
    from sparkdeploy.bench.probe import probe

    cats = prompts.select(prompts.load(prompt_file), list(categories) or ["code"])
    svc, ctx = _service(url, inventory, model, api_key_file)
    result = probe(svc, cats, tokens=tokens, runs=runs, warmup=warmup, prompt_index=prompt_index, context=ctx,
                   progress=_progress)
    _finish(result, out, as_json)
    _err.print(energy_line(result), soft_wrap=True)


def energy_line(result: dict) -> str:
    """What the probe found about energy: joules per generated token per category, or why it was not measured."""
    if not result["power"]["measured"]:
        return f"energy: not measured: {result['power']['why_not']}"
    found = [f"{m['group']} {m['median']:.3g} J/token at {result['metrics'][m['group'] + '/gpu_power_w']['median']:.1f} W"
             for m in result["metrics"].values() if m["name"] == "joules_per_token" and m["median"] is not None]
    nodes = len(result["context"].get("nodes") or [])
    share = f" (this node's GPU only: the service spans {nodes} nodes)" if nodes > 1 else ""
    return "energy: " + ("; ".join(found) if found else "no run measured it") + share


@bench.command("harness")
@click.argument("prompt_file", required=False, type=click.Path(dir_okay=False))
@_service_options
@click.option("--category", "categories", multiple=True, help="Only these categories (or prefixes).")
@click.option("--concurrency", default="1,2,4,8", show_default=True, help="Concurrency sweep, comma-separated.")
@click.option("--tokens", default=128, show_default=True, type=click.IntRange(2))
@_run_options
def harness_cmd(prompt_file, url, api_key_file, inventory, model, categories, concurrency, tokens, runs, warmup, out, as_json):
    """Every category of PROMPT_FILE (default: the shipped set), then a concurrency sweep."""
    from sparkdeploy.bench.harness import harness

    cats = prompts.select(prompts.load(prompt_file), list(categories))
    levels = _ints(concurrency, "--concurrency")
    svc, ctx = _service(url, inventory, model, api_key_file)
    result = harness(svc, cats, tokens=tokens, runs=runs, warmup=warmup, concurrency=levels, context=ctx,
                     prompt_set=str(prompt_file or prompts.DEFAULT.name), progress=_progress)
    _finish(result, out, as_json)


@bench.command("turn2")
@_service_options
@click.option("--prefix-tokens", default="9500,30000", show_default=True,
              help="Prefix sizes in tokens, comma-separated.")
@click.option("--tokens", default=32, show_default=True, type=click.IntRange(2), help="Output tokens per turn.")
@_run_options
def turn2_cmd(url, api_key_file, inventory, model, prefix_tokens, tokens, runs, warmup, out, as_json):
    """Turn one, then turn two on the same prefix: both TTFTs and turn two's prefix-cache hits."""
    from sparkdeploy.bench.turn2 import turn2

    sizes = _ints(prefix_tokens, "--prefix-tokens")
    svc, ctx = _service(url, inventory, model, api_key_file)
    result = turn2(svc, sizes, tokens=tokens, runs=runs, warmup=warmup, context=ctx, progress=_progress)
    _finish(result, out, as_json)


@bench.command("compare")
@click.argument("a", type=click.Path(exists=True, dir_okay=False))
@click.argument("b", type=click.Path(exists=True, dir_okay=False))
@click.option("--baseline", "baselines", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="More sessions of A's configuration: their repeats join the noise estimate and the spread "
                   "of the sessions' medians must be exceeded too. Repeatable.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@click.option("--fail-on-worse", is_flag=True, help="Exit 1 when any metric is worse beyond noise (a CI gate).")
def compare_cmd(a, b, baselines, as_json, fail_on_worse):
    """B against A: per metric "better", "worse" or "within noise" (noise measured, never a fixed %)."""
    from sparkdeploy.bench.compare import compare

    ra, rb = results.load(a), results.load(b)
    extra = [results.load(p) for p in baselines]
    cmp = compare(ra, rb, extra_baselines=extra)
    worse = [r["metric"] for r in cmp["rows"] if r["verdict"] == "worse"]
    if as_json:
        click.echo(json.dumps(cmp, indent=2))
    else:
        _print_comparison(cmp, a, b)
    if fail_on_worse and worse:
        raise BenchError(f"worse beyond noise: {', '.join(worse)}")


def _print_comparison(cmp: dict, a: str, b: str) -> None:
    for note in cmp["comparability"]:
        click.secho(f"not like for like: {note}", fg="yellow", err=True)
    table = Table(title=f"{Path(b).name} against {Path(a).name}")
    for col in ("metric", "A", "B", "B-A", "n A/B", "noise sd", "session sd", "threshold", "verdict"):
        table.add_column(col)
    f = (lambda v: "–" if v is None else f"{v:.4g}")
    colour = {"better": "green", "worse": "red"}
    for r in cmp["rows"]:
        word = r["verdict"]
        table.add_row(r["metric"], f(r["a"]), f(r["b"]), f(r["difference"]), f"{r['n_a']}/{r['n_b']}",
                      f(r["noise"]), f(r.get("session_noise")), f(r["threshold"]),
                      f"[{colour[word]}]{word}[/]" if word in colour else word)
    _out().print(table)


@bench.command("record")
@_service_options
@click.option("--prompts", "prompt_file", type=click.Path(dir_okay=False), help="Prompt set YAML.")
@click.option("--category", "categories", multiple=True,
              help=f"Category (or prefix); repeatable. Default: {', '.join(SENTINEL_CATEGORIES)}.")
@click.option("--tokens", default=64, show_default=True, type=click.IntRange(2), help="Output tokens per request.")
@click.option("--runs", default=3, show_default=True, type=click.IntRange(2),
              help="Kept runs per category (at least 2: the noise is measured from them).")
@click.option("--warmup", default=1, show_default=True, type=click.IntRange(0), help="Warm-up runs.")
@click.option("--release-number", type=click.IntRange(1), help="The release measured.")
@click.option("--list-sha", help="sha256 of the release's draft list.")
@click.option("--image", help="The release's image tag.")
@click.option("--flag", "flags", multiple=True, help="One of the release's engine flags; repeatable, in order.")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Record file to write.")
def record_cmd(url, api_key_file, inventory, model, prompt_file, categories, tokens, runs, warmup, release_number,
               list_sha, image, flags, out):
    """A speed record of the live service for `bench sentinel`: per category, the repeats of acceptance length,
    acceptance per position and decode tok/s."""
    svc, _ = _service(url, inventory, model, api_key_file)
    facts = {"number": release_number, "list_sha": list_sha, "image": image, "flags": list(flags) or None}
    rec = sentinel.measure(svc, categories=list(categories) or SENTINEL_CATEGORIES, prompt_file=prompt_file,
                           tokens=tokens, runs=runs, warmup=warmup,
                           release={k: v for k, v in facts.items() if v is not None}, progress=_progress)
    _err.print(f"record written to {sentinel.save(rec, out)}")


@bench.command("sentinel")
@click.option("--baseline", type=click.Path(dir_okay=False),
              help="Speed record of the previous healthy release [default: from the cluster, see below].")
@click.option("--candidate", type=click.Path(dir_okay=False), help="Speed record of the new release.")
@click.option("--baseline-session", "sessions", multiple=True, type=click.Path(dir_okay=False),
              help="Another record of the baseline release: its repeats join the noise and the spread between "
                   "sessions must be exceeded too. Repeatable.")
@inventory_option("inventory", help="Without --baseline/--candidate: the records `up` kept on this inventory's head, "
                                    "the current release's against the newest older healthy release's.")
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON.")
def sentinel_cmd(baseline, candidate, sessions, inventory, as_json):
    """Exit 1 when a category's acceptance or decode speed fell beyond the measured noise (0: it did not)."""
    if bool(baseline) != bool(candidate):
        raise InputError("give both --baseline and --candidate, or neither (the cluster's records)")
    if baseline:
        base, cand = sentinel.load(baseline), sentinel.load(candidate)
        what = f"{candidate} against {baseline}"
    else:
        base, cand, what = _cluster_records(inventory or "inventory.yaml")
    extra = [sentinel.load(p) for p in sessions]
    try:
        verdict = sentinel.compare(base, cand, extra_baselines=extra)
    except InputError as err:
        raise InputError(f"{what}: {err}") from err
    if as_json:
        click.echo(json.dumps(verdict, indent=2))
    else:
        _print_sentinel(verdict)
    if verdict["regression"]:
        cats = sorted({r["category"] for r in verdict["regressions"]})
        raise BenchError(f"speed regression beyond noise in {', '.join(cats)}")


def _cluster_records(inventory: str) -> tuple[dict, dict, str]:
    """The current release's record and the newest older healthy release's, read from the head."""
    from sparkdeploy.ops import releases
    from sparkdeploy.steps.deploy import Options, load_context

    with load_context(inventory, Options(), chosen_service()) as cl:
        cl.connect([], [cl.head])
        nrs = cl.scan([cl.head])
        cur = nrs[cl.head].current
        before = releases.last_healthy(nrs, before=cur) if cur is not None else None
        cand = releases.read_sentinel(cl.conn(cl.head), cl.lay, cur) if cur is not None else None
        base = releases.read_sentinel(cl.conn(cl.head), cl.lay, before) if before is not None else None
    if cand is None:
        raise InputError(f"{inventory}: release {cur} on {cl.head} has no speed record: `sparkdeploy up` keeps one "
                         "(unless --no-sentinel), or make one with `sparkdeploy bench record`")
    if base is None:
        raise InputError(f"{inventory}: no older healthy release with a speed record on {cl.head} to compare "
                         f"release {cur} with")
    for rec, num in ((base, before), (cand, cur)):
        sentinel.validate(rec, f"{cl.head}: release {num}'s {layout.SENTINEL_RECORD}")
    return base, cand, f"release {cur} against release {before}"


def _print_sentinel(verdict: dict) -> None:
    for note in verdict["notes"]:
        click.secho(f"not like for like: {note}", fg="yellow", err=True)
    for cat in verdict["unmeasured_categories"]:
        click.secho(f"{cat}: the candidate has no figures (every run discarded?)", fg="yellow", err=True)
    for metric in verdict["unknown_noise"]:
        click.secho(f"{metric}: fewer than two repeats, noise unknown: not judged", fg="yellow", err=True)
    table = Table(title="sentinel: candidate against baseline")
    for col in ("category", "figure", "baseline", "candidate", "difference", "noise bound", "verdict"):
        table.add_column(col)
    f = (lambda v: "–" if v is None else f"{v:.4g}")
    colour = {"better": "green", "worse": "red"}
    for r in verdict["rows"]:
        word = r["verdict"]
        bound = "exact" if r["exact"] else f(r["threshold"])  # every repeat equal: any change counts
        table.add_row(r["category"], r["figure"], f(r["a"]), f(r["b"]), f(r["difference"]), bound,
                      f"[{colour[word]}]{word}[/]" if word in colour else word)
    _out().print(table)
    for r in verdict["regressions"]:
        click.echo(f"REGRESSION {sentinel.describe(r)}")
    for cause in verdict["likely_causes"]:
        click.echo(f"likely cause: {cause}")
    if not verdict["regression"]:
        click.echo("no figure fell beyond noise")


@bench.command("report")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Directory for README.md + PNGs.")
@click.option("--title", default="sparkdeploy bench report", show_default=True)
@click.option("--note", help="A line under the title, e.g. what the numbers were measured on.")
@click.option("--compare", "with_comparison", is_flag=True, help="Add the verdicts of the second file against the first.")
@click.option("--pair", "pairs", multiple=True, metavar="A.json,B.json[,A2.json...]",
              help="Add the verdicts of B against A, with optional extra baseline sessions of A "
                   "(files need not be plotted). Repeatable.")
def report_cmd(files, out, title, note, with_comparison, pairs):
    """Markdown + PNG plots (tok/s per category, acceptance per position, TTFT, turn two, concurrency)."""
    from sparkdeploy.bench import report

    split = []
    for p in pairs:
        parts = p.split(",")
        if len(parts) < 2 or not all(Path(x).is_file() for x in parts):
            raise InputError(f"--pair {p}: expected A.json,B.json[,A2.json...] naming existing results files")
        split.append(tuple(parts))
    md = report.write(list(files), out, title=title, note=note, with_comparison=with_comparison, pairs=split)
    click.echo(str(md))


COMMANDS = [bench]
