"""GPU kernel check for the skinny-GEMM plans: F.linear vs the skinny kernel at M = 1..5, one run.

    python bench/gpu_kernels.py [--iters 200] [--shapes all|lm|shortlist|gdn] [--plans 12.1] [--json]
                                [--kernel-source VLLM_SRC]   # torch + cutlass-dsl + quack, no vLLM needed

For each (N, K) — the full lm_head (248,320 x 2,560) and its TP=2 half, the shortlist heads (16k/32k/64k rows,
TP=1 and TP=2), the GDN projections (QKVZ, B/A, out_proj at TP=1/2) — and each M in 1..5 it
  * checks correctness of both paths against an fp32 reference (relative max error <= 2e-2 for BF16),
  * times F.linear and, where vLLM's CuTe-DSL ``shape_dynamic_skinny_gemm`` is importable (vLLM >= 0.33
    with nvidia-cutlass-dsl), the skinny kernel with the spark_overlays plan (``skinny_plans.plans_for``,
    lm-head shapes without an entry get the generic plan) for this device, or for the table named by
    ``--plans 12.1`` (GB10's, forced on another GPU), or, without a plan, the kernel's default config;
    each row says whether its plan is measured,
  * prints the achieved bandwidth (weight + activations + output bytes / time) next to a device-to-device
    copy bandwidth measured in the same run, and the skinny/F.linear time ratio. A plan entry whose
    ratio is >= 1 should be removed from ``overlays/spark_overlays/skinny_plans.py``.
Timing: each call captured once in a CUDA graph and replayed ``--rounds`` x ``--iters`` times, every replay
after an L2 flush (a 256 MiB write) and timed by its own CUDA events; the median is reported.
Then the whole draft step (head GEMM on its best kernel + argmax, + d2t for the shortlist) at the TP=1 and
TP=2 local shapes, full 248,320-row head vs a 64k shortlist vs the full head quantized to FP8 the way vLLM's
``draft_lm_head_quantization: fp8`` does it (per-row weight scale, per-token activation scale, ``torch._scaled_mm``;
"n/a" where this torch/device has no row-wise FP8 GEMM), checking that the shortlist's token equals the full argmax
whenever that is on the list. (NVFP4 needs vLLM's own kernels: its bytes are in ``bench/draft_head_levers.py``.)
On a GB10 (or with ``--plans 12.1``) it ends with the (N, K, M) whose skinny plan beats F.linear by more than 5%,
vLLM 0.34's rule for its plan table: the lines to put in ``skinny_plans.MEASURED_034`` (``--kernel-source``
the 0.34 source to time 0.34's kernel).
Exit status: 0 ok (also when there is no CUDA device: it says so), 1 when a correctness check fails, a
planned config does not run, or a shortlist token differs.
`--cpu-smoke` runs the whole script on the CPU with every shape divided by 64 and a wall-clock timer (no
kernel, figures meaningless): the test suite uses it so the script is known to run before a GPU is at hand.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "overlays"))

H = 2560
SHAPES = {
    "lm": [(248320, H), (124160, H)],
    "shortlist": [(65536, H), (32768, H), (16384, H), (8192, H)],
    "gdn": [(16384, H), (8192, H), (96, H), (48, H), (H, 6144), (H, 3072)],
}


KERNEL_PACKAGE = "vllm.model_executor.kernels.linear.cute_dsl"


def stub_vllm_for_kernel(source: Path) -> None:
    """Make vLLM's two CuTe skinny-GEMM files (``skinny_gemm.py``, ``_skinny_gemm.py`` under ``source``, a vLLM
    checkout or unpacked wheel) importable on a machine with torch and cutlass-dsl but no vLLM: empty parent
    packages, and stand-ins for the only two vLLM helpers they call (the current stream, PDL support)."""
    import types

    import torch

    directory = source / "vllm" / KERNEL_PACKAGE.split(".", 1)[1].replace(".", "/")
    names = KERNEL_PACKAGE.split(".")
    for i in range(1, len(names) + 1):
        mod = sys.modules.setdefault(".".join(names[:i]), types.ModuleType(".".join(names[:i])))
        mod.__path__ = [str(directory)] if i == len(names) else []
    utils = sys.modules.setdefault("vllm.utils", types.ModuleType("vllm.utils"))
    utils.__path__ = []
    torch_utils = sys.modules.setdefault("vllm.utils.torch_utils", types.ModuleType("vllm.utils.torch_utils"))
    torch_utils.current_stream = torch.cuda.current_stream
    platforms = sys.modules.setdefault("vllm.platforms", types.ModuleType("vllm.platforms"))
    platforms.current_platform = types.SimpleNamespace(
        is_arch_support_pdl=lambda: torch.cuda.get_device_capability()[0] >= 9)


def skinny_kernel():
    """(kernel, config class) of vLLM's CuTe-DSL skinny GEMM, or None (it says why) when it cannot run here."""
    try:
        from vllm.model_executor.kernels.linear.cute_dsl.skinny_gemm import SkinnyGemmConfig, shape_dynamic_skinny_gemm

        if shape_dynamic_skinny_gemm.is_available():
            return shape_dynamic_skinny_gemm, SkinnyGemmConfig
        print("# skinny kernel not available on this device; timing F.linear only")
    except Exception as e:  # noqa: BLE001
        print(f"# skinny kernel unavailable ({type(e).__name__}: {e}); timing F.linear only")
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--m", default="1,2,3,4,5")
    ap.add_argument("--shapes", default="all", choices=["all", *SHAPES])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--plans", help="use this capability's plan table, e.g. 12.1 (default: the device's own)")
    ap.add_argument("--kernel-source", type=Path,
                    help="a vLLM source tree to take the CuTe skinny kernel from, without installing vLLM")
    ap.add_argument("--cpu-smoke", action="store_true", help="run on the CPU at 1/64 scale (checks the script only)")
    args = ap.parse_args(argv)

    try:
        import torch
    except ImportError:
        print("gpu_kernels: torch is not installed; nothing to measure (exit 0)")
        return 0
    smoke = args.cpu_smoke
    if not smoke and not torch.cuda.is_available():
        print("gpu_kernels: no CUDA device on this machine; this script needs an NVIDIA GPU (GB10 or H200). "
              "Nothing measured (exit 0).")
        return 0
    import torch.nn.functional as F

    from spark_overlays import skinny_plans

    dev = torch.device("cpu" if smoke else "cuda")
    cap = (0, 0) if smoke else torch.cuda.get_device_capability()
    plan_cap = tuple(int(v) for v in args.plans.split(".")) if args.plans else cap
    name = "cpu (smoke run, 1/64 scale)" if smoke else torch.cuda.get_device_name()
    scale = 64 if smoke else 1
    sync = (lambda: None) if smoke else torch.cuda.synchronize
    if args.kernel_source:
        stub_vllm_for_kernel(args.kernel_source)
    kernel = None if smoke else skinny_kernel()

    # Larger than any L2 we target (H200 50 MB, GB10 24 MB): written before each timed call so the weight
    # comes from DRAM, as it does in decode where every layer's weight is read once per step.
    flush = None if smoke else torch.empty(256 << 20, dtype=torch.int8, device=dev)

    def timed(fn, iters):
        """Seconds per call, median over rounds x iters calls. On the GPU one call is captured in a CUDA graph
        (no launch overhead from Python) and each replay, after an L2 flush, is timed by its own events; a call
        that cannot be captured is timed eagerly the same way. Wall clock on the CPU."""
        fn()
        sync()
        if smoke:
            rounds = []
            for _ in range(args.rounds):
                t0 = time.perf_counter()
                for _ in range(iters):
                    fn()
                rounds.append((time.perf_counter() - t0) / iters)
            return statistics.median(rounds)
        run = fn
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                fn()  # warm-up on a side stream before capture, as torch.cuda.graph asks
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
            run = graph.replay
        except Exception as e:  # noqa: BLE001 - the kernel's own launcher may refuse capture: time it eagerly
            print(f"gpu_kernels: not capturable in a CUDA graph, timed eagerly: {e}", file=sys.stderr)
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                 for _ in range(args.rounds * iters)]
        for start, end in pairs:
            flush.zero_()
            start.record()
            run()
            end.record()
        sync()
        return statistics.median(start.elapsed_time(end) for start, end in pairs) * 1e-3

    def copy_bandwidth() -> float:
        """Device copy bandwidth (read + write) on a 1 GiB buffer (16 MiB in a smoke run), timed as the GEMMs."""
        src = torch.empty((1 << 29) // scale, dtype=torch.bfloat16, device=dev)
        dst = torch.empty_like(src)
        return 2 * src.numel() * src.element_size() / timed(lambda: dst.copy_(src), 20)

    copy_bw = copy_bandwidth()
    shapes = [(max(16, n // scale), max(16, k // scale))
              for key, v in SHAPES.items() if args.shapes in ("all", key) for n, k in v]
    shapes = list(dict.fromkeys(shapes))
    ms = [int(m) for m in args.m.split(",")]
    rows, failures = [], []
    g = torch.Generator(device=dev).manual_seed(0)
    for n, k in shapes:
        w = (torch.randn(n, k, device=dev, generator=g) * 0.02).to(torch.bfloat16)
        w32 = w.float()
        for m in ms:
            x = torch.randn(m, k, device=dev, generator=g).to(torch.bfloat16)
            ref = x.float() @ w32.T
            scale = ref.abs().max().item() or 1.0

            def err(out):
                return (out.float() - ref).abs().max().item() / scale

            e_lin = err(F.linear(x, w))
            t_lin = timed(lambda: F.linear(x, w), args.iters)
            nbytes = (n * k + m * k + m * n) * 2
            row = {"N": n, "K": k, "M": m, "linear_us": t_lin * 1e6, "linear_GBps": nbytes / t_lin / 1e9,
                   "linear_err": e_lin, "plan": None, "skinny_us": None, "skinny_GBps": None, "skinny_err": None,
                   "ratio": None}
            if e_lin > 2e-2:
                failures.append(f"F.linear N={n} K={k} M={m}: rel err {e_lin:.3g}")
            if kernel is not None:
                gemm, Cfg = kernel
                plan = skinny_plans.plans_for(plan_cap, n, k, lm_head=(n, k) in SHAPES["lm"] + SHAPES["shortlist"]).get(m)
                cfg = (Cfg(m, plan.block_size, plan.outputs_per_block, k_unroll=plan.k_unroll,
                           vector_width=plan.vector_width, static_k=plan.static_k) if plan else None)
                row["plan"] = ("measured" if plan.measured else "unmeasured") if plan else "kernel default"
                try:
                    out = gemm(x, w, cfg)
                    e_sk = err(out)
                    t_sk = timed(lambda: gemm(x, w, cfg), args.iters)
                    row.update(skinny_us=t_sk * 1e6, skinny_GBps=nbytes / t_sk / 1e9, skinny_err=e_sk,
                               ratio=t_sk / t_lin)
                    if e_sk > 2e-2:
                        failures.append(f"skinny N={n} K={k} M={m}: rel err {e_sk:.3g}")
                except Exception as e:  # noqa: BLE001 - reported, and the run fails: a plan must compile
                    row["plan"] = f"{row['plan']} (rejected: {type(e).__name__}: {e})"
                    if plan is not None:
                        failures.append(f"skinny N={n} K={k} M={m}: planned config does not run: {e}")
            rows.append(row)

    def best(w, x):
        """Seconds of the faster of F.linear and the planned skinny kernel for x @ w.T."""
        t = timed(lambda: F.linear(x, w), args.iters)
        plan = skinny_plans.plans_for(plan_cap, *w.shape, lm_head=True).get(x.shape[0]) if kernel else None
        if plan is not None:
            gemm, Cfg = kernel
            cfg = Cfg(x.shape[0], plan.block_size, plan.outputs_per_block, k_unroll=plan.k_unroll,
                      vector_width=plan.vector_width, static_k=plan.static_k)
            try:
                t = min(t, timed(lambda: gemm(x, w, cfg), args.iters))
            except Exception:  # noqa: BLE001 - already counted as a failure above when planned
                pass
        return t

    def fp8_head_seconds(w, x):
        """The full head as ``draft_lm_head_quantization: fp8`` holds it (FP8 E4M3 rows, fp32 scale per row;
        activations quantized per token), GEMM + argmax; None where row-wise ``torch._scaled_mm`` is missing."""
        fp8 = torch.float8_e4m3fn
        w_scale = (w.float().abs().amax(1, keepdim=True) / torch.finfo(fp8).max).clamp(min=1e-12)
        w8 = (w.float() / w_scale).to(fp8)

        def step():
            x_scale = (x.float().abs().amax(1, keepdim=True) / torch.finfo(fp8).max).clamp(min=1e-12)
            x8 = (x.float() / x_scale).to(fp8)
            return torch._scaled_mm(x8, w8.T, scale_a=x_scale, scale_b=w_scale.T, out_dtype=torch.bfloat16).argmax(-1)

        try:
            step()
            return timed(step, args.iters)
        except Exception as e:  # noqa: BLE001 - reported as n/a: this torch / device has no row-wise FP8 GEMM
            print(f"# fp8 head not timed ({type(e).__name__}: {str(e)[:120]})", file=sys.stderr)
            return None

    # the whole draft step, seed 000's fair comparison: full head -> argmax vs 64k shortlist -> argmax + d2t,
    # both on their best kernel, at the TP=1 and TP=2 local shapes
    draft = []
    shrink = 64 if smoke else 1
    k = H // shrink
    for tp in (1, 2):
        v, s = 248320 // tp // shrink, 65536 // tp // shrink
        full = (torch.randn(v, k, device=dev, generator=g) * 0.02).to(torch.bfloat16)
        ids = torch.randperm(v, device=dev, generator=g)[:s].sort().values
        short, d2t = full.index_select(0, ids), ids - torch.arange(s, device=dev)
        for m in ms:
            x = torch.randn(m, k, device=dev, generator=g).to(torch.bfloat16)
            full_top = (x.float() @ full.float().T).argmax(-1)
            top = (x.float() @ short.float().T).argmax(-1)
            listed = torch.isin(full_top, ids)
            if not torch.equal((top + d2t[top])[listed], full_top[listed]):
                failures.append(f"draft step TP={tp} M={m}: shortlist token differs from the full argmax on the list")
            logits_full, logits_short = F.linear(x, full), F.linear(x, short)
            t_full = best(full, x) + timed(lambda: logits_full.argmax(-1), args.iters)
            t_short = best(short, x) + timed(lambda: (lambda i: i + d2t[i])(logits_short.argmax(-1)), args.iters)
            t_fp8 = None if smoke else fp8_head_seconds(full, x)
            draft.append({"tp": tp, "M": m, "full_rows": v, "short_rows": s, "full_us": t_full * 1e6,
                          "short_us": t_short * 1e6, "ratio": t_short / t_full, "on_list": int(listed.sum()),
                          "fp8_us": None if t_fp8 is None else t_fp8 * 1e6,
                          "fp8_ratio": None if t_fp8 is None else t_fp8 / t_full})

    wins = [r for r in rows if r["ratio"] is not None and r["ratio"] < 1 / 1.05 and r["plan"] in ("measured", "unmeasured")]
    if args.json:
        print(json.dumps({"device": name, "capability": cap, "copy_GBps": copy_bw / 1e9, "rows": rows,
                          "draft_step": draft, "wins_034_rule": [[w["N"], w["K"], w["M"]] for w in wins],
                          "failures": failures}, indent=1))
    else:
        print(f"# {name}, capability {cap[0]}.{cap[1]}; copy bandwidth {copy_bw / 1e9:.0f} GB/s (read+write); "
              f"median of {args.rounds} rounds x {args.iters} calls")
        print(f"{'N':>7} {'K':>5} {'M':>2} {'linear us':>10} {'GB/s':>7} {'%copy':>6} {'skinny us':>10} {'GB/s':>7} "
              f"{'%copy':>6} {'skinny/lin':>10}  plan")
        for r in rows:
            sk = (f"{r['skinny_us']:>10.2f} {r['skinny_GBps']:>7.0f} {100 * r['skinny_GBps'] * 1e9 / copy_bw:>6.1f} "
                  f"{r['ratio']:>10.3f}") if r["skinny_us"] is not None else f"{'-':>10} {'-':>7} {'-':>6} {'-':>10}"
            print(f"{r['N']:>7} {r['K']:>5} {r['M']:>2} {r['linear_us']:>10.2f} {r['linear_GBps']:>7.0f} "
                  f"{100 * r['linear_GBps'] * 1e9 / copy_bw:>6.1f} {sk}  {r['plan'] or '-'}")
        print("# draft step (head GEMM on its best kernel + argmax [+ d2t]): full vocabulary vs shortlist")
        for d in draft:
            fp8 = "n/a" if d["fp8_us"] is None else f"{d['fp8_us']:.2f} us, ratio {d['fp8_ratio']:.3f}"
            print(f"TP={d['tp']} M={d['M']}: full {d['full_rows']} rows {d['full_us']:.2f} us, shortlist "
                  f"{d['short_rows']} rows {d['short_us']:.2f} us, ratio {d['ratio']:.3f} "
                  f"({d['on_list']}/{d['M']} full argmaxes on the list); full head fp8 {fp8}")
        if plan_cap == (12, 1):
            print("# wins under vLLM 0.34's rule (skinny beats F.linear by >5%): skinny_plans.MEASURED_034 candidates")
            print(", ".join(f"({w['N']}, {w['K']}, {w['M']})" for w in wins) or "(none)")
    for f in failures:
        print(f"FAIL {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
