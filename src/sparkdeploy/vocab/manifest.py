"""Per-list manifests and the `vocabs/manifest.json` index.

A list `NAME.txt` (or `NAME.npy`, `NAME.d2t.npy`) has its manifest beside it as `NAME.manifest.json`:

  {"format": 1, "name": ..., "file": "NAME.txt", "size": N, "ids_sha256": ...,
   "tokenizer": {"name", "content_hash", "vocab_size", "eos_ids"},
   "parts": {"cutoff": .., "core": .., "reserve:han1": .., "frequency": ..},
   "sources": [{"group", "description", "license"}...], "build": {corpus stats, tokens per group,
   coverage per group}, "heldout": {group: miss rate}, "independent": {group: miss rate}}

The index `vocabs/manifest.json` names the shipped lists and which one the default profile uses:
  {"default": "NAME", "lists": {"NAME": {"file": ..., "manifest": ..., "size": .., "tokenizer": ..}}}
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from sparkdeploy.errors import VocabError
from sparkdeploy.vocab.formats import atomic_write_json

MANIFEST_FORMAT = 1


def manifest_path_for(list_path: str | os.PathLike) -> Path:
    p = Path(list_path)
    name = p.name
    for suffix in (".d2t.npy", ".npy", ".txt"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return p.with_name(name + ".manifest.json")


def ids_sha256(ids: np.ndarray) -> str:
    """Hash of the sorted ids as text, the same for every file format."""
    text = "\n".join(map(str, np.asarray(ids, dtype=np.int64).tolist())) + "\n"
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def read_manifest(path: str | os.PathLike) -> dict:
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as err:
        raise VocabError(f"{p}: cannot read manifest ({err.strerror or err})") from err
    except (ValueError, UnicodeDecodeError) as err:
        raise VocabError(f"{p}: manifest is not valid JSON ({err})") from err
    if not isinstance(data, dict) or "tokenizer" not in data:
        raise VocabError(f"{p}: not a vocab manifest (no 'tokenizer' field)")
    return data


def find_manifest(list_path: str | os.PathLike) -> dict | None:
    p = manifest_path_for(list_path)
    return read_manifest(p) if p.is_file() else None


def write_manifest(list_path: str | os.PathLike, manifest: dict) -> Path:
    p = manifest_path_for(list_path)
    atomic_write_json(p, manifest)
    return p


def read_index(vocabs_dir: str | os.PathLike) -> dict:
    p = Path(vocabs_dir) / "manifest.json"
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as err:
        raise VocabError(f"{p}: cannot read ({err.strerror or err})") from err
    except ValueError as err:
        raise VocabError(f"{p}: not valid JSON ({err})") from err
    if not isinstance(data, dict) or "default" not in data or data["default"] not in data.get("lists", {}):
        raise VocabError(f"{p}: needs a 'default' key naming one of its 'lists'")
    return data


def resolve_list(name_or_path: str, vocabs_dir: str | os.PathLike | None = None) -> Path:
    """A path as given, or a shipped list's name (`default` too) looked up in `vocabs/manifest.json`."""
    p = Path(name_or_path)
    try:
        if p.exists():
            return p
    except OSError as err:  # a name too long for the file system, a path through a file
        raise VocabError(f"{name_or_path[:60]}...: {err.strerror or err}") from None
    if vocabs_dir is None:
        try:
            from sparkdeploy.paths import vocabs_dir as _vd

            vocabs_dir = _vd()
        except Exception:  # noqa: BLE001 - no checkout: only paths work
            raise VocabError(f"{name_or_path}: no such list file") from None
    index = read_index(vocabs_dir)
    name = index["default"] if name_or_path == "default" else name_or_path
    entry = index["lists"].get(name)
    if entry is None:
        raise VocabError(f"{name_or_path}: no such list file, and not a shipped list "
                         f"({', '.join(sorted(index['lists']))})")
    return Path(vocabs_dir) / entry["file"]
