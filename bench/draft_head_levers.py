"""Which lever wins on the MTP draft head: bytes read per draft step, side by side, and CPU time where it runs.

    python bench/draft_head_levers.py [--tp 1,2] [--m 1] [--iters 5] [--scale 1] [--json]

Rows (Qwen3.5 / Qwen3.8-Flash-Next head: 248,320 x 2,560):
  * the full BF16 head (what the stock MTP shares with the target),
  * our shortlist at 16k / 32k / 64k rows (BF16),
  * upstream's ``draft_lm_head_quantization`` fp8 (per-row fp32 scale) and nvfp4 (E2M1 codes, an E4M3 scale per
    16 values, one fp32 global scale), the layouts of vLLM 0.34's ``quantization/online/lm_head.py``,
  * shortlist + a quantized head, from shapes only: vLLM 0.34 cannot stack them (``share_target_lm_head`` refuses
    ``draft_lm_head_quantization`` for a drafter with its own head), so these rows say what stacking would buy.
Bytes per draft step and rank = head weights (+ scales) + M x hidden activations + M x rows logits (BF16); the
head dominates at decode. CPU time: ``hidden @ head.T`` + argmax on this machine's CPU in BF16 (median of
``--iters``); the FP8 / NVFP4 heads have no CPU kernel, so their time is "n/a" and only a GPU run
(``bench/gpu_kernels.py``) times them. ``--scale N`` divides every row count by N (the test suite's quick run).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

VOCAB, HIDDEN = 248320, 2560
SHORTLISTS = (16384, 32768, 65536)

# bytes per weight element, and per-row / per-tensor scale bytes, of each head format
FORMATS = {
    "bf16": {"elem": 2.0, "per_row": 0, "per_16": 0, "global": 0},
    "fp8": {"elem": 1.0, "per_row": 4, "per_16": 0, "global": 0},  # Fp8PtpcOnlineLinearMethod: fp32 scale per row
    "nvfp4": {"elem": 0.5, "per_row": 0, "per_16": 1, "global": 4},  # packed E2M1, E4M3 per 16 values, fp32 global
}


def head_bytes(rows: int, hidden: int, fmt: str) -> int:
    f = FORMATS[fmt]
    return int(rows * hidden * f["elem"] + rows * f["per_row"] + rows * hidden // 16 * f["per_16"] + f["global"])


def step_bytes(rows: int, hidden: int, fmt: str, m: int, tp: int) -> int:
    """Bytes one rank reads and writes for one draft step of M tokens (its share of the rows)."""
    local = -(-rows // tp)
    return head_bytes(local, hidden, fmt) + m * hidden * 2 + m * local * 2


def levers(scale: int = 1) -> list[tuple[str, int, str, bool]]:
    """(label, rows / scale, format, possible on vLLM 0.34)."""
    vocab = VOCAB // scale
    rows = [("full head BF16 (stock MTP)", vocab, "bf16", True)]
    rows += [(f"shortlist {s // 1024}k BF16", s // scale, "bf16", True) for s in SHORTLISTS]
    rows += [(f"full head {fmt} (draft_lm_head_quantization)", vocab, fmt, True) for fmt in ("fp8", "nvfp4")]
    rows += [(f"shortlist {s // 1024}k + {fmt}", s // scale, fmt, False) for fmt in ("fp8", "nvfp4") for s in SHORTLISTS]
    return rows


def cpu_time_us(rows: int, hidden: int, m: int, iters: int) -> float:
    import torch

    torch.manual_seed(0)
    head = torch.randn(rows, hidden, dtype=torch.bfloat16)
    x = torch.randn(m, hidden, dtype=torch.bfloat16)
    (x @ head.T).argmax(-1)  # warm-up
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        (x @ head.T).argmax(-1)
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def table(tps: list[int], ms: list[int], iters: int, scale: int) -> list[dict]:
    full = {(tp, m): step_bytes(VOCAB // scale, HIDDEN, "bf16", m, tp) for tp in tps for m in ms}
    timed: dict[tuple[int, int], float] = {}
    out = []
    for label, rows, fmt, possible in levers(scale):
        for tp in tps:
            for m in ms:
                local = -(-rows // tp)
                us = None
                if fmt == "bf16":
                    if (local, m) not in timed:  # one timing per local shape (TP=2 halves repeat TP=1 ones)
                        timed[(local, m)] = cpu_time_us(local, HIDDEN, m, iters)
                    us = timed[(local, m)]
                b = step_bytes(rows, HIDDEN, fmt, m, tp)
                out.append({"lever": label, "rows": rows, "format": fmt, "tp": tp, "M": m, "bytes": b,
                            "bytes_vs_full": b / full[(tp, m)], "cpu_us": us, "on_034": possible})
    for r in out:
        base = next(x["cpu_us"] for x in out if x["lever"].startswith("full head BF16") and x["tp"] == r["tp"]
                    and x["M"] == r["M"])
        r["cpu_vs_full"] = None if r["cpu_us"] is None else r["cpu_us"] / base
    return out


def render(rows: list[dict], scale: int) -> str:
    head = (f"draft-head levers (hidden {HIDDEN}, vocab {VOCAB // scale}{f', every row count / {scale}' if scale > 1 else ''});"
            " bytes per draft step and rank; CPU time BF16 only (this machine)")
    lines = [head, f"{'lever':<44} {'tp':>2} {'M':>2} {'MiB/step':>9} {'x full':>7} {'CPU us':>9} {'x full':>7}  on 0.34"]
    for r in rows:
        cpu = "n/a" if r["cpu_us"] is None else f"{r['cpu_us']:.0f}"
        cpu_x = "" if r["cpu_vs_full"] is None else f"{r['cpu_vs_full']:.2f}"
        lines.append(f"{r['lever']:<44} {r['tp']:>2} {r['M']:>2} {r['bytes'] / 2**20:>9.1f} {r['bytes_vs_full']:>7.3f} "
                     f"{cpu:>9} {cpu_x:>7}  {'yes' if r['on_034'] else 'no (not stackable)'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tp", default="1,2", help="tensor-parallel sizes (comma list)")
    ap.add_argument("--m", default="1", help="tokens per draft step (comma list)")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--scale", type=int, default=1, help="divide every row count by this (quick runs)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = table([int(x) for x in args.tp.split(",")], [int(x) for x in args.m.split(",")], args.iters, args.scale)
    print(json.dumps({"rows": rows}, indent=2) if args.json else render(rows, args.scale))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
