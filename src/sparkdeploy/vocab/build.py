"""Build: count corpora (grouped by content type), select ids, write the list and its manifest atomically.

Nothing is written unless every corpus was read, at least one token was counted and the selection fits.
"""

from __future__ import annotations

import datetime as _dt
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping

import numpy as np

from sparkdeploy.errors import VocabError
from sparkdeploy.vocab.corpus import CorpusStats, expand_paths, iter_chunks
from sparkdeploy.vocab.count import count_ids
from sparkdeploy.vocab.formats import format_for, write_list
from sparkdeploy.vocab.manifest import MANIFEST_FORMAT, ids_sha256, manifest_path_for, write_manifest
from sparkdeploy.vocab.select import Selection, select
from sparkdeploy.vocab.tokenizer import Tokenizer


@dataclass
class GroupCounts:
    counts: np.ndarray
    tokens: int
    stats: CorpusStats


def count_corpus(tokenizer: Tokenizer, paths: Iterable[str | os.PathLike], *, include: Iterable[str] = (),
                 jsonl: bool | None = None, text_field: str = "text",
                 progress: Callable[[int, int], None] | None = None) -> GroupCounts:
    """Count the tokens of files/dirs/`-`; VocabError if a path is missing or nothing is counted."""
    paths = list(paths)
    expand_paths(paths, include)  # fail on a missing path before reading anything
    stats = CorpusStats()
    c = count_ids(tokenizer, iter_chunks(paths, stats=stats, include=include, jsonl=jsonl, text_field=text_field),
                  progress=progress)
    if c.tokens == 0:
        raise VocabError(f"empty corpus: no text in {', '.join(map(str, paths)) or 'no paths'}"
                         f" ({stats.files} files, {stats.bytes} bytes)")
    return GroupCounts(c.counts, c.tokens, stats)


def parse_group(arg: str) -> tuple[str, str]:
    """`NAME=PATH` -> (NAME, PATH); a bare PATH goes to group `corpus`."""
    if "=" in arg and not Path(arg).exists():
        name, path = arg.split("=", 1)
        if name and "/" not in name:
            return name, path
    return "corpus", arg


def make_manifest(name: str, out: Path, ids: np.ndarray, tokenizer: Tokenizer, sel: Selection,
                  groups: Mapping[str, GroupCounts], settings: dict, sources: list | None = None) -> dict:
    return {
        "format": MANIFEST_FORMAT,
        "name": name,
        "file": out.name,
        "list_format": format_for(out),
        "size": int(len(ids)),
        "ids_sha256": ids_sha256(ids),
        "tokenizer": {"name": tokenizer.name, "content_hash": tokenizer.content_hash,
                      "vocab_size": tokenizer.vocab_size, "eos_ids": [int(i) for i in tokenizer.eos_ids]},
        "parts": sel.parts,
        "settings": settings,
        "sources": sources or [{"group": g, "description": ", ".join(sorted(set(gc.stats.invalid_by_file)))
                                or f"{gc.stats.files} files"} for g, gc in groups.items()],
        "build": {
            "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "groups": {g: {"tokens": gc.tokens, **gc.stats.to_dict()} for g, gc in groups.items()},
            "coverage": {k: round(v, 6) for k, v in sel.build_coverage.items()},
        },
    }


def build_list(tokenizer: Tokenizer, groups: Mapping[str, GroupCounts], out: str | os.PathLike, *,
               size: int | None, coverage: float | None = None, cutoff: int = 0,
               reserve: Mapping[str, int] | None = None, weights: Mapping[str, float] | None = None,
               fmt: str | None = None, name: str | None = None, sources: list | None = None,
               extra: dict | None = None) -> dict:
    """Select from counted groups and write `out` + its manifest (both atomically); return the manifest."""
    if not groups:
        raise VocabError("empty corpus: no corpus given")
    sel = select({g: gc.counts for g, gc in groups.items()}, tokenizer, size=size, coverage=coverage,
                 cutoff=cutoff, reserve=reserve, weights=weights)
    out = Path(out)
    name = name or manifest_path_for(out).name.removesuffix(".manifest.json")
    settings = {"size": size, "coverage": coverage, "cutoff": cutoff, "reserve": dict(reserve or {}),
                "weights": dict(weights or {}) or "equal per group"}
    manifest = make_manifest(name, out, sel.ids, tokenizer, sel, groups, settings, sources)
    if extra:
        manifest.update(extra)
    write_list(out, sel.ids, fmt)
    write_manifest(out, manifest)
    return manifest
