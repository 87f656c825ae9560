import numpy as np
import pytest

from sparkdeploy.errors import VocabError
from sparkdeploy.vocab.build import count_corpus
from sparkdeploy.vocab.classify import CLASSES, classify_bytes, structural_core, token_classes
from sparkdeploy.vocab.select import select, weighted_frequency


def test_classify_shapes():
    assert classify_bytes(b"\xe4") == "byte"
    assert classify_bytes(b"  \n") == "whitespace"
    assert classify_bytes(" ->".encode()) == "punct"
    assert classify_bytes("，".encode()) == "punct"
    assert classify_bytes(" the".encode()) == "word"
    assert classify_bytes("我们".encode()) == "han"
    assert classify_bytes("カタ".encode()) == "kana"
    assert classify_bytes(b"<|im_end|>", special=True) == "special"


def test_core_holds_bytes_specials_and_required(tiny):
    core = structural_core(tiny)
    classes = token_classes(tiny)
    assert np.all(np.isin(tiny.required_ids, core))
    assert np.all(np.isin(np.flatnonzero(classes == CLASSES.index("byte")), core))
    assert not np.any(classes[core] == CLASSES.index("word"))


def test_size_is_exact_and_parts_add_up(tiny, corpus):
    g = count_corpus(tiny, [corpus])
    sel = select({"all": g.counts}, tiny, size=400)
    assert len(sel.ids) == 400 and sum(sel.parts.values()) == 400
    assert np.all(np.diff(sel.ids) > 0)
    assert 0 < sel.build_coverage["all"] <= 1


def test_cutoff_and_coverage_target(tiny, corpus):
    g = count_corpus(tiny, [corpus])
    sel = select({"all": g.counts}, tiny, size=500, cutoff=100)
    assert np.all(np.isin(np.arange(100), sel.ids)) and sel.parts["cutoff"] == 100
    small = select({"all": g.counts}, tiny, coverage=0.5, core=False)
    full = select({"all": g.counts}, tiny, coverage=1.0, core=False)
    assert small.build_coverage["all"] >= 0.5 and len(small.ids) < len(full.ids)
    assert full.build_coverage["all"] == pytest.approx(1.0)


def test_groups_are_weighted_equally():
    a = np.array([100, 0, 0], dtype=np.int64)
    b = np.array([0, 1, 0], dtype=np.int64)
    score = weighted_frequency({"big": a, "small": b})
    assert score[0] == score[1] == 1.0
    assert weighted_frequency({"big": a, "small": b}, {"small": 2})[1] == 2.0


def test_han1_reserve_ranks_characters_learned_inside_words(tiny):
    # A character seen only inside multi-character tokens still gets its single-character token reserved.
    counts = np.zeros(tiny.vocab_size, dtype=np.int64)
    multi = [i for i in range(tiny.vocab_size)
             if token_classes(tiny)[i] == CLASSES.index("han") and len(tiny.token_text(i)) > 1]
    assert multi
    counts[multi[0]] = 50
    sel = select({"zh": counts}, tiny, size=tiny.vocab_size, reserve={"han1": 1}, core=False)
    assert sel.parts["reserve:han1"] == 1
    reserved_char = [tiny.token_text(i) for i in sel.ids if len(tiny.token_text(i)) == 1
                     and token_classes(tiny)[i] == CLASSES.index("han")]
    assert any(ch in tiny.token_text(multi[0]) for ch in reserved_char)


def test_refusals(tiny, corpus):
    g = count_corpus(tiny, [corpus])
    with pytest.raises(VocabError, match="smaller than the fixed parts"):
        select({"all": g.counts}, tiny, size=5)
    with pytest.raises(VocabError, match="give a size"):
        select({"all": g.counts}, tiny)
    with pytest.raises(VocabError, match="empty corpus"):
        select({"all": np.zeros(tiny.vocab_size, dtype=np.int64)}, tiny, size=400)
    with pytest.raises(VocabError, match="unknown reserve"):
        select({"all": g.counts}, tiny, size=400, reserve={"emoji": 3})
    with pytest.raises(VocabError, match="entries"):
        select({"all": np.ones(3, dtype=np.int64)}, tiny, size=400)
