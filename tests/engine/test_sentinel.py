"""`bench sentinel` against the real vLLM CPU engine: the same release measured twice is quiet (exit 0); a
release whose speculative settings lower n-gram acceptance on one category is caught, naming that category.

The tiny model answers every prompt with newlines, so n-gram drafting works the same for every category
unless the prompt itself holds the n-gram being looked up: the code prompt has one blank line (two newline
tokens in a row), the others none. With `prompt_lookup_max` 3 the drafter soon matches three newlines in the
output and drafts well everywhere; with 2 it keeps matching the blank line in the code prompt, drafts the
code that follows it, and every draft is rejected there, while the other categories draft as before.
The server with test_bench's configuration is that module's fixture (the same definition, imported).
"""

from __future__ import annotations

import json

import pytest

from sparkdeploy.bench import client, sentinel
from sparkdeploy.cli import main
from tests.engine.test_bench import API_KEY, MAX_MODEL_LEN, NGRAM, server, service  # noqa: F401
from tests.support.vllm_server import VllmServer

pytestmark = pytest.mark.engine

SHORTER = json.dumps(dict(json.loads(NGRAM), prompt_lookup_max=2))
PROMPTS = {
    "code": "Finish this Python module:\n\nimport os\ndef main():\n    print(os.getcwd())",
    "prose_en": "Explain why a service that answers its health check can still be unable to serve requests.",
    "prose_zh_hant": "請用繁體中文寫一篇約三百字的短文，介紹台灣夜市的飲食文化。",
    "prose_zh_hans": "请用简体中文写一篇约三百字的文章，介绍长江三峡的地理特点和历史意义。",
    "reasoning": "A train leaves A at 09:00 at 80 km/h; another leaves B, 400 km away, at 10:00 at 120 km/h "
                 "towards A. When do they meet?",
}
PROBE = {"tokens": 24, "runs": 3, "warmup": 1}  # short: four records and one extra server start in all


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("sentinel") / "prompts.yaml"
    path.write_text(json.dumps({"categories": {k: [v] for k, v in PROMPTS.items()}}))  # JSON is YAML
    return path


def release(number: int, spec: str) -> dict:
    return {"number": number, "image": "vllm-cpu:0.32.0", "flags": ["--speculative-config", spec]}


@pytest.fixture(scope="module")
def baseline(service, prompt_file, tmp_path_factory):  # noqa: F811
    """The same release measured three times, one after the other, as `up` then later re-checks would."""
    out = tmp_path_factory.mktemp("records")
    return [sentinel.save(sentinel.measure(service, prompt_file=prompt_file, release=release(1, NGRAM), **PROBE),
                          out / f"a{i}.json") for i in (1, 2, 3)]


def test_the_same_release_measured_twice_is_quiet(baseline, capsys):
    """The third record against the second, the first a baseline session (`--baseline-session`, the documented
    way to judge on a host whose speed drifts between sessions): this host's other test lane starts and stops
    engines beside this one, and run30b's decode speed fell 13 % between two records of one release while each
    record's own repeats agreed, which the repeats alone call a regression."""
    a0, a1, a2 = baseline
    rec = sentinel.load(a1)
    assert list(rec["categories"]) == list(PROMPTS) and rec["decode_source"] == "server"
    for figs in rec["categories"].values():
        assert len(figs["acceptance_length"]) == PROBE["runs"] and len(figs["accept_pos"]) == 2
    code = main(["bench", "sentinel", "--baseline", str(a1), "--candidate", str(a2), "--baseline-session", str(a0),
                 "--json"])
    verdict = json.loads(capsys.readouterr().out)
    assert verdict["changes"] == {}
    rows = {r["metric"]: r for r in verdict["rows"]}
    assert all(rows[f"{c}/acceptance_length"]["verdict"] == "within noise" for c in PROMPTS)
    # The A/A run must be quiet: `up` exits 3 on a regression, so a false alarm here would fail a good deploy.
    assert verdict["regressions"] == [] and code == 0


def test_shorter_ngram_lookup_regresses_the_code_category_and_is_named(tiny_models, baseline, prompt_file,
                                                                      tmp_path, capsys):
    with VllmServer(tiny_models / "tiny-qwen3", max_model_len=MAX_MODEL_LEN, log_path=tmp_path / "vllm.log",
                    timeout=480, api_key=API_KEY,
                    args=["--enforce-eager", "--enable-prefix-caching", "--speculative-config", SHORTER]) as srv:
        svc = client.discover(srv.base_url, api_key=API_KEY)
        cand = sentinel.save(sentinel.measure(svc, prompt_file=prompt_file, release=release(2, SHORTER), **PROBE),
                             tmp_path / "b.json")
    assert main(["bench", "sentinel", "--baseline", str(baseline[0]), "--candidate", str(cand)]) == 1
    out, err = capsys.readouterr()
    assert "REGRESSION code: acceptance_length fell" in out
    assert "likely cause: the flags changed" in out and "prompt_lookup_max" in out
    assert "speed regression beyond noise in code" in err
    verdict = sentinel.compare(sentinel.load(baseline[0]), sentinel.load(cand))
    # acceptance is deterministic at temperature 0: only the code category's moved (decode speed is the
    # machine's and may be judged either way between two server starts)
    assert {r["category"] for r in verdict["regressions"] if r["figure"] != "decode_tok_s"} == {"code"}
    code = {r["figure"]: r for r in verdict["rows"] if r["category"] == "code"}
    assert code["acceptance_length"]["b"] < code["acceptance_length"]["a"]
    assert code["acceptance_length"]["b"] == pytest.approx(1.0)  # every draft rejected
