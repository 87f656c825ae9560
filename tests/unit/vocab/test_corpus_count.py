import collections
import gzip
import io
import json
import sys

import pytest

from sparkdeploy.errors import VocabError
from sparkdeploy.vocab.build import count_corpus
from sparkdeploy.vocab.corpus import CorpusStats, batches, decode_counting, iter_chunks
from sparkdeploy.vocab.count import count_ids


def test_chunks_keep_every_byte_and_stay_bounded(tmp_path):
    text = "".join(f"line {i} 中文 text\n" for i in range(5000)) + "no newline at the end"
    f = tmp_path / "a.txt"
    f.write_text(text, encoding="utf-8")
    stats = CorpusStats()
    chunks = list(iter_chunks([f], stats=stats, chunk_bytes=4096))
    assert "".join(chunks) == text
    assert len(chunks) > 10 and all(len(c.encode()) <= 2 * 4096 for c in chunks)
    assert all(c.endswith("\n") for c in chunks[:-1])  # cut at line ends
    assert stats.files == 1 and stats.bytes == len(text.encode()) and stats.invalid_utf8_bytes == 0


def test_one_long_line_is_cut_between_characters(tmp_path):
    text = "中" * 10000
    f = tmp_path / "long.txt"
    f.write_text(text, encoding="utf-8")
    chunks = list(iter_chunks([f], chunk_bytes=1000))
    assert "".join(chunks) == text and len(chunks) > 5


def test_non_utf8_bytes_are_counted_not_fatal(tmp_path):
    f = tmp_path / "bad.txt"
    f.write_bytes(b"good line\n\xff\xfe bad \xc3 line\n")
    stats = CorpusStats()
    out = "".join(iter_chunks([f], stats=stats))
    assert stats.invalid_utf8_bytes == 3 and stats.invalid_by_file == {str(f): 3}
    assert out.count("\ufffd") == 3 and "good line" in out
    assert decode_counting(b"ok") == ("ok", 0)


def test_directories_globs_gzip_and_jsonl(tmp_path):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "a.py").write_text("print(1)\n")
    (tmp_path / "d" / "sub" / "b.txt").write_text("skip me\n")
    with gzip.open(tmp_path / "d" / "sub" / "c.py.gz", "wt") as fh:
        fh.write("zipped = True\n")
    assert "".join(iter_chunks([tmp_path / "d"], include=["*.py", "*.py.gz"])) == "print(1)\nzipped = True\n"
    log = tmp_path / "chat.jsonl"
    log.write_text("\n".join([
        json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello",
                                                                    "reasoning_content": "think"}]}),
        "{broken",
        json.dumps({"text": "plain"}),
    ]) + "\n")
    stats = CorpusStats()
    text = "".join(iter_chunks([log], stats=stats))
    assert text == "hi\nhello\nthink\nplain" and stats.bad_json_lines == 1


def test_missing_file_and_stdin(tmp_path, monkeypatch):
    with pytest.raises(VocabError, match="no such file"):
        list(iter_chunks([tmp_path / "nope.txt"]))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("from stdin\n".encode())))
    assert "".join(iter_chunks(["-"])) == "from stdin\n"


def test_batches_group_chunks():
    out = list(batches(["a" * 10] * 5, batch_bytes=25))
    assert [len(b) for b in out] == [3, 2]


def test_counts_equal_a_naive_counter(tiny, corpus):
    chunks = list(iter_chunks([corpus], chunk_bytes=512))
    naive = collections.Counter()
    for c in chunks:
        naive.update(tiny.encode_batch([c])[0].tolist())
    got = count_ids(tiny, chunks)
    assert got.tokens == sum(naive.values())
    assert {i: int(n) for i, n in enumerate(got.counts) if n} == dict(naive)


def test_empty_corpus_is_refused(tiny, tmp_path):
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(VocabError, match="empty corpus"):
        count_corpus(tiny, [tmp_path / "empty.txt"])
    g = count_corpus(tiny, [tmp_path / "empty.txt", tmp_path / "empty.txt"]) if False else None
    assert g is None
