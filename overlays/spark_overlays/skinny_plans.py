"""Skinny-GEMM plan table: (device capability, N, K, M) -> kernel config. Pure data, no torch.

``N`` is the *local* output rows (after the TP split), ``K`` the input features, ``M`` the token rows.
Configs are the parameters of vLLM's CuTe-DSL ``ShapeDynamicSkinnyGemm`` (``SkinnyGemmConfig`` without
``num_rows``, which is M). ``source`` says where a number came from:

* ``qwen4_exp``: copied from vLLM 0.33's measured SM121 plans (``vllm/models/qwen4_exp/nvidia/low_latency_gemm.py``);
* ``seed``: not measured yet (M = 3 and 5, the shortlist heads); derived from the neighbouring measured
  config. ``bench/gpu_kernels.py`` measures every entry against ``F.linear`` on a GPU; a seed that loses
  there must be removed, since a plan entry is only worth having when it beats the fallback.
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
    source: str = "seed"

    def valid_for(self, n: int, k: int) -> bool:
        """The kernel's own shape rules (ShapeDynamicSkinnyGemm.__call__)."""
        return (
            n % self.outputs_per_block == 0
            and k % (self.block_size * self.vector_width) == 0
            and (self.static_k is None or self.static_k == k)
        )


def _q(*a, **kw) -> Plan:
    return Plan(*a, **kw, source="qwen4_exp")


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
    # Shortlist heads (S rows, padded to 64; TP=2 halves). 16384 and 8192 rows share the GDN QKVZ shapes.
    (65536, H): {m: Plan(64, 2, k_unroll=2, vector_width=4, static_k=H) for m in range(1, 6)},
    (32768, H): {m: Plan(64, 2, k_unroll=2, vector_width=4, static_k=H) for m in range(1, 6)},
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


def lookup(capability: tuple[int, int] | None, n: int, k: int, m: int,
           plans: dict = PLANS) -> Plan | None:
    """The planned config, or ``None`` (caller falls back to ``F.linear``)."""
    if capability is None:
        return None
    plan = plans.get(tuple(capability), {}).get((n, k), {}).get(m)
    if plan is None or not plan.valid_for(n, k):
        return None
    return plan


def shapes(capability: tuple[int, int], plans: dict = PLANS) -> set[tuple[int, int]]:
    return set(plans.get(tuple(capability), {}))
