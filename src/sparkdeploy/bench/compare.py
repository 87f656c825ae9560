"""`bench compare A.json B.json`: per metric, the difference of medians against the noise measured from the
repeats (see stats.verdict), plus the reasons the two files may not be comparable at all."""

from __future__ import annotations

from sparkdeploy.bench import stats
from sparkdeploy.errors import BenchError


def comparability(a: dict, b: dict) -> list[str]:
    """Differences in what was measured (not how fast): each one makes a verdict less meaningful."""
    notes = []
    if a.get("kind") != b.get("kind"):
        notes.append(f"kind differs: {a.get('kind')} vs {b.get('kind')}")
    for key in ("model",):
        if a["service"].get(key) != b["service"].get(key):
            notes.append(f"service.{key} differs: {a['service'].get(key)} vs {b['service'].get(key)}")
    for key in ("tokens", "prefix_tokens", "concurrency", "categories", "ignore_eos", "prompt_index"):
        if a["settings"].get(key) != b["settings"].get(key):
            notes.append(f"settings.{key} differs: {a['settings'].get(key)} vs {b['settings'].get(key)}")
    return notes


def compare(a: dict, b: dict, *, extra_baselines: list[dict] = ()) -> dict:
    """Verdicts for every metric both sides have; `extra_baselines` are more repeats of side A.

    The figures are judged together: each noisy one at stats.ALPHA / the number of noisy ones (Bonferroni),
    so the whole comparison false-alarms at most stats.ALPHA of the time (at 1% each, an A/A of about 20
    noisy figures alarmed 3-5% of the time). A figure whose repeats all agree (acceptance at temperature 0)
    cannot false-alarm and does not dilute the others' bound."""
    common = [k for k in a["metrics"] if k in b["metrics"]]
    if not common:
        raise BenchError("the two results share no metric: nothing to compare")
    samples = {k: (a["metrics"][k]["values"], b["metrics"][k]["values"],
                   [e["metrics"][k]["values"] for e in extra_baselines if k in e.get("metrics", {})])
               for k in common}
    noisy = sum(stats.is_noisy([*s[:2], *s[2]]) for s in samples.values())
    alpha = stats.ALPHA / max(1, noisy)
    rows = []
    for key in common:
        ma = a["metrics"][key]
        hib = ma.get("higher_is_better")
        va, vb, extra = samples[key]
        v = stats.verdict(key, va, vb, higher_is_better=bool(hib) if hib is not None else True,
                          extra_a=extra, alpha=alpha)
        row = {**v.to_dict(), "unit": ma.get("unit", ""), "higher_is_better": hib}
        if hib is None and v.verdict in (stats.BETTER, stats.WORSE):
            row["verdict"] = "changed"  # not a performance figure: only say that it moved beyond noise
        if v.a not in (None, 0) and v.difference is not None:
            row["relative"] = v.difference / abs(v.a)
        rows.append(row)
    return {
        "a": {"created": a.get("created"), "service": a.get("service"), "context": a.get("context")},
        "b": {"created": b.get("created"), "service": b.get("service"), "context": b.get("context")},
        "extra_baselines": len(extra_baselines),
        "alpha_per_figure": alpha,
        "comparability": comparability(a, b),
        "rows": rows,
        "only_in_a": [k for k in a["metrics"] if k not in b["metrics"]],
        "only_in_b": [k for k in b["metrics"] if k not in a["metrics"]],
    }
