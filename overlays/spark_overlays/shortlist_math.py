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
