"""Token classes by script and shape: what the structural core takes, what `inspect` histograms.

Classes: special, byte (a lone byte or an invalid-UTF-8 fragment), whitespace, punct (punctuation, symbols
and operators, optionally after one space), digit, han, kana, hangul, word (ASCII letters, optionally after
one space: English words and identifiers), latin (other Latin-script letters), cyrillic, other.
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache

import numpy as np

from sparkdeploy.vocab.tokenizer import Tokenizer

CLASSES = ("special", "byte", "whitespace", "punct", "digit", "han", "kana", "hangul", "word", "latin",
           "cyrillic", "other")


def is_han(ch: str) -> bool:
    o = ord(ch)
    return (0x4E00 <= o <= 0x9FFF or 0x3400 <= o <= 0x4DBF or 0x20000 <= o <= 0x323AF
            or 0xF900 <= o <= 0xFAFF or o == 0x3007)


def _script(ch: str) -> str:
    o = ord(ch)
    if is_han(ch):
        return "han"
    if 0x3040 <= o <= 0x30FF or 0x31F0 <= o <= 0x31FF or 0xFF66 <= o <= 0xFF9F:
        return "kana"
    if 0xAC00 <= o <= 0xD7AF or 0x1100 <= o <= 0x11FF or 0x3130 <= o <= 0x318F:
        return "hangul"
    if 0x0400 <= o <= 0x052F:
        return "cyrillic"
    if o < 0x250 or 0x1E00 <= o <= 0x1EFF:
        return "latin"
    return "other"


def classify_bytes(raw: bytes, special: bool = False) -> str:
    if special:
        return "special"
    if len(raw) == 1:
        return "byte"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return "byte"
    if not text:
        return "other"
    if text.isspace():
        return "whitespace"
    body = text[1:] if text[0] == " " and len(text) > 1 else text
    cats = [unicodedata.category(c) for c in body]
    if all(c[0] in "PS" for c in cats):
        return "punct"
    if all(c == "Nd" for c in cats):
        return "digit"
    if body.isascii() and body.isalpha():
        return "word"
    scripts = {_script(c) for c, cat in zip(body, cats) if cat[0] in "LM"}
    if not scripts:
        return "other"
    if "han" in scripts:
        return "han"
    if "kana" in scripts:
        return "kana"
    if len(scripts) == 1:
        return scripts.pop()
    return "other"


@lru_cache(maxsize=8)
def _classes_for(content_hash: str, tokenizer_id: int, tokenizer: Tokenizer) -> np.ndarray:
    index = {c: i for i, c in enumerate(CLASSES)}
    return np.array([index[classify_bytes(raw, special)] for raw, special in tokenizer.table], dtype=np.int8)


def token_classes(tokenizer: Tokenizer) -> np.ndarray:
    """Class index (into CLASSES) of every id of the tokenizer; cached per tokenizer."""
    return _classes_for(tokenizer.content_hash, id(tokenizer), tokenizer)


def class_histogram(ids: np.ndarray, tokenizer: Tokenizer) -> dict[str, int]:
    classes = token_classes(tokenizer)[np.asarray(ids, dtype=np.int64)]
    counts = np.bincount(classes, minlength=len(CLASSES))
    return {name: int(n) for name, n in zip(CLASSES, counts) if n}


def structural_core(tokenizer: Tokenizer) -> np.ndarray:
    """Ids every list carries: specials, EOS/control tags, all byte tokens, whitespace runs, punctuation and
    operators (with or without a leading space) and digits. About 4-7k ids on Qwen vocabularies."""
    classes = token_classes(tokenizer)
    wanted = [CLASSES.index(c) for c in ("special", "byte", "whitespace", "punct", "digit")]
    ids = np.flatnonzero(np.isin(classes, wanted))
    return np.union1d(ids, tokenizer.required_ids).astype(np.int64)
