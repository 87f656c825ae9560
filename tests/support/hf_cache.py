"""A Hugging Face hub-cache layout built by hand, so `weights fetch` is tested offline against real files.

    <hub>/models--<org>--<name>/blobs/<sha256>              the bytes
                               /refs/main                   the commit
                               /snapshots/<commit>/<file>   relative symlinks into blobs/ (as huggingface_hub makes)
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path


def tiny_safetensors(values: tuple[float, ...] = (0.5, -1.0, 2.0, 3.25)) -> bytes:
    """A valid one-tensor safetensors file: u64 header length, JSON header, little-endian F32 data."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [len(values)], "data_offsets": [0, 4 * len(values)]}}).encode()
    return struct.pack("<Q", len(header)) + header + struct.pack(f"<{len(values)}f", *values)


def tiny_model_files() -> dict[str, bytes]:
    return {"config.json": json.dumps({"model_type": "qwen3", "hidden_size": 4}).encode(),
            "model.safetensors": tiny_safetensors(),
            "tokenizer/tokenizer_config.json": b"{}"}


def build(hub: Path, repo_id: str, files: dict[str, bytes], *, ref: str = "main", commit: str | None = None) -> str:
    """Write `files` as one snapshot of `repo_id` under the hub cache `hub` (blobs named by sha256, as for LFS
    files); returns the commit (given, or made from the contents)."""
    repo = hub / f"models--{repo_id.replace('/', '--')}"
    commit = commit or hashlib.sha1(repr(sorted(files.items())).encode()).hexdigest()
    for rel, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = repo / "snapshots" / commit / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / ref).write_text(commit)
    return commit
