"""Logging, process identity and cross-rank agreement shared by the overlays."""

from __future__ import annotations

import logging
import os

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


def tp_agree(ok: bool) -> bool:
    """True only if every tensor-parallel rank says ok (gloo CPU group; no CUDA). Single rank: ``ok``."""
    try:
        from vllm.distributed.parallel_state import get_tp_group, model_parallel_is_initialized

        if not model_parallel_is_initialized():
            return ok
        group = get_tp_group()
        if group.world_size == 1:
            return ok
        import torch
        import torch.distributed as dist

        flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group.cpu_group)
        return bool(flag.item())
    except Exception as e:  # noqa: BLE001
        logger.warning(f"{PREFIX} TP agreement check failed (%s); treating as disagreement", e)
        return False
