import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_overlays import vocab_list as V


def write(tmp_path, ids, name="list.txt"):
    p = tmp_path / name
    if name.endswith(".npy"):
        np.save(p, np.asarray(ids, dtype=np.int64))
    else:
        p.write_text("# draft list\n" + "\n".join(map(str, ids)) + "\n\n")
    return p


def test_load_text_and_npy(tmp_path):
    ids = [0, 1, 2, 7, 100]
    for name in ("a.txt", "a.npy"):
        p = write(tmp_path, ids, name)
        assert V.load(p, 128, required=[0, 2], sha256=V.file_sha256(p)).tolist() == ids


@pytest.mark.parametrize("ids, required, match", [
    ([0, 2, 1], [], "not sorted ascending at line 4"),
    ([0, 1, 1, 3], [], "duplicate id at line 4"),
    ([0, 1, 200], [], r"\[0, 128\)"),
    ([1, 2, 3], [0], "required ids missing"),
    ([], [], "empty"),
])
def test_rejects_bad_lists(tmp_path, ids, required, match):
    p = write(tmp_path, ids)
    with pytest.raises(V.VocabListError, match=match):
        V.load(p, 128, required)


def test_hash_mismatch_and_missing_file(tmp_path):
    p = write(tmp_path, [0, 1])
    with pytest.raises(V.VocabListError, match="sha256"):
        V.load(p, 128, sha256="0" * 64)
    with pytest.raises(V.VocabListError, match="no such file"):
        V.load(tmp_path / "nope.txt", 128)
    bad = tmp_path / "bad.txt"
    bad.write_text("1\nx\n")
    with pytest.raises(V.VocabListError, match="bad.txt, line 2"):
        V.load(bad, 128)


def test_special_ids_from_tokenizer_json(tmp_path):
    (tmp_path / "tokenizer.json").write_text(
        '{"added_tokens": [{"id": 0, "special": true}, {"id": 5, "special": true}, {"id": 9, "special": false}]}')
    assert V.special_ids_from_tokenizer_dir(tmp_path) == [0, 5]
    assert V.special_ids_from_tokenizer_dir(tmp_path / "missing") == []


sorted_ids = st.sets(st.integers(0, 248_319), min_size=1, max_size=400).map(lambda s: np.array(sorted(s)))


@settings(deadline=None)
@given(sorted_ids)
def test_d2t_round_trip(ids):
    d2t = V.d2t_offsets(ids)
    assert (d2t >= 0).all()  # sorted ids never lie before their draft index
    assert np.array_equal(V.d2t_to_ids(d2t), ids)
    assert np.array_equal(np.arange(ids.size) + d2t, ids)  # EAGLE-3: target = draft_idx + d2t[draft_idx]


def vllm_vocab_range(global_vocab_size: int, rank: int, world_size: int) -> tuple[int, int]:
    # copy of vllm.distributed.utils.vocab_range_from_global_vocab_size (same in 0.32 and 0.33)
    assert global_vocab_size % world_size == 0
    per = global_vocab_size // world_size
    return rank * per, rank * per + per


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 70_000).filter(lambda n: n % 2 == 1), st.sampled_from([1, 2, 4]))
def test_tp_split_of_odd_list_covers_each_row_once(num_rows, tp):
    ranges = V.tp_ranges(num_rows, tp)
    covered = np.zeros(num_rows, dtype=int)
    for r, (a, b) in enumerate(ranges):
        covered[a:b] += 1
        lo, hi = vllm_vocab_range(V.padded_size(num_rows, tp), r, tp)  # what VocabParallelEmbedding gives rank r
        assert (a, b) == (min(lo, num_rows), min(hi, num_rows))
    assert (covered == 1).all()
    sizes = [hi - lo for lo, hi in (vllm_vocab_range(V.padded_size(num_rows, tp), r, tp) for r in range(tp))]
    assert len(set(sizes)) == 1  # even split of the padded head
