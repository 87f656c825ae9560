"""The draft vocabulary list: load, verify, d2t offsets, TP split (pure Python + numpy; no vllm/torch).

A list is a file of token ids for one tokenizer: one id per line (``.txt``; blank lines and ``#``
comments ignored) or a 1-D integer ``.npy``. It must be strictly increasing (sorted, no duplicates),
inside ``[0, vocab_size)``, and contain every required id (EOS, stop and special tokens).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

# vLLM pads every vocab-parallel embedding to a multiple of this (vocab_parallel_embedding.DEFAULT_VOCAB_PADDING_SIZE)
VOCAB_PADDING = 64


class VocabListError(ValueError):
    """A list that must not be used; the message names the file and the problem."""


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_ids(path: str | Path) -> np.ndarray:
    p = Path(path)
    if not p.is_file():
        raise VocabListError(f"{p}: no such file")
    if p.suffix == ".npy":
        arr = np.load(p, allow_pickle=False)
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
            raise VocabListError(f"{p}: .npy must be a 1-D integer array, got {arr.dtype} {arr.shape}")
        return arr.astype(np.int64)
    ids = []
    for n, line in enumerate(p.read_text().splitlines(), 1):
        s = line.split("#", 1)[0].strip()
        if not s:
            continue
        try:
            ids.append(int(s))
        except ValueError:
            raise VocabListError(f"{p}:{n}: not an integer: {s!r}") from None
    return np.asarray(ids, dtype=np.int64)


def validate(ids: np.ndarray, vocab_size: int, required: list[int] | tuple[int, ...] = (), where: str = "list") -> None:
    if ids.size == 0:
        raise VocabListError(f"{where}: empty")
    if np.any(np.diff(ids) <= 0):
        bad = int(np.argmax(np.diff(ids) <= 0))
        raise VocabListError(f"{where}: not strictly increasing at position {bad + 1} ({ids[bad]} then {ids[bad + 1]}); "
                             "sort and de-duplicate it")
    if ids[0] < 0 or ids[-1] >= vocab_size:
        raise VocabListError(f"{where}: ids must lie in [0, {vocab_size}); found {int(ids[0])}..{int(ids[-1])}")
    missing = sorted(set(int(r) for r in required) - set(ids.tolist()))
    if missing:
        raise VocabListError(f"{where}: required ids missing (EOS/stop/special tokens): {missing[:10]}")
    if ids.size > vocab_size:
        raise VocabListError(f"{where}: longer than the vocabulary")


def load(path: str | Path, vocab_size: int, required=(), sha256: str | None = None) -> np.ndarray:
    """Read, hash-check and validate a list; return sorted int64 ids."""
    if sha256 is not None:
        got = file_sha256(path)
        if got.lower() != sha256.lower():
            raise VocabListError(f"{path}: sha256 {got} does not match the configured {sha256}")
    ids = read_ids(path)
    validate(ids, vocab_size, required, where=str(path))
    return ids


def special_ids_from_tokenizer_dir(directory: str | Path) -> list[int]:
    """Ids of the added/special tokens in ``tokenizer.json`` (empty if the file is absent)."""
    tj = Path(directory) / "tokenizer.json"
    if not tj.is_file():
        return []
    try:
        data = json.loads(tj.read_text())
    except (OSError, json.JSONDecodeError):
        return []
    return sorted({int(t["id"]) for t in data.get("added_tokens", []) if t.get("special", True)})


def d2t_offsets(ids: np.ndarray) -> np.ndarray:
    """EAGLE-3 form: ``target_id = draft_idx + d2t[draft_idx]``."""
    return ids - np.arange(ids.size, dtype=np.int64)


def d2t_to_ids(d2t: np.ndarray) -> np.ndarray:
    return d2t + np.arange(d2t.size, dtype=np.int64)


def padded_size(num_rows: int, tp_size: int, padding: int = VOCAB_PADDING) -> int:
    """vLLM's ``pad_vocab_size``: the head's row count rounded up to ``padding`` (per-rank split is then even)."""
    del tp_size  # vLLM pads to the padding multiple; the padding is chosen so TP sizes divide it
    return (num_rows + padding - 1) // padding * padding


def tp_ranges(num_rows: int, tp_size: int, padding: int = VOCAB_PADDING) -> list[tuple[int, int]]:
    """Per-rank ``[start, end)`` of real (unpadded) list positions, as VocabParallelEmbedding splits them."""
    padded = padded_size(num_rows, tp_size, padding)
    if padded % tp_size:
        raise VocabListError(f"padded size {padded} not divisible by TP {tp_size}")
    per = padded // tp_size
    return [(min(r * per, num_rows), min((r + 1) * per, num_rows)) for r in range(tp_size)]
