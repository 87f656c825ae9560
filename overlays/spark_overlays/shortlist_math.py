"""Tensor math of the shortlisted head, kept free of vLLM so it is unit-tested on CPU torch."""

from __future__ import annotations

import torch


def gather_rows(full_head: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``[V, H]`` full head (or tied embedding) -> ``[S, H]`` shortlist head."""
    return full_head.index_select(0, ids.to(full_head.device))


def scatter_to_vocab(logits: torch.Tensor, target_ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """``[M, S]`` shortlist logits -> ``[M, vocab]`` with ``-inf`` off the list (static shapes, graph-safe)."""
    out = logits.new_full((logits.shape[0], vocab), float("-inf"))
    out.index_copy_(1, target_ids, logits)
    return out


def local_argmax_tp(hidden: torch.Tensor, head: torch.Tensor, tp: int, padding: int = 64) -> torch.Tensor:
    """Reference for vLLM's vocab-parallel ``LogitsProcessor.get_top_tokens`` over an ``[S, H]`` head:
    pad to ``padding``, split evenly over ``tp`` ranks, masked local argmax per rank, reduce the
    (value, global index) pairs. Returns shortlist positions ``[M]``."""
    s = head.shape[0]
    padded = (s + padding - 1) // padding * padding
    per = padded // tp
    best_val = torch.full((hidden.shape[0],), float("-inf"), dtype=torch.float32)
    best_idx = torch.zeros(hidden.shape[0], dtype=torch.long)
    for r in range(tp):
        lo, hi = r * per, min((r + 1) * per, s)
        shard = torch.zeros(per, head.shape[1], dtype=head.dtype)
        if hi > lo:
            shard[: hi - lo] = head[lo:hi]
        logits = (hidden @ shard.T).float()
        logits[:, max(hi - lo, 0):] = float("-inf")  # padding rows
        val, idx = logits.max(dim=-1)
        better = val > best_val
        best_val = torch.where(better, val, best_val)
        best_idx = torch.where(better, idx + lo, best_idx)
    return best_idx
