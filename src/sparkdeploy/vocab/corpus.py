"""Corpus streaming: files, directories, `-` (stdin) and JSONL chat logs -> bounded text chunks.

Text is read in blocks and cut at line ends into chunks of at most `chunk_bytes` (64 KB by default): whole
chunks keep the newline tokens a per-line split would lose, and bounded chunks keep memory flat however
large the corpus. Bytes that are not UTF-8 are replaced by U+FFFD, counted per file and reported; they never
stop a build. Files ending in `.gz` are decompressed. JSONL files (`.jsonl`, or any file with `jsonl=True`) yield the text of one field per record:
`text` by default, or the `content` of every entry of a `messages` list (chat logs).
"""

from __future__ import annotations

import fnmatch
import gzip
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator

from sparkdeploy.errors import VocabError

CHUNK_BYTES = 64 * 1024
_SURROGATES = re.compile("[\udc80-\udcff]")


@dataclass
class CorpusStats:
    """What was read: files, bytes, chunks, non-UTF-8 bytes (per file), JSONL records skipped."""

    files: int = 0
    bytes: int = 0
    chunks: int = 0
    invalid_utf8_bytes: int = 0
    invalid_by_file: dict[str, int] = field(default_factory=dict)
    bad_json_lines: int = 0

    def to_dict(self) -> dict:
        return {"files": self.files, "bytes": self.bytes, "chunks": self.chunks,
                "invalid_utf8_bytes": self.invalid_utf8_bytes,
                "invalid_by_file": dict(sorted(self.invalid_by_file.items())),
                "bad_json_lines": self.bad_json_lines}


def decode_counting(data: bytes) -> tuple[str, int]:
    """UTF-8 decode; invalid bytes become U+FFFD and are counted (fast path when the data is valid)."""
    try:
        return data.decode("utf-8"), 0
    except UnicodeDecodeError:
        text = data.decode("utf-8", "surrogateescape")
        bad = len(_SURROGATES.findall(text))
        return _SURROGATES.sub("\ufffd", text), bad


def expand_paths(paths: Iterable[str | os.PathLike], include: Iterable[str] = ()) -> list[str]:
    """Files named or found under directories (sorted, recursive); `-` stays as stdin.

    `include` globs (e.g. `*.py`) filter files found in directories; files named directly always count.
    Raises VocabError for a path that does not exist.
    """
    patterns = list(include)
    out: list[str] = []
    for p in paths:
        s = str(p)
        if s == "-":
            out.append(s)
            continue
        path = Path(s)
        if path.is_dir():
            found = []
            for root, dirs, files in os.walk(path):
                dirs.sort()
                for name in sorted(files):
                    if not patterns or any(fnmatch.fnmatch(name, g) for g in patterns):
                        found.append(os.path.join(root, name))
            out.extend(found)
        elif path.is_file():
            out.append(s)
        else:
            raise VocabError(f"{s}: no such file or directory")
    return out


def _open(path: str) -> BinaryIO:
    if path == "-":
        return sys.stdin.buffer
    try:
        if path.endswith(".gz"):
            return gzip.open(path, "rb")  # noqa: SIM115 - closed by the caller
        return open(path, "rb")  # noqa: SIM115 - closed by the caller
    except OSError as err:
        raise VocabError(f"{path}: cannot read ({err.strerror or err})") from err


def _text_chunks(fh: BinaryIO, name: str, stats: CorpusStats, chunk_bytes: int) -> Iterator[str]:
    pending = b""
    while True:
        try:
            block = fh.read(chunk_bytes)
        except (OSError, EOFError, gzip.BadGzipFile) as err:
            raise VocabError(f"{name}: cannot read ({err.strerror or err})") from err
        if not block:
            break
        stats.bytes += len(block)
        data = pending + block
        cut = data.rfind(b"\n")
        if cut < 0 or cut < len(data) // 4:
            if len(data) < chunk_bytes:
                pending = data
                continue
            # A very long line: cut anyway, away from a UTF-8 continuation byte.
            cut = len(data) - 1
            while cut > 0 and (data[cut] & 0xC0) == 0x80:
                cut -= 1
            cut -= 1
        pending = data[cut + 1:]
        yield _decode(data[: cut + 1], name, stats)
    if pending:
        yield _decode(pending, name, stats)


def _decode(data: bytes, name: str, stats: CorpusStats) -> str:
    text, bad = decode_counting(data)
    if bad:
        stats.invalid_utf8_bytes += bad
        stats.invalid_by_file[name] = stats.invalid_by_file.get(name, 0) + bad
    stats.chunks += 1
    return text


def _record_texts(record: object, text_field: str) -> Iterator[str]:
    if not isinstance(record, dict):
        return
    value = record.get(text_field)
    if isinstance(value, str):
        yield value
    messages = record.get("messages")
    if isinstance(messages, list):
        for m in messages:
            if isinstance(m, dict):
                content = m.get("content")
                if isinstance(content, str):
                    yield content
                elif isinstance(content, list):  # OpenAI content parts
                    yield from (p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
                for key in ("reasoning_content", "reasoning"):
                    if isinstance(m.get(key), str):
                        yield m[key]


def _jsonl_chunks(fh: BinaryIO, name: str, stats: CorpusStats, chunk_bytes: int, text_field: str) -> Iterator[str]:
    buf: list[str] = []
    size = 0
    for raw in fh:
        stats.bytes += len(raw)
        line, bad = decode_counting(raw)
        if bad:
            stats.invalid_utf8_bytes += bad
            stats.invalid_by_file[name] = stats.invalid_by_file.get(name, 0) + bad
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            stats.bad_json_lines += 1
            continue
        for text in _record_texts(record, text_field):
            buf.append(text)
            size += len(text)
            if size >= chunk_bytes:
                stats.chunks += 1
                yield "\n".join(buf)
                buf, size = [], 0
    if buf:
        stats.chunks += 1
        yield "\n".join(buf)


def iter_chunks(paths: Iterable[str | os.PathLike], *, stats: CorpusStats | None = None, include: Iterable[str] = (),
                chunk_bytes: int = CHUNK_BYTES, jsonl: bool | None = None, text_field: str = "text") -> Iterator[str]:
    """Yield text chunks of at most about `chunk_bytes` from every file, in order; fills `stats`.

    `jsonl=None` treats files ending in `.jsonl` as JSON lines, `True` treats every file so.
    Raises VocabError for missing or unreadable files (before reading anything for missing ones).
    """
    stats = stats if stats is not None else CorpusStats()
    files = expand_paths(paths, include)
    for name in files:
        fh = _open(name)
        try:
            stats.files += 1
            as_jsonl = jsonl if jsonl is not None else name.endswith(".jsonl")
            if as_jsonl:
                yield from _jsonl_chunks(fh, name, stats, chunk_bytes, text_field)
            else:
                yield from _text_chunks(fh, name, stats, chunk_bytes)
        finally:
            if fh is not sys.stdin.buffer:
                fh.close()


def batches(chunks: Iterable[str], batch_bytes: int = 2 * 1024 * 1024) -> Iterator[list[str]]:
    """Group chunks into lists of about `batch_bytes` characters (one tokenizer call each)."""
    batch: list[str] = []
    size = 0
    for c in chunks:
        batch.append(c)
        size += len(c)
        if size >= batch_bytes:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch
