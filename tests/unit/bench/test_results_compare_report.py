"""Results files, comparisons and reports from synthetic results (no server)."""

import json

import numpy as np
import pytest

from sparkdeploy.bench import compare, prompts, report, results
from sparkdeploy.cli import main
from sparkdeploy.errors import BenchError, InputError


def fake_result(kind="probe", *, tok_s=(100.0, 101.0, 99.0), acc=(2.5, 2.5, 2.5), settings=None, model="m"):
    r = results.new(kind, {"url": "http://x:1", "model": model, "vllm_version": "0.32.0", "max_model_len": 4096},
                    {"source": "url"}, settings or {"tokens": 64})
    for i, (t, a) in enumerate(zip(tok_s, acc)):
        r["runs"].append({"group": "code", "index": i, "warmup": False, "kept": True, "discard_reason": None,
                          "values": {"decode_tok_s": t, "acceptance_length": a, "accept_pos0": a - 1.5,
                                     "accept_pos1": (a - 1.5) / 2, "ttft_s": 0.05}})
    r["runs"].append({"group": "code", "index": 9, "warmup": False, "kept": False, "discard_reason": "stray",
                      "values": {"decode_tok_s": 1e9}})
    r["discarded"].append({"group": "code", "index": 9, "reason": "stray"})
    results.summarize_runs(r)
    return r


def test_summary_uses_kept_non_warmup_runs_only():
    r = fake_result()
    m = r["metrics"]["code/decode_tok_s"]
    assert m["values"] == [100.0, 101.0, 99.0] and m["median"] == 100.0 and m["n"] == 3
    assert m["unit"] == "tok/s" and m["higher_is_better"] is True
    assert r["metrics"]["code/accept_pos1"]["unit"] == "fraction"


def test_save_load_round_trip_and_schema_check(tmp_path):
    path = results.save(fake_result(), tmp_path / "r" / "a.json")
    assert results.load(path)["metrics"]["code/decode_tok_s"]["median"] == 100.0
    (tmp_path / "bad.json").write_text(json.dumps({"schema": "other"}))
    with pytest.raises(BenchError, match="not a sparkdeploy bench result"):
        results.load(tmp_path / "bad.json")
    with pytest.raises(BenchError, match="cannot read"):
        results.load(tmp_path / "missing.json")


def test_compare_detects_a_real_shift_and_ignores_noise():
    a = fake_result(tok_s=(100.0, 101.0, 99.0))
    faster = fake_result(tok_s=(120.0, 121.0, 119.0))
    noisy = fake_result(tok_s=(100.5, 100.0, 101.5))
    rows = {r["metric"]: r for r in compare.compare(a, faster)["rows"]}
    assert rows["code/decode_tok_s"]["verdict"] == "better"
    assert rows["code/decode_tok_s"]["relative"] == pytest.approx(0.2)
    assert rows["code/acceptance_length"]["verdict"] == "within noise"
    assert {r["metric"]: r["verdict"] for r in compare.compare(a, noisy)["rows"]}["code/decode_tok_s"] == \
        "within noise"


def test_compare_lower_is_better_and_says_when_not_like_for_like():
    a = fake_result()
    b = fake_result(acc=(2.0, 2.0, 2.0), settings={"tokens": 128}, model="other")
    out = compare.compare(a, b)
    assert {r["metric"]: r["verdict"] for r in out["rows"]}["code/acceptance_length"] == "worse"
    assert any("tokens" in n for n in out["comparability"]) and any("model" in n for n in out["comparability"])


def test_compare_with_extra_baselines_pools_their_repeats():
    rng = np.random.default_rng(0)
    a = fake_result(tok_s=(100.0, 103.0, 97.0))  # a shift of 8 against sd 3 from three repeats a side
    b = fake_result(tok_s=(108.0, 111.0, 105.0))
    assert {r["metric"]: r for r in compare.compare(a, b)["rows"]}["code/decode_tok_s"]["verdict"] == "within noise"
    extra = [fake_result(tok_s=tuple(rng.normal(100, 0.5, 3))) for _ in range(6)]
    row = {r["metric"]: r for r in compare.compare(a, b, extra_baselines=extra)["rows"]}["code/decode_tok_s"]
    assert row["verdict"] == "better"


def test_compare_with_nothing_in_common_is_an_error():
    a = fake_result()
    b = results.new("turn2", a["service"], {}, {})
    with pytest.raises(BenchError, match="no metric"):
        compare.compare(a, b)


def test_report_writes_markdown_and_plots(tmp_path):
    paths = []
    for name, tok in (("before", (100.0, 101.0, 99.0)), ("after", (120.0, 121.0, 119.0))):
        paths.append(str(results.save(fake_result(tok_s=tok), tmp_path / f"{name}.json")))
    md = report.write(paths, tmp_path / "rep", note="measured on nothing at all", with_comparison=True)
    text = md.read_text()
    assert "> measured on nothing at all" in text and "## Comparison" in text and "| better |" in text
    assert "Discarded runs" in text and "stray" in text
    for png in ("tok_s_per_category.png", "acceptance_per_position.png", "ttft.png"):
        assert (tmp_path / "rep" / png).stat().st_size > 1000
        assert f"]({png})" in text


def test_prompt_set_loading_selection_and_errors(tmp_path):
    cats = prompts.load()
    assert {"code", "prose_en", "prose_zh_hant", "prose_zh_hans", "reasoning", "tool_json"} <= set(cats)
    assert cats["tool_json"].messages(0)[0]["role"] == "system"
    assert [c.name for c in prompts.select(cats, ["prose_zh"])] == ["prose_zh_hant", "prose_zh_hans"]
    with pytest.raises(InputError, match="--category nope"):
        prompts.select(cats, ["nope"])
    bad = tmp_path / "p.yaml"
    bad.write_text("categories:\n  code:\n    prompts: []\n")
    with pytest.raises(InputError, match=r"categories\.code\.prompts"):
        prompts.load(bad)


def test_cli_compare_and_input_errors(tmp_path, capsys):
    a = results.save(fake_result(), tmp_path / "a.json")
    b = results.save(fake_result(tok_s=(120.0, 121.0, 119.0)), tmp_path / "b.json")
    assert main(["bench", "compare", str(a), str(b), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {r["metric"]: r["verdict"] for r in out["rows"]}["code/decode_tok_s"] == "better"
    assert main(["bench", "probe", "--url", "http://127.0.0.1:9", "--category", "nope"]) == 2
    assert main(["bench", "turn2", "--url", "http://127.0.0.1:9", "--prefix-tokens", "a,b"]) == 2
    assert main(["bench", "probe", "--url", "http://127.0.0.1:9"]) == 1  # nothing listening: BenchError


def test_cli_compare_fail_on_worse_is_a_gate(tmp_path):
    a = results.save(fake_result(), tmp_path / "a.json")
    slower = results.save(fake_result(tok_s=(80.0, 81.0, 79.0)), tmp_path / "b.json")
    assert main(["bench", "compare", str(a), str(slower)]) == 0
    assert main(["bench", "compare", str(a), str(slower), "--fail-on-worse"]) == 1
    assert main(["bench", "compare", str(a), str(a), "--fail-on-worse"]) == 0
