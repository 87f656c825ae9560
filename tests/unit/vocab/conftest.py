"""Fixtures: a tiny ByteLevel BPE tokenizer trained on synthetic text (no downloads), small corpora."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<think>", "</think>"]

EN = ("the quick brown fox jumps over the lazy dog. " * 3 + "def main(argv):\n    return argv[0] + 1\n") * 20
ZH = ("我们今天在公园里散步，天气很好。" + "他說這個東西很貴。" + "人工智能正在改变世界。\n") * 20


def _babble(seed: int = 0, n: int = 4000) -> str:
    """Deterministic pseudo-words so BPE has enough material for a few hundred merges."""
    import random

    rng = random.Random(seed)
    syll = ["ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "ve", "zu", "ch", "th", "er", "an", "in", "on"]
    return " ".join("".join(rng.choice(syll) for _ in range(rng.randint(1, 4))) for _ in range(n))


def train_tokenizer(directory: Path, vocab_size: int = 600, extra_text: str = "") -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tk.train_from_iterator([EN, ZH, _babble(), extra_text], trainer)
    directory.mkdir(parents=True, exist_ok=True)
    tk.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    (directory / "config.json").write_text(json.dumps({"eos_token_id": 0}))
    return directory


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A model directory whose tokenizer.json is a 600-token ByteLevel BPE (like the sim's tiny models)."""
    return train_tokenizer(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def tiny(tiny_model):
    from sparkdeploy.vocab import load_tokenizer

    return load_tokenizer(str(tiny_model))


@pytest.fixture
def corpus(tmp_path) -> Path:
    d = tmp_path / "corpus"
    d.mkdir()
    (d / "en.txt").write_text(EN, encoding="utf-8")
    (d / "zh.txt").write_text(ZH, encoding="utf-8")
    return d
