"""Shortlisted vs full draft head on the CPU: logits + argmax time at M = 1..5, side by side in one run.

    python bench/shortlist_cpu.py [--sizes 16384,32768,65536] [--reps 7] [--threads N] [--json]

The full head is the Qwen3.5-family lm_head, 248,320 x 2,560 BF16 (1.27 GB); each shortlist head is made
of rows gathered from it (sorted random ids, as the plugin gathers them at load). For every M the
variants are timed round-robin (one call each per repetition, order rotated) so drift in machine load hits
all of them alike; the median over repetitions after one warm-up round is reported.

Variants per shortlist size S:
  short+d2t      linear over S rows, argmax, ``i + d2t[i]``  (greedy path: ``get_top_tokens``)
  short+scatter  linear over S rows, -inf scatter into 248,320, argmax  (``compute_logits`` path)
Ratios are variant / full (lower is better), printed next to the row ratio S / 248,320.
Needs only torch. No timing is asserted anywhere; this prints measurements.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "overlays"))
from spark_overlays.shortlist_math import scatter_to_vocab  # noqa: E402  (the plugin's own; torch only)

VOCAB, HIDDEN = 248_320, 2_560


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="16384,32768,65536")
    ap.add_argument("--m", default="1,2,3,4,5")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = [int(s) for s in args.sizes.split(",")]
    ms = [int(m) for m in args.m.split(",")]

    g = torch.Generator().manual_seed(0)
    full = (torch.randn(VOCAB, HIDDEN, generator=g) * 0.02).to(torch.bfloat16)
    heads = {}
    for s in sizes:
        ids = torch.randperm(VOCAB, generator=g)[:s].sort().values
        heads[s] = (full.index_select(0, ids).contiguous(), ids, ids - torch.arange(s))

    def run_full(h):
        return F.linear(h, full).argmax(-1)

    def make_d2t(s):
        w, _, d2t = heads[s]

        def f(h):
            i = F.linear(h, w).argmax(-1)
            return i + d2t[i]
        return f

    def make_scatter(s):
        w, ids, _ = heads[s]

        def f(h):
            return scatter_to_vocab(F.linear(h, w), ids, VOCAB).argmax(-1)
        return f

    variants = [("full", VOCAB, run_full)]
    for s in sizes:
        variants += [(f"short{s}+d2t", s, make_d2t(s)), (f"short{s}+scatter", s, make_scatter(s))]

    rows = []
    for m in ms:
        h = torch.randn(m, HIDDEN, generator=g).to(torch.bfloat16)
        # correctness: whenever the full argmax is on the list, the shortlist picks it
        ref = run_full(h)
        for name, s, fn in variants[1:]:
            got = fn(h)
            ids = heads[s][1]
            on = torch.isin(ref, ids)
            if not torch.equal(got[on], ref[on]):
                print(f"MISMATCH {name} at M={m}", file=sys.stderr)
                return 1
        times = {name: [] for name, _, _ in variants}
        for rep in range(args.reps + 1):
            order = variants[rep % len(variants):] + variants[: rep % len(variants)]
            for name, _, fn in order:
                t0 = time.perf_counter()
                fn(h)
                dt = time.perf_counter() - t0
                if rep:  # rep 0 is the warm-up round
                    times[name].append(dt)
        base = statistics.median(times["full"])
        for name, s, _ in variants:
            med = statistics.median(times[name])
            rows.append({"M": m, "variant": name, "rows": s, "median_ms": round(med * 1e3, 3),
                         "time_ratio": round(med / base, 4), "row_ratio": round(s / VOCAB, 4)})

    if args.json:
        print(json.dumps({"threads": torch.get_num_threads(), "torch": torch.__version__, "rows": rows}, indent=1))
        return 0
    print(f"# full head {VOCAB} x {HIDDEN} bf16; torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"median of {args.reps} after warm-up")
    print(f"{'M':>2} {'variant':<20} {'rows':>7} {'median ms':>10} {'time/full':>10} {'rows/full':>10}")
    for r in rows:
        print(f"{r['M']:>2} {r['variant']:<20} {r['rows']:>7} {r['median_ms']:>10.3f} {r['time_ratio']:>10.4f} "
              f"{r['row_ratio']:>10.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
