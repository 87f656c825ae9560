"""List file formats and atomic writes.

  txt  one decimal id per line, sorted ascending (`#` comment lines allowed)
  npy  a 1-D integer numpy array of ids (saved as int64)
  d2t  EAGLE-3 draft-to-target offsets: `d2t[i] = ids[i] - i`, saved as `.d2t.npy` (what EAGLE-3 checkpoints
       carry to map a draft index back to a target id: target = i + d2t[i])

Reading is spark_overlays.vocab_list's (the format is defined there once, for the kit and the engine).

Every write goes to a temporary file in the same directory and is renamed into place, so a failed or
refused build never leaves a partial list behind.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
from spark_overlays import vocab_list
from spark_overlays._util import atomic_write_bytes

from sparkdeploy.errors import VocabError

FORMATS = ("txt", "npy", "d2t")


def format_for(path: str | os.PathLike) -> str:
    name = str(path)
    if name.endswith(".d2t.npy"):
        return "d2t"
    if name.endswith(".npy"):
        return "npy"
    return "txt"


def atomic_write_json(path: str | os.PathLike, obj: object) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=False) + "\n").encode())


def encode_list(ids: np.ndarray, fmt: str) -> bytes:
    ids = np.asarray(ids, dtype=np.int64)
    if fmt == "txt":
        return ("\n".join(map(str, ids.tolist())) + "\n").encode() if len(ids) else b""
    buf = io.BytesIO()
    if fmt == "npy":
        np.save(buf, ids)
    elif fmt == "d2t":
        np.save(buf, ids - np.arange(len(ids), dtype=np.int64))
    else:
        raise VocabError(f"unknown list format {fmt!r}: use one of {', '.join(FORMATS)}")
    return buf.getvalue()


def write_list(path: str | os.PathLike, ids: np.ndarray, fmt: str | None = None) -> Path:
    """Write ids (sorted as given) atomically in `fmt` (default: from the file name). Returns the path."""
    fmt = fmt or format_for(path)
    atomic_write_bytes(path, encode_list(ids, fmt))
    return Path(path)


def read_list(path: str | os.PathLike, vocab_size: int | None = None) -> np.ndarray:
    """Read a list in any of the formats (spark_overlays.vocab_list.FORMAT, the one reader the engine uses too)
    as a sorted int64 array, checked in [0, vocab_size) when given; VocabError names the file and line."""
    try:
        return vocab_list.read_ids(path, vocab_size)
    except vocab_list.VocabListError as err:
        raise VocabError(str(err)) from None


def list_bytes(path: str | os.PathLike) -> bytes:
    """A list file's bytes, bounded (vocab_list.MAX_LIST_BYTES): what is hashed and shipped to the nodes."""
    try:
        return vocab_list.read_bytes(path)
    except vocab_list.VocabListError as err:
        raise VocabError(str(err)) from None


def parse_list(data: bytes, where: str, vocab_size: int | None = None) -> np.ndarray:
    """Ids of a text list already in memory (a node's live list), by the same one reader."""
    try:
        return vocab_list.parse_text(data, where, vocab_size)
    except vocab_list.VocabListError as err:
        raise VocabError(str(err)) from None
