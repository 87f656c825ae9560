"""Learn: a draft list from the serving engine's own traffic (counts captured by `spark_overlays.capture`).

The new list is the current list, plus the structural core, plus the captured ids most often emitted that are
not on it yet, until the list holds `size` ids or covers `coverage` of the captured tokens. Nothing is dropped
(the seed's union: 47,149 + 5,606 new = 52,755), so the list can only lower the miss rate on any text; the
rollout then proves that the output is unchanged.

The miss rate is measured on the captured traffic itself: the share of captured tokens whose id is off the
list. Counts hold ids only, so "per category" is per token class (han, word, punct...), not per prompt.
Counts past the tokenizer's last id (the padding rows of a model's head) are reported, never listed.
"""

from __future__ import annotations

import datetime as _dt
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from spark_overlays import capture

from sparkdeploy.errors import VocabError
from sparkdeploy.vocab.classify import CLASSES, structural_core, token_classes
from sparkdeploy.vocab.coverage import CoverageResult, coverage_from_counts
from sparkdeploy.vocab.formats import format_for
from sparkdeploy.vocab.manifest import MANIFEST_FORMAT, ids_sha256
from sparkdeploy.vocab.tokenizer import Tokenizer
from sparkdeploy.vocab.validate import as_id_array


@dataclass
class Captured:
    """Summed counts per tokenizer id, tokens per file, tokens whose id the tokenizer lacks."""

    counts: np.ndarray
    files: list[dict]
    outside: int = 0

    @property
    def tokens(self) -> int:
        return int(self.counts.sum())


def read_captured(paths, tokenizer: Tokenizer) -> Captured:
    """Sum counts files (one per node or engine); VocabError naming the file that is not one or does not fit."""
    paths = [Path(p) for p in paths]
    if not paths:
        raise VocabError("no counts files given")
    total, files = None, []
    for p in paths:
        try:
            arr = capture.read_counts(p)
        except capture.CountsError as err:
            raise VocabError(str(err)) from None
        if arr.shape[0] < tokenizer.vocab_size:
            raise VocabError(f"{p}: holds counts for {arr.shape[0]} ids, the tokenizer {tokenizer.name!r} has "
                             f"{tokenizer.vocab_size}: captured from another model?")
        if total is not None and arr.shape != total.shape:
            raise VocabError(f"{p}: holds counts for {arr.shape[0]} ids, {paths[0]} for {total.shape[0]}: "
                             "counts of different models")
        total = arr if total is None else total + arr
        files.append({"file": str(p), "tokens": int(arr.sum())})
    captured = Captured(total[: tokenizer.vocab_size].copy(), files, int(total[tokenizer.vocab_size:].sum()))
    if captured.tokens == 0:
        raise VocabError(", ".join(map(str, paths)) + ": no tokens captured (is capture on, and has it served?)")
    return captured


@dataclass
class Learned:
    """The new list, what each part added, the miss rate on the captured traffic before and after."""

    ids: np.ndarray
    parts: dict[str, int]
    before: CoverageResult
    after: CoverageResult
    by_class: dict[str, dict] = field(default_factory=dict)
    top_added: list[tuple[int, int, str]] = field(default_factory=list)


def learn(current, captured: Captured, tokenizer: Tokenizer, *, size: int | None = None,
          coverage: float | None = None, min_count: int = 1) -> Learned:
    """Union of the current list, the structural core and the most frequent captured ids (see the module doc)."""
    if size is None and coverage is None:
        raise VocabError("give a size (--size) or a coverage target (--coverage), or both")
    if coverage is not None and not 0 < coverage <= 1:
        raise VocabError(f"coverage must be in (0, 1], got {coverage}")
    if min_count < 1:
        raise VocabError(f"min count must be at least 1, got {min_count}")
    cur = np.unique(as_id_array(current, "current list"))
    if cur.size and (cur[0] < 0 or cur[-1] >= tokenizer.vocab_size):
        raise VocabError(f"current list: ids out of range for {tokenizer.name!r} (vocab size {tokenizer.vocab_size})")
    counts = captured.counts
    on = np.zeros(tokenizer.vocab_size, dtype=bool)
    on[cur] = True
    core = structural_core(tokenizer)
    core_new = int((~on[core]).sum())
    on[core] = True
    kept = int(on.sum())
    if size is not None and size < kept:
        raise VocabError(f"size {size} is smaller than the current list and the structural core ({kept} ids); "
                         "learning only adds ids")
    order = np.argsort(-counts, kind="stable")
    order = order[(counts[order] >= min_count) & ~on[order]]
    if size is not None:
        order = order[: size - kept]
    if coverage is not None:
        total = counts.sum()
        covered = counts[on].sum() / total
        if covered >= coverage:
            order = order[:0]
        else:
            cum = covered + np.cumsum(counts[order]) / total
            order = order[: int(np.searchsorted(cum, coverage, side="left")) + 1]
    on[order] = True
    ids = np.flatnonzero(on).astype(np.int64)
    before = coverage_from_counts(cur, counts, tokenizer)
    after = coverage_from_counts(ids, counts, tokenizer)
    per_class = np.bincount(token_classes(tokenizer), weights=counts, minlength=len(CLASSES))
    by_class = {c: {"tokens": int(n), "miss_before": round(before.missed_by_class.get(c, 0) / n, 6),
                    "miss_after": round(after.missed_by_class.get(c, 0) / n, 6)}
                for c, n in zip(CLASSES, per_class) if n}
    top = [(int(i), int(counts[i]), tokenizer.token_text(int(i))) for i in order[:10]]
    return Learned(ids, {"current": int(cur.size), "core": core_new, "learned": int(order.size)}, before, after,
                   by_class, top)


def make_manifest(out: str | os.PathLike, learned: Learned, captured: Captured, tokenizer: Tokenizer, *,
                  current: str, settings: dict) -> dict:
    """The manifest `vocab rollout` reads (tokenizer hash, size, ids hash) plus where the ids came from."""
    out = Path(out)
    return {
        "format": MANIFEST_FORMAT,
        "name": out.name.removesuffix(".d2t.npy").removesuffix(".npy").removesuffix(".txt"),
        "file": out.name,
        "list_format": format_for(out),
        "size": int(len(learned.ids)),
        "ids_sha256": ids_sha256(learned.ids),
        "tokenizer": {"name": tokenizer.name, "content_hash": tokenizer.content_hash,
                      "vocab_size": tokenizer.vocab_size, "eos_ids": [int(i) for i in tokenizer.eos_ids]},
        "parts": learned.parts,
        "settings": settings,
        "sources": [{"group": "captured", "description": "token-id counts of the served traffic (no text)"}],
        "learned": {
            "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "from_list": current,
            "counts": captured.files,
            "tokens": captured.tokens,
            "outside_tokenizer": captured.outside,
            "miss_rate": {"before": round(learned.before.miss_rate, 6), "after": round(learned.after.miss_rate, 6)},
            "by_class": learned.by_class,
        },
    }
