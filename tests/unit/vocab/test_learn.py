"""`vocab learn`: a list from captured traffic (counts written by the engine's own writer, spark_overlays.capture)."""

import ast
import json

import numpy as np
import pytest
from spark_overlays import capture, vocab_list

from sparkdeploy.cli import main
from sparkdeploy.errors import VocabError
from sparkdeploy.vocab.classify import structural_core
from sparkdeploy.vocab.count import count_ids
from sparkdeploy.vocab.learn import learn, read_captured
from sparkdeploy.vocab.select import select

from .conftest import EN, ZH, _babble

TRAFFIC = ZH + _babble(seed=3, n=300)  # Chinese prose and made-up words: mostly off an English list


def _capture(tok, text: str, path, vocab_size=None):
    """What the engine writes after emitting `text`: a histogram of ids, through TokenCounts."""
    ids = np.concatenate([np.asarray(e, dtype=np.int64) for e in tok.encode_batch(text.splitlines())])
    c = capture.TokenCounts(path, vocab_size or tok.vocab_size, flush_seconds=60, flush_tokens=10**9)
    c.add(ids)
    c.stop()
    return ids


@pytest.fixture
def current(tiny, tmp_path):
    """An English+code list: most Chinese tokens are off it (the seed's 82% miss)."""
    sel = select({"en": count_ids(tiny, [EN]).counts}, tiny, size=380)
    path = tmp_path / "current.txt"
    path.write_text("\n".join(map(str, sel.ids.tolist())) + "\n")
    return path


def test_counts_file_holds_only_integer_counts(tiny, tmp_path):
    path = tmp_path / "counts.npy"
    ids = _capture(tiny, TRAFFIC, path)
    raw = path.read_bytes()
    arr = np.load(path, allow_pickle=False)
    assert arr.dtype == np.int64 and arr.shape == (tiny.vocab_size,)
    assert arr.tolist() == np.bincount(ids, minlength=tiny.vocab_size).tolist()
    header, body = raw.split(b"\n", 1)
    assert len(body) == 8 * tiny.vocab_size  # nothing but the counts after the header
    assert header.startswith(b"\x93NUMPY\x01\x00")
    assert ast.literal_eval(header[10:].decode()) == {"descr": "<i8", "fortran_order": False,
                                                      "shape": (tiny.vocab_size,)}
    for line in set(ZH.splitlines()):
        assert line.encode() not in raw


def test_learn_lowers_the_miss_rate_and_keeps_every_old_id(tiny, tmp_path, current):
    cur = vocab_list.read_ids(current)
    _capture(tiny, TRAFFIC, tmp_path / "counts.npy")
    captured = read_captured([tmp_path / "counts.npy"], tiny)
    res = learn(cur, captured, tiny, size=len(cur) + 20)
    assert set(cur.tolist()) <= set(res.ids.tolist())
    assert set(structural_core(tiny).tolist()) <= set(res.ids.tolist())
    assert len(res.ids) == len(cur) + 20 and res.parts["learned"] == 20 - res.parts["core"]
    print(f"miss rate on the captured traffic: {res.before.miss_rate:.2%} -> {res.after.miss_rate:.2%}")
    assert res.before.miss_rate > 0.3 and res.after.miss_rate < res.before.miss_rate / 2
    assert res.by_class["han"]["miss_after"] < res.by_class["han"]["miss_before"]
    full = learn(cur, captured, tiny, coverage=1.0)
    assert full.after.miss_rate == 0.0 and full.after.tokens == captured.tokens


def test_cli_learn_writes_a_list_with_manifest_and_dry_run_writes_nothing(tiny, tiny_model, tmp_path, current, capsys):
    counts = tmp_path / "node1.npy"
    _capture(tiny, TRAFFIC, counts)
    out = tmp_path / "learned.txt"
    args = ["vocab", "learn", str(counts), "--vocab", str(current), "-t", str(tiny_model), "--coverage", "0.98"]
    assert main([*args, "--dry-run", "--json"]) == 0
    dry = json.loads(capsys.readouterr().out)
    assert dry["dry_run"] and not out.exists() and dry["miss_rate"]["after"] <= 0.02
    assert main([*args, "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"miss rate on the captured traffic: {dry['miss_rate']['before']:.2%} -> " in text
    assert "every current id kept" in text and f"vocab rollout {out}" in text
    ids = vocab_list.read_ids(out, tiny.vocab_size)  # the one reader the engine and the rollout use
    assert set(vocab_list.read_ids(current).tolist()) <= set(ids.tolist())
    manifest = json.loads((tmp_path / "learned.manifest.json").read_text())
    assert manifest["size"] == len(ids) and manifest["tokenizer"]["content_hash"] == tiny.content_hash
    assert manifest["learned"]["counts"] == [{"file": str(counts), "tokens": dry["tokens"]}]
    assert manifest["learned"]["miss_rate"] == dry["miss_rate"]
    assert main(["vocab", "validate", str(out)]) == 0  # the manifest names its tokenizer


def test_counts_past_the_tokenizer_are_reported_not_listed(tiny, tmp_path, current):
    padded = tiny.vocab_size + 64  # the model's head is padded past the tokenizer
    path = tmp_path / "counts.npy"
    _capture(tiny, TRAFFIC, path, vocab_size=padded)
    arr = capture.read_counts(path)
    arr[tiny.vocab_size + 3] = 7
    capture.write_counts(path, arr)
    captured = read_captured([path, path], tiny)  # two nodes' files add up
    assert captured.outside == 14 and captured.tokens == 2 * (int(arr.sum()) - 7)
    res = learn(vocab_list.read_ids(current), captured, tiny, coverage=1.0)
    assert res.ids.max() < tiny.vocab_size


@pytest.mark.parametrize("make, message", [
    (lambda p: None, "no such counts file"),
    (lambda p: p.write_text("the quick brown fox"), "not a counts file"),
    (lambda p: np.save(p, np.ones(700, dtype=np.float32)), "expected a 1-D int64 array"),
    (lambda p: np.save(p, np.ones(10, dtype=np.int64)), "captured from another model"),
    (lambda p: np.save(p, np.zeros(700, dtype=np.int64)), "no tokens captured"),
])
def test_errors_name_the_counts_file(tiny_model, tmp_path, current, capsys, make, message):
    bad = tmp_path / "bad.npy"
    make(bad)
    assert main(["vocab", "learn", str(bad), "--vocab", str(current), "-t", str(tiny_model), "--size", "500",
                 "-o", str(tmp_path / "x.txt")]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and message in err
    assert not (tmp_path / "x.txt").exists()


def test_learn_refuses_a_size_that_would_drop_ids(tiny, tmp_path, current):
    _capture(tiny, TRAFFIC, tmp_path / "c.npy")
    with pytest.raises(VocabError, match="learning only adds ids"):
        learn(vocab_list.read_ids(current), read_captured([tmp_path / "c.npy"], tiny), tiny, size=10)
