"""Skinny-GEMM plan table: (device capability, N, K, M) -> kernel config. Pure data, no torch.

``N`` is the *local* output rows (after the TP split), ``K`` the input features, ``M`` the token rows.
Configs are the parameters of vLLM's CuTe-DSL ``ShapeDynamicSkinnyGemm`` (``SkinnyGemmConfig`` without
``num_rows``, which is M). ``measured`` says whether a number is backed by a measurement:

* ``measured=True``: copied from vLLM 0.33's measured SM121 plans
  (``vllm/models/qwen4_exp/nvidia/low_latency_gemm.py``: kept only where they beat ``F.linear`` under
  CUDA-graph replay);
* ``measured=False``: derived from the neighbouring measured config (M = 3 and 5, the GDN shapes upstream
  lacks) or :func:`generic` for an lm-head of any other size; nothing measured them yet. ``bench/gpu_kernels.py``
  times every entry against ``F.linear``; an entry that loses there must go.

Whatever the table says, each entry is compiled and checked on the device once at load
(``skinny_gemm.check``); one that fails there runs ``F.linear``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Plan:
    block_size: int
    outputs_per_block: int
    k_unroll: int = 1
    vector_width: int = 8
    static_k: int | None = None
    measured: bool = False

    def valid_for(self, n: int, k: int) -> bool:
        """The kernel's own shape rules (ShapeDynamicSkinnyGemm.__call__)."""
        return (
            n % self.outputs_per_block == 0
            and k % (self.block_size * self.vector_width) == 0
            and (self.static_k is None or self.static_k == k)
        )


def _q(*a, **kw) -> Plan:
    return Plan(*a, **kw, measured=True)


H = 2560  # hidden size of the Qwen3.5 / Qwen3.8-Flash-Next family served on GB10

SM121: dict[tuple[int, int], dict[int, Plan]] = {
    # LM head, full vocabulary (draft head without shortlist; target head).
    (248320, H): {
        1: _q(128, 1, k_unroll=2, vector_width=4, static_k=H),
        2: _q(128, 1, k_unroll=2, vector_width=4, static_k=H),
        3: Plan(32, 1, vector_width=4, static_k=H),
        4: _q(32, 1, vector_width=4, static_k=H),
        5: Plan(64, 1, k_unroll=2, vector_width=4, static_k=H),
    },
    # LM head, TP=2.
    (124160, H): {
        1: _q(128, 2, k_unroll=4, vector_width=4),
        2: _q(64, 2, k_unroll=2),
        3: Plan(64, 2, k_unroll=2),
        4: Plan(64, 2, k_unroll=2),
        5: Plan(64, 2, k_unroll=2),
    },
    # GDN fused QKVZ, TP=1 and TP=2 (a shortlist head of 16384 or 8192 rows shares these).
    (16384, H): {
        1: _q(32, 1, k_unroll=4, vector_width=2, static_k=H),
        2: _q(32, 1, vector_width=2, static_k=H),
        3: Plan(32, 1, k_unroll=2, vector_width=2, static_k=H),
        4: _q(32, 1, k_unroll=2, vector_width=2, static_k=H),
        5: Plan(32, 1, k_unroll=2, vector_width=2, static_k=H),
    },
    (8192, H): {
        1: _q(128, 2, vector_width=4, static_k=H),
        2: _q(64, 2, k_unroll=2, static_k=H),
        3: Plan(64, 2, k_unroll=2, static_k=H),
        4: _q(64, 2, k_unroll=4, vector_width=4, static_k=H),
        5: Plan(64, 2, k_unroll=4, vector_width=4, static_k=H),
    },
    # GDN fused B/A (stays BF16 even with FP8 GDN).
    (96, H): {
        1: _q(128, 4, k_unroll=2, vector_width=2, static_k=H),
        2: _q(64, 4, vector_width=2, static_k=H),
        3: Plan(128, 4, vector_width=2, static_k=H),
        4: _q(128, 4, vector_width=2, static_k=H),
        5: Plan(128, 4, k_unroll=2, vector_width=4, static_k=H),
    },
    (48, H): {
        1: _q(128, 1, k_unroll=4, vector_width=4, static_k=H),
        2: _q(128, 2, k_unroll=4, vector_width=4, static_k=H),
        3: Plan(128, 1, k_unroll=4, vector_width=4, static_k=H),
        4: _q(128, 1, k_unroll=4, vector_width=4, static_k=H),
        5: Plan(128, 1, k_unroll=4, vector_width=4, static_k=H),
    },
    # GDN output projection (BF16 when FP8 GDN is off), TP=1 and TP=2.
    (H, 6144): {
        1: _q(64, 2, vector_width=4, static_k=6144),
        2: _q(64, 1, k_unroll=4, vector_width=4, static_k=6144),
        3: Plan(64, 1, k_unroll=4, vector_width=4, static_k=6144),
        4: _q(64, 1, k_unroll=4, vector_width=4, static_k=6144),
        5: Plan(64, 1, k_unroll=4, vector_width=4, static_k=6144),
    },
    (H, 3072): {
        1: _q(128, 2, k_unroll=2, vector_width=4, static_k=3072),
        2: _q(64, 2, k_unroll=2, static_k=3072),
        3: Plan(64, 2, k_unroll=2, static_k=3072),
        4: _q(64, 2, k_unroll=2, static_k=3072),
        5: Plan(64, 2, k_unroll=2, static_k=3072),
    },
}

PLANS: dict[tuple[int, int], dict[tuple[int, int], dict[int, Plan]]] = {(12, 1): SM121}


def generic(n: int, k: int) -> dict[int, Plan]:
    """M = 1..5 for an lm-head no entry covers (a shortlist of any size, at any TP); unmeasured."""
    plan = Plan(64, 2 if n % 2 == 0 else 1, k_unroll=2, vector_width=4, static_k=k)
    return {m: plan for m in range(1, 6)} if plan.valid_for(n, k) else {}


def plans_for(capability: tuple[int, int] | None, n: int, k: int, lm_head: bool = False,
              plans: dict = PLANS) -> dict[int, Plan]:
    """{M: plan} for a layer of local shape (N, K) on this device; an lm-head of unlisted N gets :func:`generic`.
    Empty: the layer stays on ``F.linear``."""
    table = plans.get(tuple(capability), {}) if capability is not None else {}
    if not table:
        return {}
    found = {m: p for m, p in table.get((n, k), {}).items() if p.valid_for(n, k)}
    return found or (generic(n, k) if lm_head else {})


def counts(plans: dict = PLANS) -> dict[str, int]:
    """How many entries a measurement supports, for the plan's notes and the bench."""
    entries = [p for table in plans.values() for by_m in table.values() for p in by_m.values()]
    return {"entries": len(entries), "measured": sum(p.measured for p in entries)}


# (N, K, M) of ours measured on a GB10 under 0.34's table rule (beats cuBLAS by more than 5% under CUDA-graph
# replay): empty until bench/gpu_kernels.py has run on one. The 0.33 marks above (``measured``) were upstream's
# qwen4_exp measurements against F.linear with 0.33's kernel, a different rule and build.
MEASURED_034: frozenset[tuple[int, int, int]] = frozenset()


def extend_upstream_table(table: dict, cfg_cls, ours: dict[tuple[int, int], dict[int, Plan]] = SM121,
                          *, only: frozenset[tuple[int, int, int]] | None) -> list[tuple[int, int, int]]:
    """Add our entries to a pin's own plan table (0.34: ``SKINNY_GEMM_PLANS_BY_CAPABILITY[(12, 1)]``, keyed
    ``(N, K) -> {M: SkinnyGemmConfig}``), never replacing one of upstream's. ``only`` keeps the table's rule
    (only measured wins: pass ``MEASURED_034``); ``None`` adds every entry. Returns the (N, K, M) added."""
    added = []
    for (n, k), by_m in ours.items():
        for m, plan in sorted(by_m.items()):
            if (only is not None and (n, k, m) not in only) or not plan.valid_for(n, k) or m in table.get((n, k), {}):
                continue
            table.setdefault((n, k), {})[m] = cfg_cls(m, plan.block_size, plan.outputs_per_block,
                                                       k_unroll=plan.k_unroll, vector_width=plan.vector_width,
                                                       static_k=plan.static_k)
            added.append((n, k, m))
    return added
