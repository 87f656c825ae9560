"""Patch 4: prefix-cache chunk alignment for hybrid (GDN) models with MTP (switch: ``prefix_align.enabled``).

GDN state is cached only where a prefill chunk ends on a block boundary. Where the pin does this
natively (0.33: align mode with MTP look-ahead hashes) the planner renders ``--enable-prefix-caching``
and this file stays idle. On 0.32 it wraps ``Scheduler._mamba_block_aligned_split`` (class level, so
``AsyncScheduler`` inherits it; EngineCore process) and may only *shorten* the chunk the stock code
chose, to the stops :func:`aligned_chunk_end` computes. The checkpoint position is read through the
scheduler module's own from-imported ``get_mamba_prefill_checkpoint_position`` and never rebound, so the
scheduler and the KV manager keep agreeing on where the state lives.
"""

from __future__ import annotations

from ._util import info

_state = {"patched": False}


def aligned_chunk_end(start: int, end: int, prefill_end: int, block_size: int, lookahead: int,
                      checkpoint: int) -> int:
    """Where a prefill chunk ``[start, end)`` should stop. Pure; never later than ``end``, always after ``start``.

    * the prompt's last chunk (``end >= prefill_end``) is exempt from alignment but still stops at the
      cacheable checkpoint if that lies inside it;
    * a non-final chunk never ends within ``lookahead`` tokens of ``prefill_end`` (MTP reads those
      tokens as draft inputs and re-fills them), and ends on a block boundary whenever one lies in
      ``(start, end]``;
    * a chunk that spans the checkpoint stops there, so the state at the checkpoint gets written.
    """
    if not 0 <= start < end:
        return end
    if end < prefill_end:
        limit = prefill_end - max(lookahead, 0)
        if start < limit < end:
            end = limit
        aligned = end // block_size * block_size
        if aligned > start:
            end = aligned
    if start < checkpoint < end:
        end = checkpoint
    return end


def _lookahead(scheduler, configured: int | None) -> int:
    if configured is not None:
        return configured
    return int(getattr(scheduler, "num_prefill_lookahead", 0) or 0)


def patch(vllm_version: str) -> bool:
    """Install the wrapper once per process when compat says this pin needs the overlay."""
    from . import compat

    if _state["patched"]:
        return True
    if compat.mode(vllm_version, "prefix_align") != compat.OVERLAY:
        return False
    import vllm.v1.core.sched.scheduler as sched_mod

    Scheduler = sched_mod.Scheduler
    original = Scheduler._mamba_block_aligned_split
    if getattr(original, "_spark_overlay", False):
        _state["patched"] = True
        return True

    def _mamba_block_aligned_split(self, request, num_new_tokens, num_new_local_computed_tokens=0,
                                   num_external_computed_tokens=0):
        n = original(self, request, num_new_tokens, num_new_local_computed_tokens, num_external_computed_tokens)
        cfg = getattr(self, "_spark_align_cfg", None)
        if cfg is None:
            cfg = _scheduler_settings(self)
            self._spark_align_cfg = cfg
        if not cfg or n <= 0:
            return n
        start = request.num_computed_tokens + num_new_local_computed_tokens + num_external_computed_tokens
        prefill_end = max(request.num_prompt_tokens, request.num_tokens - 1)
        if start >= prefill_end:
            return n
        block = self.cache_config.block_size
        checkpoint = sched_mod.get_mamba_prefill_checkpoint_position(
            request.num_tokens, block, getattr(self, "use_eagle_block_drop", False))
        end = aligned_chunk_end(start, start + n, prefill_end, block, _lookahead(self, cfg["lookahead"]), checkpoint)
        return max(end - start, 1) if end > start else n

    _mamba_block_aligned_split._spark_overlay = True  # type: ignore[attr-defined]
    _mamba_block_aligned_split.__wrapped__ = original  # type: ignore[attr-defined]
    Scheduler._mamba_block_aligned_split = _mamba_block_aligned_split
    _state["patched"] = True
    return True


def _scheduler_settings(scheduler) -> dict | bool:
    from . import settings as _settings

    vllm_config = getattr(scheduler, "vllm_config", None)
    cfg = _settings.switched_on(getattr(vllm_config, "additional_config", None), "prefix_align")
    if cfg is None:
        return False
    info("prefix_align: chunk stops aligned (block %d, look-ahead %d)", scheduler.cache_config.block_size,
         _lookahead(scheduler, cfg.lookahead))
    return {"lookahead": cfg.lookahead}
