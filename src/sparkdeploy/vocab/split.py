"""Tensor-parallel split: which of a list's rows each TP rank holds, as vLLM splits the overlay's draft head.

The overlay builds the draft head as `ParallelLMHead(S)` over the list (sorted ascending, checked, not
reordered) and hands it the list's S rows gathered from the full head; the split is vLLM's own: the
vocab-parallel layer pads S up to a multiple of `pad_to` (64, vLLM's default) and its weight loader gives each
rank one contiguous, equal slice of the padded rows. Rows past S are padding (never chosen: their logits are
masked). Each rank takes the argmax over its slice and the ranks reduce (value, index) pairs, so an even split
gives every rank the same work. The rule itself is `spark_overlays.vocab_list.rows_per_rank`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from spark_overlays import vocab_list

from sparkdeploy.errors import VocabError
from sparkdeploy.vocab.validate import as_id_array


@dataclass
class TPSplit:
    """`shards[r]` are the target ids rank r scores; `rows_per_rank` includes `padding[r]` pad rows."""

    tp: int
    rows_per_rank: int
    shards: list[np.ndarray]
    padding: list[int]

    def to_dict(self) -> dict:
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
    try:
        per = vocab_list.rows_per_rank(arr.size, tp, pad_to)
    except vocab_list.VocabListError as err:
        raise VocabError(str(err)) from None
    shards = [arr[r * per:(r + 1) * per] for r in range(tp)]
    return TPSplit(tp, per, shards, [per - len(s) for s in shards])
