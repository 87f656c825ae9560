#!/usr/bin/env python3
"""Where a CI run's time went, from the files .ci/run leaves behind.

    scripts/ci_summary.py --phases PHASES.tsv --timing TIMING.jsonl [--slowest 50]
                          [--before OLD-TIMING.jsonl [--before-phases OLD-PHASES.tsv]]

PHASES.tsv: `<phase>\t<seconds>` lines (.ci/run and scripts/setup.sh append them). TIMING.jsonl: the spans of
`sparkdeploy.timing` ($SPARKDEPLOY_TIMING_LOG): deploy verbs, readiness waits, cluster bring-ups, engine starts,
module/session fixtures and every test's setup/call/teardown with the xdist worker that ran it.

Prints: the phase table; the busy time per xdist worker and per test group (the slowest worker is the run's
critical path); counts and seconds of cluster bring-ups, image builds, engine starts, deploys and waits; the
slowest fixtures; the slowest tests with their setup / call / teardown split. With `--before` (an earlier run's
files), the same figures side by side: phases, busy time per worker, per module, and the 20 slowest tests of
either run, each with its change: the table a change to CI time is judged by.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

SPAN_KINDS = ("cluster bring-up", "image build", "engine start", "deploy", "wait")


def read_phases(path: Path | None) -> list[tuple[str, float]]:
    if path is None or not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        name, _, seconds = line.rpartition("\t")
        try:
            rows.append((name, float(seconds)))
        except ValueError:
            continue
    return rows


def read_spans(path: Path | None) -> list[dict]:
    if path is None or not path.is_file():
        return []
    spans = []
    for line in path.read_text().splitlines():
        try:
            spans.append(json.loads(line))
        except ValueError:
            continue  # a line cut by a killed process
    return spans


def group_of(nodeid: str) -> str:
    if nodeid.startswith("overlays/"):
        return "overlays"
    parts = nodeid.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else parts[0]


def minutes(seconds: float) -> str:
    return f"{seconds:8.0f} s {seconds / 60:6.1f} min"


def busy_by(spans: list[dict], part: int) -> dict[str, float]:
    """Setup + call + teardown seconds per worker (`part` 0) or per test (`part` 2) of the tests' spans."""
    out: dict[str, float] = defaultdict(float)
    for s in spans:
        if s["kind"].startswith("test "):
            out[s["what"].partition(" ")[part]] += s["seconds"]
    return out


def compare(before: tuple[list[tuple[str, float]], list[dict]], after: tuple[list[tuple[str, float]], list[dict]],
            top: int = 20) -> list[str]:
    """Before/after: phases, workers, modules and the `top` slowest tests of either run, with the change."""
    def rows(title: str, old: dict[str, float], new: dict[str, float], keys: list[str]) -> list[str]:
        lines = [f"## {title}", f"{'before s':>9} {'after s':>9} {'change':>8}  what"]
        for k in keys:
            a, b = old.get(k), new.get(k)
            delta = f"{b - a:+8.0f}" if a is not None and b is not None else f"{'':>8}"
            lines.append(f"{'-' if a is None else f'{a:.0f}':>9} {'-' if b is None else f'{b:.0f}':>9} {delta}  {k}")
        return lines + [""]

    out: list[str] = []
    old_ph, new_ph = dict(before[0]), dict(after[0])
    if old_ph or new_ph:
        out += rows("Phases", old_ph, new_ph, list(dict.fromkeys([*new_ph, *old_ph])))
    old_w, new_w = busy_by(before[1], 0), busy_by(after[1], 0)
    out += rows("Busy time per xdist worker", old_w, new_w, sorted(set(old_w) | set(new_w)))
    old_t, new_t = busy_by(before[1], 2), busy_by(after[1], 2)
    old_m: dict[str, float] = defaultdict(float)
    new_m: dict[str, float] = defaultdict(float)
    for src, dst in ((old_t, old_m), (new_t, new_m)):
        for nodeid, sec in src.items():
            dst[nodeid.split("::")[0]] += sec
    mods = sorted(set(old_m) | set(new_m), key=lambda m: -max(old_m.get(m, 0), new_m.get(m, 0)))[:top]
    out += rows(f"Busy time per module (the {len(mods)} largest)", old_m, new_m, mods)
    slow = sorted(set(old_t) | set(new_t), key=lambda t: -max(old_t.get(t, 0), new_t.get(t, 0)))[:top]
    out += rows(f"The {len(slow)} slowest tests of either run", old_t, new_t, slow)
    return out


def report(phases: list[tuple[str, float]], spans: list[dict], slowest: int) -> list[str]:
    out: list[str] = []
    if phases:
        out += ["## CI phases", f"{'phase':<40} {'seconds':>19}"]
        out += [f"{name:<40} {minutes(sec)}" for name, sec in phases]
        setup = sum(sec for name, sec in phases if name.startswith("setup: "))
        make = next((sec for name, sec in phases if name.startswith("make test")), None)
        if setup and make is not None:
            out.append(f"{'  of which pytest (make test less setup)':<40} {minutes(make - setup)}")
        top = [sec for name, sec in phases if not name.startswith("setup: ")]
        out += [f"{'total (top-level phases)':<40} {minutes(sum(top))}", ""]

    tests: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for s in spans:
        if s["kind"].startswith("test "):
            tests[s["what"].partition(" ")[2]][s["kind"].removeprefix("test ")] += s["seconds"]
    worker_busy = busy_by(spans, 0)
    group_busy: dict[str, float] = defaultdict(float)
    for nodeid, sec in busy_by(spans, 2).items():
        group_busy[group_of(nodeid)] += sec
    if worker_busy:
        out += ["## Busy time per xdist worker (tests' setup + call + teardown; the largest is the critical path)"]
        out += [f"{w:<40} {minutes(sec)}" for w, sec in sorted(worker_busy.items())]
        out += ["", "## Busy time per test group"]
        out += [f"{g:<40} {minutes(sec)}" for g, sec in sorted(group_busy.items(), key=lambda kv: -kv[1])]
        out.append("")

    by_kind: dict[str, list[float]] = defaultdict(list)
    for s in spans:
        if s["kind"] in SPAN_KINDS:
            by_kind[s["kind"]].append(s["seconds"])
    out += ["## Where the time went (spans overlap: a deploy contains its waits)",
            f"{'what':<20} {'count':>6} {'total s':>9} {'median s':>9} {'max s':>8}"]
    for kind in SPAN_KINDS:
        xs = by_kind.get(kind, [])
        if xs:
            out.append(f"{kind:<20} {len(xs):>6} {sum(xs):>9.0f} {statistics.median(xs):>9.1f} {max(xs):>8.1f}")
        else:
            out.append(f"{kind:<20} {0:>6} {'-':>9} {'-':>9} {'-':>8}")
    deploys: dict[str, list[float]] = defaultdict(list)
    for s in spans:
        if s["kind"] == "deploy":
            deploys[s["what"]].append(s["seconds"])
    for verb, xs in sorted(deploys.items()):
        out.append(f"  {verb:<18} {len(xs):>6} {sum(xs):>9.0f} {statistics.median(xs):>9.1f} {max(xs):>8.1f}")
    out.append("")

    fixtures = sorted((s for s in spans if s["kind"] == "fixture"), key=lambda s: -s["seconds"])[:15]
    if fixtures:
        out += ["## Slowest module/session fixtures (setup; nested fixtures count in their parents too)"]
        out += [f"{s['seconds']:8.0f} s  {s['what']}" for s in fixtures]
        out.append("")

    if tests:
        rows = sorted(tests.items(), key=lambda kv: -sum(kv[1].values()))[:slowest]
        out += [f"## Slowest {len(rows)} tests", f"{'total':>7} {'setup':>7} {'call':>7} {'teardown':>8}  test"]
        for nodeid, t in rows:
            out.append(f"{sum(t.values()):7.0f} {t['setup']:7.0f} {t['call']:7.0f} {t['teardown']:8.0f}  {nodeid}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phases", type=Path)
    ap.add_argument("--timing", type=Path)
    ap.add_argument("--slowest", type=int, default=50)
    ap.add_argument("--before", type=Path, help="an earlier run's timing log: print both side by side")
    ap.add_argument("--before-phases", type=Path, help="that run's phase table")
    args = ap.parse_args(argv)
    phases, spans = read_phases(args.phases), read_spans(args.timing)
    if args.before:
        print("\n".join(compare((read_phases(args.before_phases), read_spans(args.before)), (phases, spans))))
        return 0
    print("\n".join(report(phases, spans, args.slowest)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
