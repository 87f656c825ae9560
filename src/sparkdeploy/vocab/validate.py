"""Validation: is this list usable with this tokenizer (and does it match its manifest)?"""

from __future__ import annotations

from typing import Any

import numpy as np

from sparkdeploy.errors import VocabError
from sparkdeploy.vocab.manifest import ids_sha256
from sparkdeploy.vocab.tokenizer import Tokenizer


def as_id_array(ids: Any, what: str = "list") -> np.ndarray:
    """A 1-D int64 array from a sequence of ints; VocabError for anything else (not a list, floats...)."""
    if isinstance(ids, (str, bytes, dict)) or ids is None:
        raise VocabError(f"{what}: not a list of token ids (got {type(ids).__name__})")
    try:
        arr = np.asarray(ids)
    except (ValueError, TypeError) as err:
        raise VocabError(f"{what}: not a list of token ids ({err})") from err
    if arr.ndim != 1:
        raise VocabError(f"{what}: not a flat list of token ids (shape {arr.shape})")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if np.issubdtype(arr.dtype, np.floating) and np.all(np.mod(arr, 1) == 0):
            arr = arr.astype(np.int64)
        else:
            raise VocabError(f"{what}: token ids must be integers (got {arr.dtype})")
    return arr.astype(np.int64)


def validate_list(ids: Any, tokenizer: Tokenizer, manifest: dict | None = None, *, what: str = "list") -> np.ndarray:
    """Check a list against a tokenizer; return it as a sorted int64 array, or raise VocabError.

    Checks: a flat integer list, not empty, strictly increasing (sorted, no duplicates), every id in
    [0, vocab_size), EOS and chat/tool/think control ids present; with a manifest, the tokenizer content
    hash and the size / ids hash recorded there match.
    """
    arr = as_id_array(ids, what)
    if arr.size == 0:
        raise VocabError(f"{what}: empty list")
    if manifest is not None:
        tok = manifest.get("tokenizer", {})
        want = tok.get("content_hash")
        if want != tokenizer.content_hash:
            raise VocabError(f"{what}: tokenizer hash mismatch: the manifest was built for {tok.get('name')!r} "
                             f"{want}, the tokenizer {tokenizer.name!r} is {tokenizer.content_hash}")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= tokenizer.vocab_size:
        bad = arr[(arr < 0) | (arr >= tokenizer.vocab_size)]
        raise VocabError(f"{what}: {len(bad)} ids out of range for {tokenizer.name!r} (vocab size "
                         f"{tokenizer.vocab_size}), e.g. {bad[:5].tolist()}")
    diffs = np.diff(arr)
    if np.any(diffs == 0):
        dup = arr[1:][diffs == 0]
        raise VocabError(f"{what}: {len(dup)} duplicate ids, e.g. {dup[:5].tolist()}")
    if np.any(diffs < 0):
        at = int(np.flatnonzero(diffs < 0)[0])
        raise VocabError(f"{what}: not sorted ascending (id {arr[at + 1]} follows {arr[at]} at line {at + 2})")
    missing = np.setdiff1d(tokenizer.required_ids, arr)
    if missing.size:
        names = ", ".join(f"{tokenizer.token_text(i)}={i}" for i in missing[:8])
        raise VocabError(f"{what}: missing EOS/control tokens the model emits: {names}")
    if manifest is not None:
        if "size" in manifest and int(manifest["size"]) != arr.size:
            raise VocabError(f"{what}: has {arr.size} ids, its manifest says {manifest['size']}")
        if "ids_sha256" in manifest and manifest["ids_sha256"] != ids_sha256(arr):
            raise VocabError(f"{what}: ids do not match the manifest's ids_sha256 (edited after build?)")
    return arr
