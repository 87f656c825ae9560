"""Merge: the union of lists of one tokenizer, reporting how many ids each later list adds."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sparkdeploy.errors import VocabError
from sparkdeploy.vocab.validate import as_id_array


@dataclass
class MergeResult:
    """`ids` is the union; `sizes[i]` the size of input i; `new[i]` the ids it added to those before it."""

    ids: np.ndarray
    sizes: list[int]
    new: list[int]

    def line(self) -> str:
        """The seed's one-line summary: sizes of the inputs, ids new from the later ones, total."""
        return " ".join(map(str, [*self.sizes, *self.new[1:], len(self.ids)]))


def merge_lists(lists) -> MergeResult:
    if not lists:
        raise VocabError("nothing to merge")
    acc = np.zeros(0, dtype=np.int64)
    sizes, new = [], []
    for i, ids in enumerate(lists):
        arr = np.unique(as_id_array(ids, f"list {i + 1}"))
        sizes.append(int(len(arr)))
        new.append(int(len(np.setdiff1d(arr, acc, assume_unique=True))))
        acc = np.union1d(acc, arr)
    return MergeResult(acc, sizes, new)
