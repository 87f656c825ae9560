"""Coverage: the share of a text's tokens that are off a list (what the draft head can never propose)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

from sparkdeploy.vocab.classify import CLASSES, token_classes
from sparkdeploy.vocab.count import count_ids
from sparkdeploy.vocab.tokenizer import Tokenizer
from sparkdeploy.vocab.validate import as_id_array


@dataclass
class CoverageResult:
    """Tokens counted, tokens off the list, miss rate, the most frequent missed tokens (id, count, text),
    and the off-list tokens per token class (han, word, punct...)."""

    tokens: int
    off_list: int
    top_missed: list[tuple[int, int, str]] = field(default_factory=list)
    missed_by_class: dict[str, int] = field(default_factory=dict)

    @property
    def miss_rate(self) -> float:
        return self.off_list / self.tokens if self.tokens else 0.0

    def to_dict(self) -> dict:
        return {"tokens": self.tokens, "off_list": self.off_list, "miss_rate": round(self.miss_rate, 6),
                "missed_by_class": self.missed_by_class,
                "top_missed": [{"id": i, "count": c, "text": t} for i, c, t in self.top_missed]}


def coverage_from_counts(ids, counts: np.ndarray, tokenizer: Tokenizer, top: int = 20) -> CoverageResult:
    arr = as_id_array(ids)
    on = np.zeros(tokenizer.vocab_size, dtype=bool)
    on[arr[(arr >= 0) & (arr < tokenizer.vocab_size)]] = True
    missed = np.where(on, 0, counts)
    total = int(counts.sum())
    off = int(missed.sum())
    order = np.argsort(-missed, kind="stable")[:top]
    top_missed = [(int(i), int(missed[i]), tokenizer.token_text(i)) for i in order if missed[i] > 0]
    by_class = np.bincount(token_classes(tokenizer), weights=missed, minlength=len(CLASSES))
    return CoverageResult(total, off, top_missed,
                          {c: int(n) for c, n in zip(CLASSES, by_class) if n})


def coverage(ids, tokenizer: Tokenizer, texts: Iterable[str], top: int = 20) -> CoverageResult:
    """Encode `texts` (an iterable of strings, e.g. corpus chunks) and measure how many tokens are off `ids`."""
    counts = count_ids(tokenizer, texts).counts
    return coverage_from_counts(ids, counts, tokenizer, top)
