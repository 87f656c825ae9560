"""The shortlist head's fixed capacity and its live list swap, kept free of vLLM (CPU torch + numpy unit tests).

The head has CAPACITY rows for its whole life; a list of S <= CAPACITY ids fills the first S, the rest are
padding: zero weights, a ``-inf`` logit bias (so no argmax or sampler can pick them) and the target id of a
token that is not on the list (the "sink": the scatter writes ``-inf`` there anyway, so the padding's writes
cannot change it). A swap copies new values into the same tensors (``copy_``): shapes and addresses stay.

A swap reads the rank's share of the new rows from the checkpoint's full-precision head on disk: the
safetensors file is memory-mapped and only the listed rows are touched. ``LiveSwap`` decides when, in step
with the other tensor-parallel ranks, and reads in a background thread so no drafter call waits for the disk.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from . import vocab_list

_STORED = re.compile(r"^([0-9a-f]{64})\.txt$")  # a stored list version, named by its sha256 (vocab_live.py)
_DTYPES = {"BF16": (np.uint16, torch.bfloat16), "F16": (np.float16, torch.float16), "F32": (np.float32, torch.float32)}
_HEADER_MAX = 100 << 20  # a safetensors header beyond this is not one


def target_ids(ids: np.ndarray, capacity: int, vocab: int) -> np.ndarray:
    """``[capacity]`` target id of each head row: the list, then the sink (the smallest unlisted id) for padding."""
    if ids.size > capacity:
        raise vocab_list.VocabListError(f"list of {ids.size} ids exceeds the head's capacity {capacity} "
                                        "(spark_overlays.shortlist.capacity, fixed at start)")
    if capacity > vocab:
        raise vocab_list.VocabListError(f"capacity {capacity} exceeds the vocabulary size {vocab}")
    out = np.empty(capacity, dtype=np.int64)
    out[:ids.size] = ids
    if ids.size < capacity:
        gaps = np.flatnonzero(ids != np.arange(ids.size))  # ids are sorted and unique: the first gap is unlisted
        out[ids.size:] = int(gaps[0]) if gaps.size else ids.size
    return out


def local_bias(num_ids: int, start: int, local_rows: int, dtype: torch.dtype) -> torch.Tensor:
    """``[local_rows]`` logit bias of a rank whose shard begins at head row `start`: 0 on listed rows, -inf on
    padding (ours and vLLM's own rounding to 64)."""
    bias = torch.full((local_rows,), float("-inf"), dtype=dtype)
    bias[:max(0, min(local_rows, num_ids - start))] = 0
    return bias


def share(ids: np.ndarray, start: int, end: int) -> np.ndarray:
    """The ids whose rows this rank holds (head rows ``[start, end)``)."""
    return ids[min(start, ids.size):min(end, ids.size)]


@dataclass(frozen=True)
class HeadTensors:
    """The live tensors of one rank's head (the module's own parameters and buffers)."""

    weight: torch.Tensor  # [local_rows, hidden]: this rank's shard
    bias: torch.Tensor  # [local_rows]
    target_ids: torch.Tensor  # [capacity]: scatter map
    d2t: torch.Tensor  # [capacity]: target = row + d2t[row]
    start: int  # head row of this shard's first row


def install(head: HeadTensors, ids: np.ndarray, rows: torch.Tensor, vocab: int) -> None:
    """Put a list into the head in place: `rows` are the full-head rows of ``share(ids, ...)`` for this rank."""
    capacity, local_rows = head.target_ids.numel(), head.weight.shape[0]
    tids = target_ids(ids, capacity, vocab)
    k = rows.shape[0]
    if k != len(share(ids, head.start, head.start + local_rows)) or rows.shape[1:] != head.weight.shape[1:]:
        raise ValueError(f"rows {tuple(rows.shape)} do not fit this shard ({k} of {ids.size} ids, "
                         f"head {tuple(head.weight.shape)} from row {head.start})")
    with torch.no_grad():
        head.weight[:k].copy_(rows)
        head.weight[k:].zero_()
        head.bias.copy_(local_bias(ids.size, head.start, local_rows, head.bias.dtype))
        head.target_ids.copy_(torch.from_numpy(tids))
        head.d2t.copy_(torch.from_numpy(vocab_list.d2t_offsets(tids)))


# ---------------------------------------------------------------------------------------------- checkpoint rows
@dataclass(frozen=True)
class CheckpointTensor:
    """Where one tensor's bytes lie in a safetensors file."""

    file: Path
    offset: int
    dtype: str
    shape: tuple[int, ...]

    def rows(self, ids: np.ndarray) -> torch.Tensor:
        """Rows `ids` of a 2-D tensor, read through a memory map (only their pages are touched)."""
        np_dtype, torch_dtype = _DTYPES[self.dtype]
        mm = np.memmap(self.file, dtype=np_dtype, mode="r", offset=self.offset, shape=self.shape)
        return torch.from_numpy(np.ascontiguousarray(mm[ids])).view(torch_dtype)


def _header(file: Path) -> tuple[dict, int]:
    with file.open("rb") as fh:
        (size,) = struct.unpack("<Q", fh.read(8))
        if size > _HEADER_MAX:
            raise OSError(f"{file}: not a safetensors file (header of {size} bytes)")
        return json.loads(fh.read(size)), 8 + size


def find_tensor(model_dir: str | os.PathLike, name: str) -> CheckpointTensor:
    """The safetensors tensor `name` under `model_dir` (through ``model.safetensors.index.json`` when present)."""
    root = Path(model_dir)
    index = root / "model.safetensors.index.json"
    weight_map = json.loads(index.read_text()).get("weight_map", {}) if index.is_file() else {}
    files = [root / weight_map[name]] if name in weight_map else sorted(root.glob("*.safetensors"))
    for file in files:
        header, base = _header(file)
        meta = header.get(name)
        if meta is None:
            continue
        if meta["dtype"] not in _DTYPES or len(meta["shape"]) != 2:
            raise OSError(f"{file}: {name} is {meta['dtype']} {meta['shape']}, not a full-precision [V, H] head")
        return CheckpointTensor(file, base + meta["data_offsets"][0], meta["dtype"], tuple(meta["shape"]))
    raise OSError(f"{root}: no safetensors file holds {name}")


# ---------------------------------------------------------------------------------------------- the list pointer
def pointer_identity(path: str | os.PathLike) -> str:
    """What the list pointer names now, cheaply: a symlink's target name, else the file's inode, size and mtime
    ("" when it is missing)."""
    try:
        return "link:" + os.readlink(path)
    except OSError:
        pass
    try:
        st = os.stat(path)
    except OSError:
        return ""
    return f"file:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


def identity_key(identity: str) -> int:
    """A 60-bit integer of an identity, for comparing it across TP ranks."""
    return int(hashlib.sha256(identity.encode()).hexdigest()[:15], 16)


@dataclass(frozen=True)
class Candidate:
    """A new list, checked and with this rank's rows in memory, ready to install."""

    ids: np.ndarray
    sha256: str
    rows: torch.Tensor


def prepare(pointer: str | os.PathLike, identity: str, *, vocab: int, required, capacity: int, start: int,
            end: int, source: CheckpointTensor) -> Candidate:
    """Read and check the list the pointer names (ids in range, sorted, unique, required ids present, size <=
    capacity, bytes hashing to the sha256 in the stored file's name) and this rank's rows of it. Raises
    VocabListError or OSError with the reason; nothing is changed."""
    file = Path(pointer)
    expected = None
    if identity.startswith("link:"):
        target = identity[len("link:"):]
        file = file.parent / target  # the file the pointer named when looked at, even if it moves on meanwhile
        stored = _STORED.match(Path(target).name)
        expected = stored.group(1) if stored else None
    data = vocab_list.read_bytes(file)
    sha = hashlib.sha256(data).hexdigest()
    if expected is not None and sha != expected:
        raise vocab_list.VocabListError(f"{file}: sha256 {sha} does not match the {expected} in its name")
    ids = vocab_list.read_ids(file, vocab) if file.suffix == ".npy" else vocab_list.parse_text(data, str(file), vocab)
    vocab_list.validate(ids, vocab, required, where=str(file))
    target_ids(ids, capacity, vocab)  # size and capacity
    if source.shape[0] != vocab:
        raise OSError(f"{source.file}: the head has {source.shape[0]} rows, the vocabulary {vocab}")
    return Candidate(ids, sha, source.rows(share(ids, start, end)))


class LiveSwap:
    """When a running head takes a new list. ``step()`` runs at every drafter call; every ``every``-th call (the
    same call on every TP rank: the ranks draft in lockstep) it looks at the pointer and, in step with the other
    ranks through `same` (all ranks pass the same value) and `agree` (all ranks say True):

    * no list in preparation: when every rank sees the same pointer, naming neither the served list nor the one
      last refused, each starts `prepare(identity)` (read, check, read its rows) in a background thread;
    * a list in preparation: once every rank has finished, either every rank succeeded and all `install` it
      (between the same two drafter calls), or none does and all keep the old list and `report` why.

    The collectives are called in the same order on every rank, whatever each rank saw, so they always pair up.
    """

    def __init__(self, pointer: str | os.PathLike, every: int, identity: str, sha256: str, *,
                 prepare: Callable[[str], Candidate], install: Callable[[Candidate], None],
                 report: Callable[[str, str], None], agree: Callable[[bool], bool] = lambda ok: ok,
                 same: Callable[[int], bool] = lambda value: True):
        self.pointer, self.every = pointer, every
        self.served = (identity, sha256)  # the pointer identity and sha256 of the list in the head
        self.rejected = ""  # the pointer identity of the last list the ranks refused: not tried again
        self.pending: tuple[str, Future] | None = None
        self._prepare, self._install, self._report, self._agree, self._same = prepare, install, report, agree, same
        self._calls = 0
        self._pool: ThreadPoolExecutor | None = None

    def step(self) -> None:
        if not self.every:
            return
        self._calls += 1
        if self._calls % self.every:
            return
        identity = pointer_identity(self.pointer)
        all_see_it = self._same(identity_key(identity))
        if self.pending is not None:
            self._finish()
        elif all_see_it and identity not in (self.served[0], self.rejected):
            self._pool = self._pool or ThreadPoolExecutor(1, thread_name_prefix="spark-shortlist-swap")
            self.pending = (identity, self._pool.submit(self._prepare, identity))

    def _finish(self) -> None:
        identity, future = self.pending
        if not self._agree(future.done()):
            return  # a rank is still reading: look again at the next check
        self.pending = None
        error = future.exception()
        if not self._agree(error is None):
            self.rejected = identity
            self._report("keeps", str(error) if error else "another tensor-parallel rank could not take the new list")
            return
        candidate = future.result()
        self._install(candidate)
        self.served, self.rejected = (identity, candidate.sha256), ""
        self._report("swapped; serves", "")
