"""The speed sentinel: a small speed record per release and a compare that says when a release got slower.

A record holds, per prompt category, the repeats of three figures: mean acceptance length, acceptance per
draft position and decode tok/s, measured by `bench probe` (medians after a warm-up, runs kept only when the
counters prove nothing else ran). Keeping the repeats, not only medians, is what lets the compare measure
the noise instead of assuming it: each figure of the candidate is judged against the baseline's with
`bench.compare` (difference of medians against the repeat noise; never a fixed percentage). A drop beyond
that noise is a regression; the compare names the category, the figure and the size of the drop, and, given
what changed between the two releases (draft list, image, flags), the likely cause.

Record schema `sparkdeploy.sentinel/1`:

    {"schema", "created", "release": {"number", "list_sha", "image", "flags": [...]}  (each optional),
     "service": {"url", "model", "vllm_version", "max_model_len"},
     "settings": {"tokens", "runs", "warmup", "prompt_index", "ignore_eos"},
     "decode_source": "server" | "client",     # the engine's decode timing, or the client's if it has none
     "categories": {"<name>": {"acceptance_length": [...], "accept_pos": [[pos 0 repeats], ...],
                              "decode_tok_s": [...], "discarded": n}}}
"""

from __future__ import annotations

import datetime as dt
import json
import math
from pathlib import Path

from sparkdeploy.bench import client, prompts, results, stats
from sparkdeploy.bench import compare as bench_compare
from sparkdeploy.bench.client import Service
from sparkdeploy.bench.probe import Progress, probe
from sparkdeploy.errors import InputError
from sparkdeploy.ops import vocab_live

SCHEMA = "sparkdeploy.sentinel/1"
# what a release record may say about itself; a difference in one of these is a candidate cause
RELEASE_KEYS = ("list_sha", "image", "flags")
# settings that must agree for two records to measure the same thing
SAME_SETTINGS = ("tokens", "prompt_index", "ignore_eos")


# --------------------------------------------------------------------------------------------- records
def from_probe(result: dict, release: dict | None = None) -> dict:
    """Reduce a `bench probe` result to a record: per category, the kept repeats of the three figures."""
    kept = [r for r in result["runs"] if r["kept"] and not r["warmup"]]
    server = bool(kept) and all("server_decode_tok_s" in r["values"] for r in kept)
    speed_key = "server_decode_tok_s" if server else "decode_tok_s"
    cats: dict[str, dict] = {}
    for name in result["settings"]["categories"]:
        runs = [r["values"] for r in kept if r["group"] == name]
        positions = sorted({int(k[len("accept_pos"):]) for v in runs for k in v if k.startswith("accept_pos")})
        cats[name] = {
            "acceptance_length": [v["acceptance_length"] for v in runs if "acceptance_length" in v],
            "accept_pos": [[v[f"accept_pos{p}"] for v in runs if f"accept_pos{p}" in v] for p in positions],
            "decode_tok_s": [v[speed_key] for v in runs if speed_key in v],
            "discarded": sum(1 for d in result["discarded"] if d["group"] == name and not d["warmup"]),
        }
    settings = result["settings"]
    return {
        "schema": SCHEMA,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "release": dict(release or {}),
        "service": result["service"],
        "settings": {k: settings.get(k) for k in ("tokens", "runs", "warmup", "prompt_index", "ignore_eos")},
        "decode_source": "server" if server else "client",
        "categories": cats,
    }


def measure(service: Service, *, categories: tuple[str, ...] | list[str] = prompts.SENTINEL_CATEGORIES,
            prompt_file: str | Path | None = None, tokens: int = 64, runs: int = 3, warmup: int = 1,
            release: dict | None = None, progress: Progress | None = None) -> dict:
    """A record of the live server: the probe per category (one stream, temperature 0), then reduced.

    Meant to run right after a release's health gate, so the defaults are short: a few seconds a category.
    """
    cats = prompts.select(prompts.load(prompt_file), list(categories))
    # no energy sampling: nvidia-smi every quarter second would add its own load to the speed judged here
    result = probe(service, cats, tokens=tokens, runs=runs, warmup=warmup, progress=progress, energy=False)
    return from_probe(result, release)


def save(record: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(path)
    return path


def load(path: str | Path) -> dict:
    """Read and check a record; errors name the file and the field."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise InputError(f"{path}: cannot read sentinel record: {err}") from err
    validate(data, str(path))
    return data


def validate(record: object, source: str) -> None:
    def bad(field: str, want: str) -> InputError:
        return InputError(f"{source}: {field}: expected {want}")

    if not isinstance(record, dict):
        raise bad("(top level)", "a JSON object")
    if record.get("schema") != SCHEMA:
        raise bad("schema", f"{SCHEMA!r}, got {record.get('schema')!r}")
    for key in ("release", "service", "settings"):
        if not isinstance(record.get(key, {}), dict):
            raise bad(key, "an object")
    cats = record.get("categories")
    if not isinstance(cats, dict) or not cats:
        raise bad("categories", "an object of category name -> figures")
    for name, figs in cats.items():
        where = f"categories.{name}"
        if not isinstance(figs, dict):
            raise bad(where, "an object")
        for key in ("acceptance_length", "decode_tok_s"):
            if not _numbers(figs.get(key, [])):
                raise bad(f"{where}.{key}", "a list of numbers (the repeats)")
        pos = figs.get("accept_pos", [])
        if not isinstance(pos, list) or not all(_numbers(p) for p in pos):
            raise bad(f"{where}.accept_pos", "a list (one per draft position) of lists of numbers")


def _numbers(values: object) -> bool:
    return isinstance(values, list) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values)


def as_results(record: dict) -> dict:
    """The record in `bench.results` shape (metrics `<category>/<figure>`), which `bench.compare` reads."""
    out: dict[str, dict] = {}
    for cat, figs in record["categories"].items():
        series = {"acceptance_length": figs.get("acceptance_length", []), "decode_tok_s": figs.get("decode_tok_s", [])}
        series.update({f"accept_pos{i}": v for i, v in enumerate(figs.get("accept_pos", []))})
        for name, values in series.items():
            if values:
                unit, hib = results.metric_meta(name)
                out[f"{cat}/{name}"] = {"group": cat, "name": name, "unit": unit, "higher_is_better": hib,
                                        "values": list(values), **stats.summarize(values).to_dict()}
    return {"kind": "sentinel", "created": record.get("created"), "service": record.get("service", {}),
            "context": {"release": record.get("release", {})},
            "settings": {k: record.get("settings", {}).get(k) for k in SAME_SETTINGS}, "metrics": out}


# --------------------------------------------------------------------------------------------- compare
def changes_between(baseline: dict, candidate: dict) -> dict:
    """What differs between two records' release facts: {key: {"baseline": a, "candidate": b}}."""
    a, b = baseline.get("release", {}), candidate.get("release", {})
    return {k: {"baseline": a.get(k), "candidate": b.get(k)} for k in RELEASE_KEYS if a.get(k) != b.get(k)}


def compare(baseline: dict, candidate: dict, *, changes: dict | None = None,
            extra_baselines: list[dict] = ()) -> dict:
    """The candidate's figures against the baseline's, per category.

    `changes` (default: the difference of the two records' release facts) is what changed between the
    releases; it only feeds the likely cause. `extra_baselines` are more records of the baseline release:
    their repeats join the noise and their spread between sessions must be exceeded too.
    Raises InputError when the two records did not measure the same thing (tokens, prompt, ignore_eos) or
    share no category.
    """
    ra, rb = as_results(baseline), as_results(candidate)
    differ = [f"settings.{k} {ra['settings'][k]!r} (baseline) vs {rb['settings'][k]!r} (candidate)"
              for k in SAME_SETTINGS if ra["settings"][k] != rb["settings"][k]]
    if differ:
        raise InputError("the records measured different things: " + "; ".join(differ))
    if not set(ra["metrics"]) & set(rb["metrics"]):
        raise InputError(f"the records share no category (baseline: {', '.join(baseline['categories'])}; "
                         f"candidate: {', '.join(candidate['categories'])})")
    cmp = bench_compare.compare(ra, rb, extra_baselines=[as_results(e) for e in extra_baselines])
    rows = [dict(r, category=r["metric"].split("/")[0], figure=r["metric"].split("/", 1)[1], exact=_exact(r))
            for r in cmp["rows"]]
    regressions = [r for r in rows if r["verdict"] == stats.WORSE]
    changes = changes_between(baseline, candidate) if changes is None else changes
    unmeasured = sorted({m.split("/")[0] for m in cmp["only_in_a"]} - {r["category"] for r in rows})
    return {
        "regression": bool(regressions),
        "regressions": regressions,
        "rows": rows,
        "unknown_noise": [r["metric"] for r in rows if r["verdict"] == stats.UNKNOWN],
        "unmeasured_categories": unmeasured,
        "notes": cmp["comparability"],
        "changes": changes,
        "likely_causes": likely_causes(regressions, changes),
        "baseline": {"created": baseline.get("created"), "release": baseline.get("release", {})},
        "candidate": {"created": candidate.get("created"), "release": candidate.get("release", {})},
    }


def describe(row: dict) -> str:
    """One regression as a sentence: category, figure, from -> to, by how much, and the noise bound."""
    rel = f", {row['relative']:+.1%}" if row.get("relative") is not None else ""
    bound = ("every repeat gave the same figure, so any change is real" if row["exact"] else
             f"beyond the noise bound {row['threshold']:.3g} {row['unit']}")
    return (f"{row['category']}: {row['figure']} fell {row['a']:.4g} -> {row['b']:.4g} "
            f"({row['difference']:+.4g}{rel}; {bound})")


def _exact(row: dict) -> bool:
    """The repeats agree to float rounding (acceptance at temperature 0 on one engine): no noise to beat."""
    scale = max(abs(row["a"] or 0), abs(row["b"] or 0), 1e-12)
    return row["noise"] is not None and row["noise"] <= 1e-9 * scale


def likely_causes(regressions: list[dict], changes: dict) -> list[str]:
    """Most likely first. Acceptance that falls points at what decides drafting (the list, the speculative
    flags, the engine); decode speed that falls while acceptance holds points at the engine and its flags."""
    if not regressions:
        return []
    acc_cats = sorted({r["category"] for r in regressions if r["figure"] != "decode_tok_s"})
    speed_cats = sorted({r["category"] for r in regressions if r["figure"] == "decode_tok_s"})
    causes: list[str] = []
    if not changes:
        return ["nothing recorded changed between the two releases (list, image, flags): the machine (load, "
                "clocks, memory pressure) or drift beyond the measured noise; measure both again"]
    lst, image, flags = changes.get("list_sha"), changes.get("image"), changes.get("flags")
    if acc_cats:
        if lst:
            causes.append(f"the draft list changed ({_short(lst['baseline'])} -> {_short(lst['candidate'])}): "
                          f"tokens of {', '.join(acc_cats)} may be off the new list (acceptance fell there)")
        if flags:
            causes.append(f"the flags changed ({_flag_diff(flags)}): speculative settings decide acceptance")
        if image:
            causes.append(f"the image changed ({image['baseline']} -> {image['candidate']}): a different vLLM "
                          "can draft or verify differently")
    if speed_cats and not set(speed_cats) <= set(acc_cats):
        if image:
            causes.append(f"the image changed ({image['baseline']} -> {image['candidate']}): kernels and engine "
                          f"version decide decode speed ({', '.join(speed_cats)} slower)")
        if flags:
            causes.append(f"the flags changed ({_flag_diff(flags)}): engine flags decide decode speed")
        if lst:
            causes.append("the draft list changed: a longer list makes each draft step cost more")
    if not causes:  # only things the rules above do not know changed: say what they were
        causes = [f"{k} changed ({v.get('baseline')} -> {v.get('candidate')})" for k, v in changes.items()]
    return list(dict.fromkeys(causes))


def _short(sha: object) -> str:
    return str(sha)[:12] if sha else "none"


def _flag_diff(change: dict) -> str:
    a, b = change.get("baseline") or [], change.get("candidate") or []
    if not isinstance(a, list) or not isinstance(b, list):
        return f"{a} -> {b}"
    added, removed = [f for f in b if f not in a], [f for f in a if f not in b]
    parts = ([f"added {' '.join(added)}"] if added else []) + ([f"removed {' '.join(removed)}"] if removed else [])
    return "; ".join(parts) or "reordered"


# ------------------------------------------------------------------------------- a release on a cluster
def check_release(cx, number: int, *, against: int | None = None, progress: Progress | None = None) -> dict:
    """After release `number` passed its gate on the cluster context `cx` (steps.context.Context) through `up`,
    `rollback` or `vocab rollout`: measure it as the inventory's `sentinel:` says, compare with the record of
    release `against` (default: the newest older release that passed its gate and has one; a rollback passes the
    release itself, whose earlier record says how fast it was), and keep the record, with that verdict, in the
    release's directory on the head (`layout.SENTINEL_RECORD`): `health` shows it, `bench sentinel --inventory`
    repeats it. Returns the verdict."""
    from sparkdeploy.node import layout
    from sparkdeploy.ops import releases

    head = cx.conn(cx.head)
    nrs = cx.scan()
    raw = head.get(f"{releases.rdir(cx.lay, number)}/{layout.NODE_PLAN_FILE}")
    facts = release_facts(number, json.loads(raw) if raw else {}, nrs[cx.head].complete.get(number, {}))
    how = cx.inv.sentinel
    rec = measure(client.discover(cx.plan.api_url, model=cx.plan.served_name, api_key=cx.inv.auth.api_key()),
                  categories=how.categories, tokens=how.tokens, runs=how.runs, warmup=how.warmup, progress=progress,
                  release=facts)
    before = against if against is not None else releases.last_healthy(nrs, before=number)
    base = releases.read_sentinel(head, cx.lay, before) if before is not None else None
    rec["verdict"] = summary(compare(base, rec) if base else None, before if base else None)
    releases.write_sentinel(head, cx.lay, number, rec)
    return rec["verdict"]


def release_facts(number: int, node_plan: dict, meta: dict) -> dict:
    """What a record says about its release, read from the head's own files of it (`node-plan.json`: the argv
    the head serves with, the draft list's sha256 inside it, the image), so a release that `rollback` or `vocab
    rollout` put live is described as it runs, not as today's inventory would plan it."""
    argv = list(node_plan.get("node", {}).get("serve_argv") or [])
    return {"number": number, "list_sha": vocab_live.configured_sha(node_plan),
            "image": node_plan.get("image") or meta.get("image"), "flags": argv}


def summary(verdict: dict | None, against: int | None) -> dict:
    """The part of a compare kept with the record: enough for `health` to say what the last check found."""
    if verdict is None:
        return {"against": None, "regression": False, "text": "first record: no earlier healthy release's "
                                                                "record to compare with"}
    lines = [describe(r) for r in verdict["regressions"]]
    text = (f"SPEED REGRESSION against release {against}: " + "; ".join(lines)
            + (f" (likely: {verdict['likely_causes'][0]})" if verdict["likely_causes"] else "")
            if verdict["regression"] else f"no regression beyond noise against release {against}")
    return {"against": against, "regression": verdict["regression"], "text": text,
            "categories": sorted({r["category"] for r in verdict["regressions"]})}
