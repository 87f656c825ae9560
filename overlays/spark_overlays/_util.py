"""Logging, process identity, cross-rank agreement and atomic file writes shared by the overlays (and by the
kit's vocab tools, which vendor this package)."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

logger = logging.getLogger("vllm.spark_overlays")
PREFIX = "spark_overlays:"


def process_tag() -> str:
    try:
        import setproctitle

        title = setproctitle.getproctitle()[:40]
    except Exception:  # noqa: BLE001 - only a label
        title = "?"
    return f"pid={os.getpid()} title={title!r}"


def info(msg: str, *args) -> None:
    logger.warning(f"{PREFIX} " + msg, *args)  # WARNING: vLLM's default level shows it in every process


def fail_closed(feature: str, reason: str) -> None:
    logger.warning(f"{PREFIX} {feature} DISABLED (stock behaviour kept): %s", reason)


def _tp_min(values: list[int]) -> list[int] | None:
    """Element-wise minimum of `values` over the tensor-parallel ranks (gloo CPU group; no CUDA); None when
    there is one rank (or no TP group)."""
    from vllm.distributed.parallel_state import get_tp_group, model_parallel_is_initialized

    if not model_parallel_is_initialized():
        return None
    group = get_tp_group()
    if group.world_size == 1:
        return None
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group.cpu_group)
    return t.tolist()


def tp_agree(ok: bool) -> bool:
    """True only if every tensor-parallel rank says ok. Single rank: ``ok``."""
    try:
        low = _tp_min([1 if ok else 0])
        return ok if low is None else bool(low[0])
    except Exception as e:  # noqa: BLE001
        logger.warning(f"{PREFIX} TP agreement check failed (%s); treating as disagreement", e)
        return False


def tp_same(value: int) -> bool:
    """True only if every tensor-parallel rank passes the same `value` (|value| < 2^62). Single rank: True."""
    try:
        low = _tp_min([value, -value])
        return low is None or low[0] == -low[1]
    except Exception as e:  # noqa: BLE001
        logger.warning(f"{PREFIX} TP agreement check failed (%s); treating as disagreement", e)
        return False


def tp_rank() -> int:
    """This process's tensor-parallel rank (0 without a TP group)."""
    try:
        from vllm.distributed.parallel_state import get_tp_group, model_parallel_is_initialized

        return get_tp_group().rank_in_group if model_parallel_is_initialized() else 0
    except Exception:  # noqa: BLE001 - only a label
        return 0


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """A reader sees the old file or the new one, never a part: temp file beside it (mode as the umask says,
    not mkstemp's 0600), fsync, rename; on any failure the temp file is removed and `path` is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
