"""The draft vocabulary list: the one reader of list files, verify, d2t offsets, TP split (pure Python + numpy;
no vllm/torch, so the engine image imports it without sparkdeploy; the kit imports it from here).

The list format (FORMAT below; docs/vocab-rollout.md "List format") is decided here once, for every reader:
the inventory loader, `vocab validate`, `vocab rollout` and the engine's overlay.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from pathlib import Path

import numpy as np

# vLLM pads every vocab-parallel embedding to a multiple of this (vocab_parallel_embedding.DEFAULT_VOCAB_PADDING_SIZE)
VOCAB_PADDING = 64

FORMAT = """\
A draft vocabulary list is a file of token ids for one tokenizer, sorted ascending, each id once:
  .txt      UTF-8 text, one id per line in ASCII decimal digits (0-9, at most 10 digits; no sign, no `+`,
            nothing else on the line). Spaces, tabs and a CR around the id are ignored; blank lines and lines
            whose first non-blank character is `#` are skipped. No inline comments, no JSON arrays.
  .npy      a 1-D integer numpy array of ids.
  .d2t.npy  EAGLE-3 draft-to-target offsets, d2t[i] = ids[i] - i.
At most MAX_LIST_BYTES are read; ids lie in [0, vocab size of the tokenizer)."""

MAX_LIST_BYTES = 32 << 20  # a 2^22-id list in text is ~30 MB; real ones are 0.3-2 MB
_ID = re.compile(r"[0-9]{1,10}")
_QUOTE = 40  # characters of a bad line quoted in a message


class VocabListError(ValueError):
    """A list that must not be used; the message names the file (and line) and the problem."""


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(read_bytes(path)).hexdigest()


def read_bytes(path: str | Path) -> bytes:
    """The bytes of a list file, at most MAX_LIST_BYTES (a device, FIFO or huge file is refused, not read)."""
    p = Path(path)
    try:
        if not p.is_file():
            raise VocabListError(f"{p}: " + ("not a regular file" if p.exists() else "cannot read (no such file)"))
        with p.open("rb") as fh:
            data = fh.read(MAX_LIST_BYTES + 1)
    except OSError as err:
        raise VocabListError(f"{p}: cannot read ({err.strerror or err})") from None
    if len(data) > MAX_LIST_BYTES:
        raise VocabListError(f"{p}: larger than {MAX_LIST_BYTES >> 20} MiB; not a vocabulary list")
    return data


def parse_text(data: bytes, where: str, vocab_size: int | None = None) -> np.ndarray:
    """Ids of a ``.txt`` list (FORMAT), checked sorted, unique and (given a vocab size) in range."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[:err.start].count(b"\n") + 1
        raise VocabListError(f"{where}, line {line}: not UTF-8 text; a list holds one id per line") from None
    ids, lines = [], []
    for n, line in enumerate(text.split("\n"), 1):
        s = line.strip(" \t\r")
        if not s or s.startswith("#"):
            continue
        if not _ID.fullmatch(s):
            raise VocabListError(f"{where}, line {n}: not a list of token ids: {s[:_QUOTE]!r} is not an id (one id "
                                 "per line, ASCII digits 0-9, at most 10)")
        ids.append(int(s))
        lines.append(n)
    arr = np.asarray(ids, dtype=np.int64)
    check_ids(arr, where, vocab_size, lines)
    return arr


def read_ids(path: str | Path, vocab_size: int | None = None) -> np.ndarray:
    """Ids of a list file in any FORMAT (by suffix), checked sorted, unique and (given a vocab size) in range."""
    p = Path(path)
    data = read_bytes(p)
    if p.suffix != ".npy":
        return parse_text(data, str(p), vocab_size)
    try:
        arr = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        raise VocabListError(f"{p}: not a numpy array of ids ({str(err)[:200]})") from None
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise VocabListError(f"{p}: .npy must be a 1-D integer array, got {arr.dtype} {arr.shape}")
    if arr.size and np.issubdtype(arr.dtype, np.unsignedinteger) and arr.max() > np.iinfo(np.int64).max:
        raise VocabListError(f"{p}: ids beyond int64")
    arr = arr.astype(np.int64)
    if p.name.endswith(".d2t.npy"):
        arr = d2t_to_ids(arr)
    check_ids(arr, str(p), vocab_size)
    return arr


def check_ids(ids: np.ndarray, where: str, vocab_size: int | None = None, lines: list[int] | None = None) -> None:
    """Sorted ascending, each id once, none negative, and below `vocab_size` when given; the message names
    the line (text) or entry (npy) of the first offender."""
    def at(i: int) -> str:
        return f"line {lines[i]}" if lines is not None else f"entry {i + 1}"

    if not ids.size:
        return
    bad = np.flatnonzero(np.diff(ids) <= 0)
    if bad.size:
        i = int(bad[0]) + 1
        what = "duplicate id" if ids[i] == ids[i - 1] else "not sorted ascending"
        raise VocabListError(f"{where}: {what} at {at(i)}: {int(ids[i])} follows {int(ids[i - 1])}; a list holds "
                             "each id once, in ascending order")
    out = np.flatnonzero((ids < 0) | (ids >= (vocab_size if vocab_size is not None else np.iinfo(np.int64).max)))
    if out.size:
        i = int(out[0])
        allowed = f"[0, {vocab_size}) (the vocabulary size)" if vocab_size is not None else ">= 0"
        raise VocabListError(f"{where}: id {int(ids[i])} at {at(i)} is out of range: ids lie in {allowed}")


def validate(ids: np.ndarray, vocab_size: int, required: list[int] | tuple[int, ...] = (), where: str = "list") -> None:
    if ids.size == 0:
        raise VocabListError(f"{where}: empty")
    check_ids(ids, where, vocab_size)
    missing = sorted(set(int(r) for r in required) - set(ids.tolist()))
    if missing:
        raise VocabListError(f"{where}: required ids missing (EOS/stop/special tokens): {missing[:10]}")


def load(path: str | Path, vocab_size: int, required=(), sha256: str | None = None) -> np.ndarray:
    """Read, hash-check and validate a list; return sorted int64 ids."""
    if sha256 is not None:
        got = file_sha256(path)
        if got.lower() != sha256.lower():
            raise VocabListError(f"{path}: sha256 {got} does not match the configured {sha256}")
    ids = read_ids(path, vocab_size)  # a bad id is named by its line
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


def rows_per_rank(num_rows: int, tp_size: int, padding: int = VOCAB_PADDING) -> int:
    """Rows (padding included) each TP rank's slice of the head holds: VocabParallelEmbedding divides the padded
    size evenly (vLLM's ``divide`` refuses a TP size that does not divide it, and so does this)."""
    padded = padded_size(num_rows, tp_size, padding)
    if padded % tp_size:
        raise VocabListError(f"padded size {padded} not divisible by TP {tp_size}")
    return padded // tp_size


def tp_ranges(num_rows: int, tp_size: int, padding: int = VOCAB_PADDING) -> list[tuple[int, int]]:
    """Per-rank ``[start, end)`` of real (unpadded) list positions, as VocabParallelEmbedding splits them."""
    per = rows_per_rank(num_rows, tp_size, padding)
    return [(min(r * per, num_rows), min((r + 1) * per, num_rows)) for r in range(tp_size)]
