"""The results JSON: one file per bench invocation, self-describing enough to compare two runs honestly.

Schema `sparkdeploy.bench/1`:

    {
      "schema": "sparkdeploy.bench/1",
      "kind": "probe" | "harness" | "turn2",
      "created": ISO-8601 UTC,
      "service": {"url", "model", "vllm_version", "max_model_len"},          # from /v1/models and /version
      "context": {"source": "url" | "inventory", "url" | "inventory", "cluster", "image": {...},
                  "patches": [...], "vocab_hash", "vocab": {...}, "profile": {...}, "nodes": [...],
                  "release_source", optional "release" and live facts from the orchestration seam},
                                                          # every field optional: absent = unknown
      "settings": {...the command's options...},
      "runs": [{"group", "index" (negative for warm-ups), "warmup", "kept", "discard_reason", "wall_s",
                "peak_running", "watch_samples", "values": {metric: number},
                "counters": {"request_success", "prompt_tokens", "generation_tokens", "preemptions",
                             "spec_decode": {...} | null, "prefix_cache": {...}, "server_timing": {...}},
                "requests": [{"ok", "error", "prompt_tokens", "completion_tokens", "ttft_s", "decode_s",
                              "total_s", "decode_tok_s", "bunched", "chunks"}]}],
      "metrics": {"<group>/<metric>": {"group", "name", "unit", "higher_is_better",
                                      "values": [kept, non-warm-up runs], "n", "median", "min", "max", "stdev"}},
      "discarded": [{"group", "index", "warmup", "reason"}],
      "power": {"source": "nvidia-smi", "measured": bool, "why_not": str | null},   # probe: energy per token
      "peak_check": {"cK": {"concurrency", "peak_running", "min_samples_per_run", "state", "reached"}}  # harness
    }

Groups: prompt categories (probe, harness), `cK` concurrency levels and `overall` (harness), `prefixN` (turn2).
`metrics` is derived from `runs` (kept, not warm-up); `compare` and `report` read only `metrics`.
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
from pathlib import Path

from sparkdeploy.bench.stats import summarize
from sparkdeploy.errors import BenchError

SCHEMA = "sparkdeploy.bench/1"

# metric name -> (unit, higher_is_better); None = recorded, but not a performance verdict
METRICS: dict[str, tuple[str, bool | None]] = {
    "decode_tok_s": ("tok/s", True),
    "ttft_s": ("s", False),
    "throughput_tok_s": ("tok/s", True),
    "server_decode_tok_s": ("tok/s", True),
    "server_ttft_s": ("s", False),
    "acceptance_length": ("tokens/step", True),
    "acceptance_rate": ("fraction", True),
    "ttft_turn1_s": ("s", False),
    "ttft_turn2_s": ("s", False),
    "prefix_hits_turn1": ("tokens", None),
    "prefix_hits_turn2": ("tokens", True),
    "prefix_hit_rate_turn2": ("fraction", True),
    "prompt_tokens": ("tokens", None),
    "peak_running": ("requests", None),
    "gpu_power_w": ("W", None),
    "joules_per_token": ("J/token", False),
}


def metric_meta(name: str) -> tuple[str, bool | None]:
    if name.startswith("accept_pos"):
        return "fraction", True
    return METRICS.get(name, ("", None))


def new(kind: str, service: dict, context: dict, settings: dict) -> dict:
    return {
        "schema": SCHEMA,
        "kind": kind,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "service": service,
        "context": context,
        "settings": settings,
        "runs": [],
        "metrics": {},
        "discarded": [],
    }


def run_values(outcome) -> dict[str, float]:
    """Per-run metric values from a RunOutcome (client timings + counter deltas)."""
    reqs = [r for r in outcome.requests if r.ok]
    values: dict[str, float] = {}
    tok_s = [r.decode_tok_s for r in reqs if r.decode_tok_s is not None]
    if tok_s:
        values["decode_tok_s"] = statistics.median(tok_s)
    ttft = [r.ttft_s for r in reqs if r.ttft_s is not None]
    if ttft:
        values["ttft_s"] = statistics.median(ttft)
    if outcome.extra.get("streams", 1) > 1 and outcome.wall_s > 0:
        values["throughput_tok_s"] = sum(r.completion_tokens for r in reqs) / outcome.wall_s
    if outcome.delta is not None:
        timing = outcome.delta.server_timing()
        if "decode_tok_s" in timing:
            values["server_decode_tok_s"] = timing["decode_tok_s"]
        if "ttft_s" in timing:
            values["server_ttft_s"] = timing["ttft_s"]
        spec = outcome.delta.spec_decode()
        if spec:
            values["acceptance_length"] = spec["acceptance_length"]
            if spec["acceptance_rate"] is not None:
                values["acceptance_rate"] = spec["acceptance_rate"]
            for i, rate in enumerate(spec["per_position"]):
                values[f"accept_pos{i}"] = rate
    if outcome.peak_running is not None:
        values["peak_running"] = outcome.peak_running
    return values


def counters(outcome) -> dict:
    if outcome.delta is None:
        return {}
    from sparkdeploy.bench import metrics as m

    d = outcome.delta
    return {
        "request_success": d(m.SUCCESS),
        "prompt_tokens": d(m.PROMPT_TOKENS),
        "generation_tokens": d(m.GENERATION_TOKENS),
        "preemptions": d(m.PREEMPTIONS),
        "spec_decode": d.spec_decode(),
        "prefix_cache": d.prefix_cache(),
        "server_timing": d.server_timing(),
    }


def add_run(result: dict, group: str, index: int, warmup: bool, outcome, *, values: dict | None = None,
            extra: dict | None = None) -> dict:
    record = {
        "group": group,
        "index": index,
        "warmup": warmup,
        "kept": outcome.kept,
        "discard_reason": outcome.discard_reason,
        "wall_s": outcome.wall_s,
        "peak_running": outcome.peak_running,
        "values": values if values is not None else run_values(outcome),
        "counters": counters(outcome),
        "requests": [r.to_dict() for r in outcome.requests],
        "watch_samples": outcome.extra.get("watch_samples"),
        **(extra or {}),
    }
    result["runs"].append(record)
    if not outcome.kept:
        result["discarded"].append({"group": group, "index": index, "warmup": warmup,
                                    "reason": outcome.discard_reason})
    return record


def summarize_runs(result: dict, *, overall_groups: set[str] | None = None) -> dict:
    """Fill result["metrics"] from the kept, non-warm-up runs.

    With `overall_groups`, adds `overall/decode_tok_s` and `overall/server_decode_tok_s`: one value per
    repeat index, the median over those groups of that repeat.
    """
    groups: dict[str, dict[str, list[float]]] = {}
    for run in result["runs"]:
        if run["warmup"] or not run["kept"]:
            continue
        for name, value in run["values"].items():
            groups.setdefault(run["group"], {}).setdefault(name, []).append(value)
    out: dict[str, dict] = {}
    for group, names in groups.items():
        for name, values in names.items():
            out[f"{group}/{name}"] = _entry(group, name, values)
    for name in ("decode_tok_s", "server_decode_tok_s") if overall_groups else ():
        by_index: dict[int, list[float]] = {}
        for run in result["runs"]:
            if run["group"] in overall_groups and run["kept"] and not run["warmup"] and name in run["values"]:
                by_index.setdefault(run["index"], []).append(run["values"][name])
        if by_index:
            per_repeat = [statistics.median(v) for _, v in sorted(by_index.items())]
            out[f"overall/{name}"] = _entry("overall", name, per_repeat)
    result["metrics"] = out
    return out


def _entry(group: str, name: str, values: list[float]) -> dict:
    unit, hib = metric_meta(name)
    return {"group": group, "name": name, "unit": unit, "higher_is_better": hib, "values": values,
            **summarize(values).to_dict()}


def save(result: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, sort_keys=False) + "\n")
    return path


def load(path: str | Path) -> dict:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise BenchError(f"{path}: cannot read results JSON: {err}") from err
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise BenchError(f"{path}: not a sparkdeploy bench result (schema {data.get('schema')!r}, "
                         f"expected {SCHEMA!r})" if isinstance(data, dict) else f"{path}: not a JSON object")
    return data
