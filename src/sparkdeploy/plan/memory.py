"""The one place `--gpu-memory-utilization` (GMU) is decided, and the memory budget every plan shows.

Why this exists. A GB10 has one memory pool shared by CPU and GPU (64 GB or 128 GB: every figure here comes
from the node's own MemTotal and MemAvailable, measured or given in a facts file). vLLM's GMU is a
fraction of *that whole pool*, and vLLM takes it for weights + activations + KV cache, while the host still
needs memory for everything vLLM does not count: the OS, dockerd, sshd, the page cache of the checkpoint just
read, the CUDA context, NCCL buffers, the API-server and engine-core processes. `nvidia-smi` memory fields are
N/A on GB10, so the only truth is /proc/meminfo.

The field seeds (DESIGN.md) fix the scale of "everything vLLM does not count":
  * GMU 0.835 (about 99.9 GiB) took the box down through an earlyoom cascade;
  * GMU 0.78  (about 93.4 GiB) ran with only 1.8 GiB left on the head, so roughly 21 GiB went to things
    outside vLLM's budget on a box with about 116 GiB MemAvailable;
  * GMU 0.68  (about 81.4 GiB) ran, with a KV pool of 665,924 tokens instead of 2,128,927.

The rule, in GiB, per node:

    base     = MemAvailable (measured with the engine stopped and caches dropped) or, if unknown, MemTotal
    reserve  = memory.reserve_gib in the inventory (default 28: ~21 GiB outside vLLM + ~7 GiB the host keeps
               free so earlyoom never fires)
    budget   = base - reserve                       -> what vLLM may take
    GMU      = floor(budget / MemTotal, 0.01)       -> derived unless the inventory pins one
    weights  = profile weights_gib / (tp x pp)      -> per rank (expert parallel splits the experts too)
    draft    = the shortlist draft head, when that overlay is on: its own [C, hidden] BF16 head beside the
               target's (the stock MTP shares the target's for free), C its capacity (the profile's
               shortlist.capacity, else the list's size) padded to 64 and split over TP:
               65,536 rows x 2,560 x 2 bytes = 320 MiB at TP=1, 160 MiB (~168 MB) per rank at TP=2
    KV pool  = GMU x MemTotal - weights - draft - activation_gib   (expected; vLLM logs the real figure)
    tokens   = KV pool / kv_bytes_per_token (per rank)
    fits     = KV pool >= max_model_len x kv_bytes_per_token: vLLM refuses to start when its pool cannot hold one
               sequence of the longest length it serves. A profile that does not fit is refused per node with
               its shortfall (what the node would need more of), so a 64 GB box and a 128 GB box can be told apart.

A node several services share (`services:`): each takes an equal part of MemTotal - reserve (its base is the
reserve plus that part; MemAvailable, read while the other services run, would count them twice), so the
derived GMUs, and any explicit one that passes, sum to at most what the node has. Refusals name the service.

With the nominal facts of a 128 GB GB10 (MemAvailable 116, MemTotal 119.7; `facts.nominal_gb10`, used only
when nothing was measured) and the default reserve this gives GMU 0.73:
0.68 (known good) < 0.73 < 0.78 (1.8 GiB left). An explicit GMU is refused (BudgetError, not a warning) when
`base - GMU x MemTotal < reserve`: with the default reserve 0.78 and 0.835 are refused and 0.68 passes.

Simulated (gpu: none) nodes run vLLM's CPU backend: no GMU; the KV pool is VLLM_CPU_KVCACHE_SPACE GiB and
the engine process needs about 3 GiB besides; the same reserve check applies to that total.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sparkdeploy.errors import BudgetError
from sparkdeploy.node.facts import GIB, NodeFacts

CPU_ENGINE_OVERHEAD_GIB = 3.0  # one vLLM CPU server with a tiny model (measured about 3 GB RSS)
DRAFT_HIDDEN_SIZE = 2560  # Qwen3.5 / Qwen3.8-Flash-Next; the profile states no hidden size yet
DRAFT_HEAD_DTYPE_BYTES = 2  # the gathered rows keep the checkpoint head's BF16


def shortlist_head_gib(capacity: int, tp: int, hidden_size: int = DRAFT_HIDDEN_SIZE) -> float:
    """Per-rank GiB of the shortlist overlay's own draft head of `capacity` rows (its size for life, whatever
    list it holds; 0 when the plan runs no shortlisted head)."""
    if not capacity:
        return 0.0
    from spark_overlays.vocab_list import rows_per_rank  # the engine's own padding and split rule

    return rows_per_rank(capacity, tp) * hidden_size * DRAFT_HEAD_DTYPE_BYTES / GIB


@dataclass(frozen=True)
class MemoryBudget:
    node: str
    gpu: bool
    mem_total_gib: float
    mem_available_gib: float | None
    base: str  # "MemAvailable" | "MemTotal"
    base_gib: float
    reserve_gib: float
    gpu_memory_utilization: float | None
    gmu_source: str  # "derived" | "explicit" | "cpu"
    engine_gib: float  # what vLLM may take (GMU x MemTotal, or the CPU estimate)
    weights_gib: float
    activation_gib: float
    kv_gib: float
    draft_head_gib: float
    kv_tokens: int | None
    left_gib: float  # base - engine: what the host keeps, never below reserve

    def rows(self) -> list[tuple[str, str]]:
        """(label, value) rows for the readable plan."""
        gmu = "n/a (CPU)" if self.gpu_memory_utilization is None else f"{self.gpu_memory_utilization:.2f} ({self.gmu_source})"
        avail = "unknown" if self.mem_available_gib is None else f"{self.mem_available_gib:.1f} GiB"
        kv = f"{self.kv_gib:.1f} GiB" + (f" ~ {self.kv_tokens:,} tokens" if self.kv_tokens is not None else "")
        return [
            ("MemTotal", f"{self.mem_total_gib:.1f} GiB"),
            ("MemAvailable", avail),
            ("base", f"{self.base} {self.base_gib:.1f} GiB"),
            ("host reserve", f"{self.reserve_gib:.1f} GiB"),
            ("gpu-memory-utilization", gmu),
            ("engine budget", f"{self.engine_gib:.1f} GiB"),
            ("  weights (per rank)", f"{self.weights_gib:.1f} GiB"),
            *([("  shortlist draft head", f"{self.draft_head_gib * 1024:.0f} MiB")] if self.draft_head_gib else []),
            ("  activations", f"{self.activation_gib:.1f} GiB"),
            ("  KV pool (expected)", kv),
            ("host keeps", f"{self.left_gib:.1f} GiB"),
        ]


def _r(value: float) -> float:
    return round(value, 3)


def budget(
    facts: NodeFacts,
    *,
    reserve_gib: float,
    weights_gib: float,
    activation_gib: float,
    kv_bytes_per_token: int,
    explicit_gmu: float | None = None,
    cpu_kv_space_gib: float | None = None,
    draft_head_gib: float = 0.0,
    shared_by: int = 1,
    min_kv_gib: float = 0.0,
) -> MemoryBudget:
    """The memory budget of one service on one node; raise BudgetError when it cannot keep `reserve_gib` for the
    host. On a node `shared_by` several services, each may take an equal part of what the reserve leaves of
    MemTotal (MemAvailable there is read while the other services run, so it would count them twice): its base
    is the reserve plus (MemTotal - reserve) / shared_by, and the services' budgets sum to the node's.
    `min_kv_gib` is the smallest KV pool the engine starts with (one sequence of max_model_len)."""
    total = facts.mem_total_bytes / GIB
    available = None if facts.mem_available_bytes is None else facts.mem_available_bytes / GIB
    base_name, base = ("MemAvailable", available) if available is not None else ("MemTotal", total)
    if shared_by > 1:
        base_name, base = (f"MemTotal share (node shared by {shared_by} services)",
                           reserve_gib + (total - reserve_gib) / shared_by)
    node = facts.node

    if not facts.has_gpu:
        kv = float(cpu_kv_space_gib if cpu_kv_space_gib is not None else 4.0)
        engine = weights_gib + draft_head_gib + activation_gib + kv + CPU_ENGINE_OVERHEAD_GIB
        left = base - engine
        if left < reserve_gib:
            raise BudgetError(
                f"node {node}: memory.reserve_gib: the CPU engine needs about {engine:.1f} GiB, leaving "
                f"{left:.1f} GiB of {base_name} {base:.1f} GiB, below the reserve {reserve_gib:.1f} GiB", node=node)
        return MemoryBudget(node, False, _r(total), None if available is None else _r(available), base_name,
                            _r(base), reserve_gib, None, "cpu", _r(engine), _r(weights_gib), _r(activation_gib),
                            _r(kv), _r(draft_head_gib), None, _r(left))

    if explicit_gmu is not None:
        gmu, source = explicit_gmu, "explicit"
        engine = gmu * total
        left = base - engine
        if left < reserve_gib:
            safe = math.floor((base - reserve_gib) / total * 100) / 100
            raise BudgetError(
                f"node {node}: memory.gpu_memory_utilization {gmu:.3g} gives vLLM {engine:.1f} GiB and leaves "
                f"{left:.1f} GiB of {base_name} {base:.1f} GiB, less than memory.reserve_gib {reserve_gib:.1f}; "
                f"the highest safe value is {safe:.2f} (or remove it to derive one)", node=node)
    else:
        gmu, source = math.floor((base - reserve_gib) / total * 100) / 100, "derived"
        engine = gmu * total
        left = base - engine
    kv = engine - weights_gib - draft_head_gib - activation_gib
    need = weights_gib + draft_head_gib + activation_gib + min_kv_gib
    if gmu < 0.05 or kv <= 0 or kv < min_kv_gib:
        short = need - max(engine, 0.0)
        how = ("raise memory.gpu_memory_utilization (up to the highest safe value) or remove it" if source == "explicit"
               else f"a node with {short:.1f} GiB more MemAvailable, a memory.reserve_gib that much lower, or a "
                    "profile with fewer weights per rank (more nodes) or a shorter engine.max_model_len")
        raise BudgetError(
            f"node {node}: short by {short:.1f} GiB: with {base_name} {base:.1f} GiB of MemTotal {total:.1f} GiB and "
            f"memory.reserve_gib {reserve_gib:.1f}, vLLM may take {max(engine, 0):.1f} GiB, but needs {need:.1f} GiB "
            f"({weights_gib + draft_head_gib:.1f} GiB of weights + {activation_gib:.1f} GiB of activations + "
            + (f"{min_kv_gib:.1f} GiB of KV for one max_model_len sequence" if min_kv_gib else "a KV pool")
            + f"); {how}", node=node)
    tokens = int(kv * GIB // kv_bytes_per_token) if kv_bytes_per_token > 0 else None
    return MemoryBudget(node, True, _r(total), None if available is None else _r(available), base_name, _r(base),
                        reserve_gib, gmu, source, _r(engine), _r(weights_gib), _r(activation_gib), _r(kv),
                        _r(draft_head_gib), tokens, _r(left))
