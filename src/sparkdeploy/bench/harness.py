"""`bench harness`: every category of a prompt set (one stream sending the category's prompts in turn, per
run) and a concurrency sweep (K streams at once) with the peak running-requests check."""

from __future__ import annotations

from sparkdeploy.bench import results
from sparkdeploy.bench.client import Service, stream_chat
from sparkdeploy.bench.probe import Progress, repeat
from sparkdeploy.bench.prompts import Category


def harness(service: Service, categories: list[Category], *, tokens: int = 128, runs: int = 3, warmup: int = 1,
            concurrency: list[int] = (1, 2, 4, 8), ignore_eos: bool = True, context: dict | None = None,
            prompt_set: str | None = None, watch_interval: float = 0.1,
            progress: Progress | None = None) -> dict:
    settings = {"tokens": tokens, "runs": runs, "warmup": warmup, "concurrency": list(concurrency),
                "ignore_eos": ignore_eos, "temperature": 0, "prompt_set": prompt_set,
                "watch_interval_s": watch_interval,
                "categories": {c.name: len(c.prompts) for c in categories}}
    result = results.new("harness", service.to_dict(), context or {}, settings)
    for cat in categories:
        def make_send(_attempt: int, cat=cat):
            def stream():
                return [stream_chat(service, cat.messages(i), tokens, ignore_eos=ignore_eos)
                        for i in range(len(cat.prompts))]
            return [stream]

        repeat(result, cat.name, runs, warmup, make_send, progress=progress)

    everything = [(c, i) for c in categories for i in range(len(c.prompts))]
    for k in concurrency:
        def make_send(_attempt: int, k=k):
            picks = [everything[j % len(everything)] for j in range(k)]
            return [lambda c=c, i=i: stream_chat(service, c.messages(i), tokens, ignore_eos=ignore_eos)
                    for c, i in picks]

        repeat(result, f"c{k}", runs, warmup, make_send, progress=progress,
               watch_interval=watch_interval, values=_with_throughput)
    results.summarize_runs(result, overall_groups={c.name for c in categories})
    result["peak_check"] = {f"c{k}": peak_check(result, f"c{k}", k) for k in concurrency}
    return result


def _with_throughput(outcome) -> dict:
    """Concurrency runs report total output tok/s over the run's wall time, one stream (c1) included."""
    values = results.run_values(outcome)
    if outcome.wall_s > 0:
        values["throughput_tok_s"] = sum(r.completion_tokens for r in outcome.requests if r.ok) / outcome.wall_s
    return values


def peak_check(result: dict, group: str, k: int) -> dict:
    """Did the engine ever run all K streams at once? Sampled, so short runs can miss the peak: the number
    of samples is recorded, and fewer than 3 per run makes the check inconclusive rather than failed."""
    runs = [r for r in result["runs"] if r["group"] == group and r["kept"] and not r["warmup"]]
    peak = max((r["peak_running"] or 0 for r in runs), default=None)
    samples = min((r.get("watch_samples") or 0 for r in runs), default=0)
    if peak is not None and peak >= k:
        state = "reached"
    elif samples < 3:
        state = "inconclusive"
    else:
        state = "not reached"
    return {"concurrency": k, "peak_running": peak, "min_samples_per_run": samples, "state": state,
            "reached": state == "reached"}
