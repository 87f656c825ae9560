"""Selection: which ids a list holds, taken in priority order until the size (or coverage) is reached.

Parts, in order (each part only adds ids not already taken):
  1. cutoff    every id below `cutoff` (cheap for English/code; useless for CJK on Qwen3.5, whose Han
               tokens all have ids >= 95,726)
  2. core      the structural core (`classify.structural_core`): specials, EOS/control tags, bytes,
               whitespace, punctuation/operators, digits
  3. reserves  `han1=K`: the K single-Han-character tokens whose *character* is most frequent (a
               character's frequency sums every token that contains it, so characters learned inside
               words still count; text outside the corpus, verse or colloquial, falls back to them);
               `word=K`: common English words (ranked by lower-cased word over its ` word`/`Word`
               variants, all variants taken together)
  4. frequency the most frequent remaining tokens until `size` ids, or until the weighted coverage of the
               build corpus reaches `coverage`
  5. rank-fill only when the corpus saw fewer distinct tokens than `size`: the lowest remaining ids (a BPE
               id is its merge rank, a frequency prior from the tokenizer's own training text)

Several corpora (groups, e.g. `en`, `code`, `zh-Hans`) are weighted equally by default: each group's
counts are turned into frequencies before they are summed, so a 80M-token code corpus cannot drown a
4M-token Chinese one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from sparkdeploy.errors import VocabError
from sparkdeploy.vocab.classify import CLASSES, is_han, structural_core, token_classes
from sparkdeploy.vocab.tokenizer import Tokenizer

RESERVE_KINDS = ("han1", "word")


@dataclass
class Selection:
    """The chosen ids (sorted, unique, int64), ids added per part, and coverage of the build corpus."""

    ids: np.ndarray
    parts: dict[str, int]
    build_coverage: dict[str, float] = field(default_factory=dict)
    build_tokens: dict[str, int] = field(default_factory=dict)


def weighted_frequency(groups: Mapping[str, np.ndarray], weights: Mapping[str, float] | None = None) -> np.ndarray:
    """Sum of each group's relative frequencies times its weight (equal weights by default)."""
    score = None
    for name, counts in groups.items():
        total = counts.sum()
        if total == 0:
            continue
        w = (weights or {}).get(name, 1.0)
        part = counts.astype(np.float64) * (w / total)
        score = part if score is None else score + part
    if score is None:
        raise VocabError("empty corpus: no tokens were counted")
    return score


def _han_char_scores(tokenizer: Tokenizer, score: np.ndarray) -> list[tuple[float, int]]:
    """(character score, single-char token id) for every single-Han-character token, best first."""
    classes = token_classes(tokenizer)
    han = np.flatnonzero(classes == CLASSES.index("han"))
    char_score: dict[str, float] = {}
    single: dict[str, int] = {}
    for i in han:
        text = tokenizer.token_bytes(i).decode("utf-8", "replace")
        chars = [c for c in text if is_han(c)]
        s = float(score[i])
        if len(text) == 1 and chars:
            single[chars[0]] = int(i)
        if s:
            for c in chars:
                char_score[c] = char_score.get(c, 0.0) + s
    ranked = sorted(((char_score.get(c, 0.0), i) for c, i in single.items()), key=lambda t: (-t[0], t[1]))
    return [r for r in ranked if r[0] > 0]


def _word_groups(tokenizer: Tokenizer, score: np.ndarray) -> list[tuple[float, list[int]]]:
    """(score, variant ids) per lower-cased ASCII word over its ` word`, `word`, ` Word`, `Word` tokens."""
    classes = token_classes(tokenizer)
    words: dict[str, list[int]] = {}
    for i in np.flatnonzero(classes == CLASSES.index("word")):
        w = tokenizer.token_bytes(i).decode("ascii", "replace").lstrip(" ").lower()
        if len(w) >= 2:
            words.setdefault(w, []).append(int(i))
    ranked = [(float(score[ids].sum()), sorted(ids)) for ids in words.values()]
    ranked.sort(key=lambda t: (-t[0], t[1][0]))
    return [r for r in ranked if r[0] > 0]


def select(groups: Mapping[str, np.ndarray], tokenizer: Tokenizer, *, size: int | None = None,
           coverage: float | None = None, cutoff: int = 0, core: bool = True,
           reserve: Mapping[str, int] | None = None, weights: Mapping[str, float] | None = None) -> Selection:
    """Choose ids from per-group counts. See the module docstring for the order of parts.

    Raises VocabError when the corpus is empty, the size is smaller than the fixed parts, or neither a size
    nor a coverage target is given.
    """
    vocab = tokenizer.vocab_size
    if size is None and coverage is None:
        raise VocabError("give a size (--size) or a coverage target (--coverage), or both")
    if size is not None and size <= 0:
        raise VocabError(f"size must be positive, got {size}")
    if coverage is not None and not 0 < coverage <= 1:
        raise VocabError(f"coverage must be in (0, 1], got {coverage}")
    for name, counts in groups.items():
        if counts.shape != (vocab,):
            raise VocabError(f"counts of {name!r} have {counts.shape[0]} entries, tokenizer has {vocab}")
    score = weighted_frequency(groups, weights)
    limit = size if size is not None else vocab

    taken = np.zeros(vocab, dtype=bool)
    parts: dict[str, int] = {}

    def add(name: str, ids: np.ndarray) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        new = ids[~taken[ids]]
        taken[new] = True
        parts[name] = parts.get(name, 0) + int(len(new))

    if cutoff:
        add("cutoff", np.arange(min(cutoff, vocab)))
    if core:
        add("core", structural_core(tokenizer))
    else:
        add("core", tokenizer.required_ids)
    fixed = int(taken.sum())
    for kind, k in (reserve or {}).items():
        if kind not in RESERVE_KINDS:
            raise VocabError(f"unknown reserve {kind!r}: use one of {', '.join(RESERVE_KINDS)}")
        if k <= 0:
            continue
        chosen: list[int] = []
        if kind == "han1":
            for _, i in _han_char_scores(tokenizer, score):
                if not taken[i]:
                    chosen.append(i)
                    if len(chosen) >= k:
                        break
        else:
            for _, ids in _word_groups(tokenizer, score):
                fresh = [i for i in ids if not taken[i]]
                if len(chosen) + len(fresh) > k:
                    break
                chosen.extend(fresh)
        add(f"reserve:{kind}", np.array(chosen, dtype=np.int64))
    fixed = int(taken.sum())
    if fixed > limit:
        raise VocabError(f"size {limit} is smaller than the fixed parts ({fixed} ids: "
                         + ", ".join(f"{k} {v}" for k, v in parts.items()) + ")")

    order = np.argsort(-score, kind="stable")
    order = order[(score[order] > 0) & ~taken[order]]
    room = limit - fixed
    candidates = order[:room]
    if coverage is not None:
        covered = score[taken].sum() / score.sum()
        if covered >= coverage:
            candidates = candidates[:0]
        else:
            cum = covered + np.cumsum(score[candidates]) / score.sum()
            stop = int(np.searchsorted(cum, coverage, side="left")) + 1
            candidates = candidates[:stop]
    add("frequency", candidates)
    if size is not None and coverage is None and int(taken.sum()) < limit:
        # The corpus saw fewer distinct tokens than the size: fill with the lowest untaken ids. A BPE id is
        # its merge rank, so low ids are the tokens most frequent in the tokenizer's own training text.
        rest = np.flatnonzero(~taken)[: limit - int(taken.sum())]
        add("rank-fill", rest)

    ids = np.flatnonzero(taken).astype(np.int64)
    cov = {name: float(counts[ids].sum() / counts.sum()) if counts.sum() else 0.0 for name, counts in groups.items()}
    cov["weighted"] = float(score[ids].sum() / score.sum())
    return Selection(ids, parts, cov, {name: int(c.sum()) for name, c in groups.items()})
