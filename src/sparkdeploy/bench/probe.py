"""`bench probe`: one stream at temperature 0, per category; decode tok/s, TTFT and acceptance per position
from counter deltas; the median of N kept runs after a warm-up."""

from __future__ import annotations

from collections.abc import Callable

from sparkdeploy.bench import power, results
from sparkdeploy.bench.client import Service, stream_chat
from sparkdeploy.bench.prompts import Category
from sparkdeploy.bench.run import measured_run

Progress = Callable[[str], None]
Hook = Callable[[str, int], None]  # (group, attempt) -> None, called once the run's requests are launched


def repeat(result: dict, group: str, runs: int, warmup: int, make_send, *, max_discards: int | None = None,
           on_run_start: Hook | None = None, progress: Progress | None = None, values=None,
           watch_interval: float | None = None) -> None:
    """Warm-up runs, then measured runs until `runs` are kept or `max_discards` were thrown away.

    `make_send(attempt)` builds the run's stream thunks; `values(outcome)` overrides the per-run values.
    """
    max_discards = runs if max_discards is None else max_discards
    attempt, kept, discarded = 0, 0, 0
    for w in range(warmup):
        outcome = measured_run_for(result, make_send(attempt), on_run_start, group, attempt, watch_interval)
        results.add_run(result, group, -(warmup - w), True, outcome,
                        values=values(outcome) if values else None)
        attempt += 1
        _say(progress, group, "warm-up", outcome)
    while kept < runs and discarded <= max_discards:
        outcome = measured_run_for(result, make_send(attempt), on_run_start, group, attempt, watch_interval)
        results.add_run(result, group, kept, False, outcome, values=values(outcome) if values else None)
        attempt += 1
        if outcome.kept:
            kept += 1
        else:
            discarded += 1
        _say(progress, group, f"run {kept}/{runs}" if outcome.kept else "run", outcome)


def measured_run_for(result: dict, send, hook: Hook | None, group: str, attempt: int,
                     watch_interval: float | None = None):
    service = Service(**result["service"])
    on_start = (lambda: hook(group, attempt)) if hook else None
    return measured_run(service, send, on_start=on_start, watch_interval=watch_interval)


def _say(progress: Progress | None, group: str, what: str, outcome) -> None:
    if progress is None:
        return
    if outcome.kept:
        vals = results.run_values(outcome)
        tok = vals.get("decode_tok_s")
        acc = vals.get("acceptance_length")
        progress(f"{group}: {what} kept"
                 + (f", {tok:.1f} tok/s" if tok else "") + (f", acceptance {acc:.2f}" if acc else ""))
    else:
        progress(f"{group}: {what} DISCARDED: {outcome.discard_reason}")


def probe(service: Service, categories: list[Category], *, tokens: int = 256, runs: int = 3, warmup: int = 1,
          prompt_index: int = 0, ignore_eos: bool = True, context: dict | None = None,
          on_run_start: Hook | None = None, progress: Progress | None = None, energy: bool = True) -> dict:
    """Each category's runs; with `energy`, where this machine can read the service's GPU power
    (`power.why_unreadable`), each run also gets the GPU's mean power and joules per generated token;
    `result["power"]` says which."""
    settings = {"tokens": tokens, "runs": runs, "warmup": warmup, "prompt_index": prompt_index,
                "ignore_eos": ignore_eos, "temperature": 0, "categories": [c.name for c in categories]}
    result = results.new("probe", service.to_dict(), context or {}, settings)
    why_not = power.why_unreadable(service.url) if energy else "not asked"
    result["power"] = {"source": "nvidia-smi", "measured": why_not is None, "why_not": why_not}
    watts: list[float | None] = []  # the last run's mean power (runs are one after another)

    def with_energy(outcome) -> dict:
        values = results.run_values(outcome)
        done = [r for r in outcome.requests if r.ok]
        if watts and watts[-1] is not None and done:
            values["gpu_power_w"] = watts[-1]
            jpt = power.joules_per_token(watts[-1], done[0].total_s, done[0].completion_tokens)
            if jpt is not None:
                values["joules_per_token"] = jpt
        return values

    for cat in categories:
        messages = cat.messages(prompt_index)

        def make_send(_attempt: int, messages=messages):
            if why_not is not None:
                return [lambda: stream_chat(service, messages, tokens, ignore_eos=ignore_eos)]

            def metered():
                with power.Meter() as meter:
                    got = stream_chat(service, messages, tokens, ignore_eos=ignore_eos)
                watts.append(meter.watts)
                return got
            return [metered]

        repeat(result, cat.name, runs, warmup, make_send, on_run_start=on_run_start, progress=progress,
               values=with_energy if why_not is None else None)
    results.summarize_runs(result)
    return result
