import json

import pytest

from sparkdeploy.cli import main

from .conftest import train_tokenizer


def run(*args):
    return main(["vocab", *map(str, args)])


def test_build_inspect_validate_split_coverage(tiny_model, corpus, tmp_path, capsys):
    out = tmp_path / "lists" / "tiny.txt"
    assert run("build", f"en={corpus / 'en.txt'}", f"zh={corpus / 'zh.txt'}", "-t", tiny_model, "--size", 420,
               "--reserve", "han1=5", "--weight", "zh=2", "-o", out) == 0
    manifest = json.loads((tmp_path / "lists" / "tiny.manifest.json").read_text())
    assert manifest["size"] == 420 and set(manifest["build"]["groups"]) == {"en", "zh"}
    assert manifest["tokenizer"]["name"] == str(tiny_model)
    assert manifest["settings"]["weights"] == {"zh": 2.0}
    capsys.readouterr()
    assert run("validate", out) == 0
    assert "ok, 420 ids" in capsys.readouterr().out
    assert run("inspect", out, "--json") == 0
    info = json.loads(capsys.readouterr().out)
    assert info["size"] == 420 and info["by_class"]["special"] == 7
    assert run("split", out, "--tp", 2, "--out-dir", tmp_path / "shards") == 0
    assert (tmp_path / "shards" / "rank1.txt").is_file()
    capsys.readouterr()
    assert run("coverage", "--vocab", out, corpus / "zh.txt", "--json") == 0
    cov = json.loads(capsys.readouterr().out)
    assert cov["texts"][0]["tokens"] > 0 and 0 <= cov["texts"][0]["miss_rate"] <= 1


def test_merge_prints_seed_style_line(tmp_path, capsys):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("1\n2\n3\n")
    b.write_text("3\n4\n")
    assert run("merge", a, b, "-o", tmp_path / "m.txt") == 0
    assert capsys.readouterr().out.strip() == "3 2 1 4"
    assert (tmp_path / "m.txt").read_text() == "1\n2\n3\n4\n"


@pytest.mark.parametrize("case", ["unknown_tokenizer", "missing_file", "empty_corpus", "too_small", "bad_weight"])
def test_bad_build_input_writes_nothing(case, tiny_model, corpus, tmp_path, capsys):
    out = tmp_path / "out" / "l.txt"
    args = {"unknown_tokenizer": [corpus, "-t", "nope", "--size", 400],
            "missing_file": [tmp_path / "missing.txt", "-t", tiny_model, "--size", 400],
            "empty_corpus": [tmp_path / "empty.txt", "-t", tiny_model, "--size", 400],
            "too_small": [corpus, "-t", tiny_model, "--size", 3],
            "bad_weight": [corpus, "-t", tiny_model, "--size", 400, "--weight", "nope=2"]}[case]
    (tmp_path / "empty.txt").write_text("")
    assert run("build", *args, "-o", out) == 2
    assert "error:" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_non_utf8_corpus_is_reported(tiny_model, tmp_path, capsys):
    f = tmp_path / "mixed.txt"
    f.write_bytes(b"the lazy dog\n\xff\xfe\n" * 50)
    assert run("build", f, "-t", tiny_model, "--size", 400, "-o", tmp_path / "l.txt") == 0
    assert "100 non-UTF-8 bytes replaced" in capsys.readouterr().out
    m = json.loads((tmp_path / "l.manifest.json").read_text())
    assert m["build"]["groups"]["corpus"]["invalid_utf8_bytes"] == 100


def test_validate_refuses_other_tokenizer(tiny_model, corpus, tmp_path, capsys):
    out = tmp_path / "l.txt"
    assert run("build", corpus, "-t", tiny_model, "--size", 400, "-o", out) == 0
    other = train_tokenizer(tmp_path / "other-model", vocab_size=620)
    assert run("validate", out, "-t", other) == 2
    assert "hash mismatch" in capsys.readouterr().err
    bad = tmp_path / "bad.txt"
    bad.write_text("5\n1\n")
    assert run("validate", bad, "-t", tiny_model) == 2
    assert run("validate", tmp_path / "nope.txt", "-t", tiny_model) == 2
