"""The memory guards: MemAvailable against the plan's budget, as a `verdict.Result`.

`memory_margin` judges a start (weights + KV + the host reserve must fit in MemAvailable): doctor's memory
check and the start-time guard in `weights` use it. `serving_margin` judges a running engine (MemAvailable
must stay above the reserve): `health` and doctor (when the engine already runs) use it. Pure: the callers
read /proc/meminfo (parsed by `probes.parse_meminfo`).
"""

from __future__ import annotations

from sparkdeploy.verdict import Result, Status

GIB = 1 << 30


def memory_margin(check: str, node: str, avail: int, need_bytes: int, reserve_bytes: int,
                  *, total: int | None = None) -> Result:
    """The memory guard: MemAvailable against weights + KV (`need_bytes`) + the host reserve.

    Below need + reserve: failed (starting would eat the reserve and risk an OOM cascade).
    Within 10% of it: warn. Used before start (after the checkpoint's page cache is evicted) and by doctor.
    """
    want = need_bytes + reserve_bytes
    seen = f"MemAvailable {avail / GIB:.1f} GiB" + (f" of {total / GIB:.1f}" if total else "")
    if want == 0:
        return Result(check, node, Status.OK, seen + " (no budget given)")
    margin = avail - want
    detail = (f"{seen}; weights+KV {need_bytes / GIB:.1f} + reserve {reserve_bytes / GIB:.1f} = "
              f"{want / GIB:.1f} GiB; margin {margin / GIB:+.1f} GiB")
    if margin < 0:
        return Result(check, node, Status.FAILED, detail,
                      "free memory (stop other processes, `sparkdeploy weights evict`, boot to multi-user.target) "
                      "or lower gpu_memory_utilization / max_model_len")
    if margin < 0.1 * want:
        return Result(check, node, Status.WARN, detail, "little headroom: a compile or load spike may hit earlyoom")
    return Result(check, node, Status.OK, detail)


def serving_margin(node: str, avail: int, reserve_bytes: int, *, low_factor: float = 1.25) -> Result:
    """While serving (for health): MemAvailable below the reserve fails; below `low_factor` x reserve warns."""
    seen = (f"MemAvailable {avail / GIB:.1f} GiB, reserve {reserve_bytes / GIB:.1f} GiB, "
            f"margin {(avail - reserve_bytes) / GIB:+.1f} GiB")
    if avail < reserve_bytes:
        return Result("memory-margin", node, Status.FAILED, seen,
                      "the host is eating its reserve: lower gpu_memory_utilization or max_num_seqs, stop other processes")
    if avail < reserve_bytes * low_factor:
        return Result("memory-margin", node, Status.WARN, seen, "watch it: a spike may trigger earlyoom")
    return Result("memory-margin", node, Status.OK, seen)
