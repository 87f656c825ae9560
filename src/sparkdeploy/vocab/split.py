"""Tensor-parallel split: how the overlay shards a list's rows across TP ranks.

The draft head's `ParallelLMHead(S)` is a vLLM vocab-parallel layer: S is padded up to a multiple of
`pad_to` (64, vLLM's default), and each rank owns one contiguous, equal slice of the padded rows. Rows past
S are padding (never chosen: their logits are masked). Each rank takes the argmax over its slice and the
ranks reduce (value, index) pairs, so an even split gives every rank the same work.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sparkdeploy.errors import VocabError
from sparkdeploy.vocab.validate import as_id_array


@dataclass
class TPSplit:
    """`shards[r]` are the target ids rank r scores; `rows_per_rank` includes `padding[r]` pad rows."""

    tp: int
    rows_per_rank: int
    shards: list[np.ndarray]
    padding: list[int]

    def as_dict(self) -> dict:
        return {"tp": self.tp, "rows_per_rank": self.rows_per_rank,
                "ranks": [{"rank": r, "ids": int(len(s)), "padding": p,
                           "first": int(s[0]) if len(s) else None, "last": int(s[-1]) if len(s) else None}
                          for r, (s, p) in enumerate(zip(self.shards, self.padding))]}


def split_for_tp(ids, tp: int, pad_to: int = 64) -> TPSplit:
    """Split a list into `tp` contiguous shards of equal padded size (see module docstring)."""
    arr = as_id_array(ids)
    if tp < 1:
        raise VocabError(f"tp must be >= 1, got {tp}")
    if pad_to < 1:
        raise VocabError(f"pad_to must be >= 1, got {pad_to}")
    if arr.size == 0:
        raise VocabError("cannot split an empty list")
    padded = -(-arr.size // pad_to) * pad_to
    padded = -(-padded // tp) * tp
    per = padded // tp
    shards = [arr[r * per:(r + 1) * per] for r in range(tp)]
    return TPSplit(tp, per, shards, [per - len(s) for s in shards])
