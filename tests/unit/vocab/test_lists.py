import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkdeploy.errors import VocabError
from sparkdeploy.vocab import coverage, merge_lists, read_list, split_for_tp, validate_list, write_list
from sparkdeploy.vocab.formats import atomic_write_bytes
from sparkdeploy.vocab.manifest import ids_sha256


@pytest.mark.parametrize("name", ["l.txt", "l.npy", "l.d2t.npy"])
def test_formats_round_trip(tmp_path, name):
    ids = np.array([0, 3, 7, 100, 4096], dtype=np.int64)
    write_list(tmp_path / name, ids)
    assert read_list(tmp_path / name).tolist() == ids.tolist()


def test_d2t_holds_eagle3_offsets(tmp_path):
    write_list(tmp_path / "x.d2t.npy", np.array([5, 6, 10]))
    assert np.load(tmp_path / "x.d2t.npy").tolist() == [5, 5, 8]  # target = i + d2t[i]


def test_read_errors(tmp_path):
    (tmp_path / "bad.txt").write_text("1\n2\nthree\n")
    with pytest.raises(VocabError, match=r"bad.txt, line 3: not a list of token ids: 'three'"):
        read_list(tmp_path / "bad.txt")
    with pytest.raises(VocabError, match="cannot read"):
        read_list(tmp_path / "missing.txt")
    np.save(tmp_path / "m.npy", np.zeros((2, 2), dtype=np.int64))
    with pytest.raises(VocabError, match="1-D integer"):
        read_list(tmp_path / "m.npy")
    (tmp_path / "c.txt").write_text("# comment\n\n4\n")
    assert read_list(tmp_path / "c.txt").tolist() == [4]


def test_atomic_write_leaves_old_file_on_failure(tmp_path, monkeypatch):
    target = tmp_path / "keep.txt"
    target.write_text("old\n")

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr("os.fsync", boom)
    with pytest.raises(OSError):
        atomic_write_bytes(target, b"new\n")
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


def _ok_list(tok):
    return np.union1d(np.arange(300), tok.required_ids)


def test_validate_accepts_good_list_and_checks_manifest(tiny):
    ids = _ok_list(tiny)
    assert validate_list(ids.tolist(), tiny).tolist() == ids.tolist()
    manifest = {"tokenizer": {"name": "tiny", "content_hash": tiny.content_hash}, "size": len(ids),
                "ids_sha256": ids_sha256(ids)}
    validate_list(ids, tiny, manifest)


@pytest.mark.parametrize("bad, message", [
    ("not a list", "not a list of token ids"),
    ([], "empty list"),
    ([[1, 2], [3, 4]], "not a flat list"),
    ([0.5, 1.5], "must be integers"),
])
def test_validate_refuses_shapes(tiny, bad, message):
    with pytest.raises(VocabError, match=message):
        validate_list(bad, tiny)


def test_validate_refuses_content(tiny):
    ids = _ok_list(tiny)
    with pytest.raises(VocabError, match="out of range"):
        validate_list(np.append(ids, tiny.vocab_size + 5), tiny)
    with pytest.raises(VocabError, match="duplicate"):
        validate_list(np.sort(np.append(ids, ids[3])), tiny)
    with pytest.raises(VocabError, match="not sorted"):
        validate_list(ids[::-1], tiny)
    with pytest.raises(VocabError, match="missing EOS/control"):
        validate_list(np.setdiff1d(ids, tiny.eos_ids[:1]), tiny)
    with pytest.raises(VocabError, match="hash mismatch"):
        validate_list(ids, tiny, {"tokenizer": {"name": "other", "content_hash": "sha256:00"}})
    with pytest.raises(VocabError, match="manifest says"):
        validate_list(ids, tiny, {"tokenizer": {"content_hash": tiny.content_hash}, "size": 3})
    with pytest.raises(VocabError, match="ids_sha256"):
        validate_list(ids, tiny, {"tokenizer": {"content_hash": tiny.content_hash}, "ids_sha256": "sha256:x"})


def test_split_is_even_like_vocab_parallel():
    res = split_for_tp(np.arange(1000), 2)  # 1000 -> padded to 1024 -> 512 rows per rank
    assert res.rows_per_rank == 512 and [len(s) for s in res.shards] == [512, 488]
    assert res.padding == [0, 24]
    even = split_for_tp(np.arange(65536), 2)
    assert even.padding == [0, 0]
    with pytest.raises(VocabError):
        split_for_tp([], 2)
    with pytest.raises(VocabError):
        split_for_tp([1, 2], 0)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=500, unique=True), st.sampled_from([1, 2, 4, 8]))
def test_split_shards_partition_the_list(ids, tp):
    ids = sorted(ids)
    res = split_for_tp(ids, tp)
    assert np.concatenate(res.shards).tolist() == ids
    assert all(len(s) + p == res.rows_per_rank for s, p in zip(res.shards, res.padding))


def test_merge_reports_new_ids_like_the_seed():
    res = merge_lists([np.arange(10), np.arange(5, 20), [0, 30]])
    assert res.sizes == [10, 15, 2] and res.new == [10, 10, 1] and len(res.ids) == 21
    assert res.line() == "10 15 2 10 1 21"


def test_coverage_counts_off_list_tokens(tiny):
    text = "the quick brown fox 我们今天"
    ids_all = tiny.encode_batch([text])[0]
    full = coverage(np.unique(ids_all), tiny, [text])
    assert full.off_list == 0 and full.tokens == len(ids_all)
    half = coverage(np.unique(ids_all)[:2], tiny, [text])
    assert half.off_list > 0 and 0 < half.miss_rate <= 1 and half.top_missed
    assert sum(half.missed_by_class.values()) == half.off_list
