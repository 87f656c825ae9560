"""List file formats and atomic writes.

  txt  one decimal id per line, sorted ascending (`#` comment lines allowed)
  npy  a 1-D integer numpy array of ids (saved as int64)
  d2t  EAGLE-3 draft-to-target offsets: `d2t[i] = ids[i] - i`, saved as `.d2t.npy` (what EAGLE-3 checkpoints
       carry to map a draft index back to a target id: target = i + d2t[i])

Every write goes to a temporary file in the same directory and is renamed into place, so a failed or
refused build never leaves a partial list behind.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path

import numpy as np

from sparkdeploy.errors import VocabError

FORMATS = ("txt", "npy", "d2t")


def format_for(path: str | os.PathLike) -> str:
    name = str(path)
    if name.endswith(".d2t.npy"):
        return "d2t"
    if name.endswith(".npy"):
        return "npy"
    return "txt"


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` via a temp file + rename (same directory, fsynced)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)  # mkstemp makes 0600; a list is ordinary data
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


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


def read_list(path: str | os.PathLike) -> np.ndarray:
    """Read a list (txt one id per line, `.npy` ids, `.d2t.npy` EAGLE-3 offsets) as an int64 array.

    Raises VocabError naming the file when it cannot be read or is not a list of integers. Order is kept
    as stored; `validate_list` checks sortedness and range.
    """
    p = Path(path)
    fmt = format_for(p)
    try:
        if fmt == "txt":
            ids = []
            for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
                s = line.strip()
                if not s or s.startswith("#"):
                    continue
                try:
                    ids.append(int(s))
                except ValueError:
                    raise VocabError(f"{p}:{n}: not an integer token id: {s[:40]!r}") from None
            return np.array(ids, dtype=np.int64)
        arr = np.load(p, allow_pickle=False)
    except OSError as err:
        raise VocabError(f"{p}: cannot read ({err.strerror or err})") from err
    except UnicodeDecodeError as err:
        raise VocabError(f"{p}: not a text list of ids (not UTF-8)") from err
    except ValueError as err:
        raise VocabError(f"{p}: not a numpy array of ids ({err})") from err
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise VocabError(f"{p}: expected a 1-D integer array, got shape {arr.shape} dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    if fmt == "d2t":
        arr = arr + np.arange(len(arr), dtype=np.int64)
    return arr
