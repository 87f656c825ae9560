"""The speed sentinel's compare: quiet on an A/A drawn from one noise, loud (naming exactly the category, the
figure and the size) on a planted drop; bad records are input errors naming the file; records come from the
probe machinery (here against the fake vLLM)."""

import json
import random

import pytest

from sparkdeploy.bench import client, prompts, sentinel
from sparkdeploy.cli import main
from sparkdeploy.errors import InputError
from sparkdeploy.node import layout

from .fake_vllm import FakeVllm

# per category: acceptance length, acceptance per position, decode tok/s (a Spark-like spread of figures)
TRUE = {
    "code": (2.6, (0.85, 0.75), 41.0),
    "prose_en": (2.2, (0.70, 0.50), 38.0),
    "prose_zh_hant": (1.6, (0.40, 0.20), 30.0),
    "prose_zh_hans": (1.7, (0.45, 0.25), 33.0),
    "reasoning": (2.4, (0.80, 0.60), 40.0),
}
NOISE = {"acceptance_length": 0.02, "accept_pos": 0.01, "decode_tok_s": 0.4}  # sd of one repeat


def record(seed: int, *, runs: int = 5, drop: dict | None = None, release: dict | None = None) -> dict:
    """A record whose repeats are the true figures plus gaussian noise; `drop` {category: factor} scales one
    category's acceptance (and with it, its decode speed) as a list change would."""
    rng = random.Random(seed)
    cats = {}
    for name, (length, pos, tok_s) in TRUE.items():
        f = (drop or {}).get(name, 1.0)
        cats[name] = {
            "acceptance_length": [1 + (length - 1) * f + rng.gauss(0, NOISE["acceptance_length"]) for _ in range(runs)],
            "accept_pos": [[p * f + rng.gauss(0, NOISE["accept_pos"]) for _ in range(runs)] for p in pos],
            "decode_tok_s": [tok_s * (0.5 + 0.5 * f) + rng.gauss(0, NOISE["decode_tok_s"]) for _ in range(runs)],
            "discarded": 0,
        }
    return {"schema": sentinel.SCHEMA, "created": "2026-12-02T00:00:00+00:00", "release": release or {},
            "service": {"url": "http://head:8000", "model": "m"},
            "settings": {"tokens": 64, "runs": runs, "warmup": 1, "prompt_index": 0, "ignore_eos": True},
            "decode_source": "server", "categories": cats}


def test_a_over_a_from_the_same_noise_is_quiet():
    v = sentinel.compare(record(1), record(2))
    assert not v["regression"] and not v["regressions"] and not v["likely_causes"]
    assert {r["category"] for r in v["rows"]} == set(TRUE)
    assert {r["figure"] for r in v["rows"]} == {"acceptance_length", "accept_pos0", "accept_pos1", "decode_tok_s"}
    loud = [r for r in v["rows"] if r["verdict"] != "within noise"]
    assert not loud, loud


def test_a_planted_drop_names_exactly_that_category_the_figure_and_how_much():
    v = sentinel.compare(record(1), record(2, drop={"prose_zh_hans": 0.6}))
    assert v["regression"]
    assert {r["category"] for r in v["regressions"]} == {"prose_zh_hans"}
    figures = {r["figure"]: r for r in v["regressions"]}
    assert {"acceptance_length", "accept_pos0", "decode_tok_s"} <= set(figures)
    length = figures["acceptance_length"]
    assert length["difference"] == pytest.approx(-0.28, abs=0.05) and length["relative"] < -0.1
    assert abs(length["difference"]) > length["threshold"]  # the bound is the measured noise, not a percentage
    text = sentinel.describe(length)
    assert text.startswith("prose_zh_hans: acceptance_length fell 1.69") and "beyond the noise bound" in text
    # nothing in the records says what changed: the machine, or measure again
    assert v["changes"] == {} and "nothing recorded changed" in v["likely_causes"][0]


def test_a_gain_is_not_a_regression():
    v = sentinel.compare(record(1, drop={"code": 0.7}), record(2))
    assert not v["regression"]
    assert {r["verdict"] for r in v["rows"] if r["category"] == "code"} == {"better"}


def test_the_likely_cause_follows_what_changed_between_the_releases():
    a = record(1, release={"number": 7, "list_sha": "a" * 64, "image": "vllm:0.32.0", "flags": ["--x"]})
    b = record(2, drop={"prose_zh_hant": 0.5},
               release={"number": 8, "list_sha": "b" * 64, "image": "vllm:0.32.0", "flags": ["--x"]})
    v = sentinel.compare(a, b)
    assert v["changes"] == {"list_sha": {"baseline": "a" * 64, "candidate": "b" * 64}}
    assert v["likely_causes"][0].startswith("the draft list changed (aaaaaaaaaaaa -> bbbbbbbbbbbb)")
    assert "prose_zh_hant" in v["likely_causes"][0]
    # passed in explicitly (what `up` knows): the flags, added and removed
    v = sentinel.compare(a, b, changes={"flags": {"baseline": ["--a", "1"], "candidate": ["--a", "2", "--b"]}})
    assert v["likely_causes"] == ["the flags changed (added 2 --b; removed 1): speculative settings decide acceptance"]


def test_a_speed_only_drop_points_at_the_image_first():
    slow = record(2, release={"image": "vllm:0.33.0"})
    for figs in slow["categories"].values():
        figs["decode_tok_s"] = [x * 0.8 for x in figs["decode_tok_s"]]
    v = sentinel.compare(record(1, release={"image": "vllm:0.32.0", "list_sha": "x"}),
                         dict(slow, release={"image": "vllm:0.33.0", "list_sha": "y"}))
    assert {r["figure"] for r in v["regressions"]} == {"decode_tok_s"}
    assert v["likely_causes"][0].startswith("the image changed (vllm:0.32.0 -> vllm:0.33.0): kernels")
    assert "longer list" in v["likely_causes"][-1]


def test_records_that_measured_different_things_are_refused():
    b = record(2)
    b["settings"]["tokens"] = 256
    with pytest.raises(InputError, match=r"settings.tokens 64 \(baseline\) vs 256 \(candidate\)"):
        sentinel.compare(record(1), b)
    other = record(2)
    other["categories"] = {"tool_json": other["categories"]["code"]}
    with pytest.raises(InputError, match="share no category"):
        sentinel.compare(record(1), other)


def test_one_repeat_is_not_judged():
    v = sentinel.compare(record(1, runs=1), record(2, runs=1, drop={"code": 0.5}))
    assert not v["regression"] and len(v["unknown_noise"]) == len(v["rows"])


# --------------------------------------------------------------------------------------------- the command
def write(tmp_path, name, rec):
    p = tmp_path / name
    p.write_text(json.dumps(rec))
    return str(p)


def test_command_exits_0_on_a_over_a_and_1_naming_the_category(tmp_path, capsys):
    base = write(tmp_path, "a.json", record(1, release={"list_sha": "a1"}))
    same = write(tmp_path, "b.json", record(2, release={"list_sha": "a1"}))
    worse = write(tmp_path, "c.json", record(3, drop={"reasoning": 0.5}, release={"list_sha": "c3"}))
    assert main(["bench", "sentinel", "--baseline", base, "--candidate", same]) == 0
    assert "no figure fell beyond noise" in capsys.readouterr().out
    assert main(["bench", "sentinel", "--baseline", base, "--candidate", worse]) == 1
    out, err = capsys.readouterr()
    assert "REGRESSION reasoning: acceptance_length fell" in out
    assert "likely cause: the draft list changed (a1 -> c3)" in out
    assert "speed regression beyond noise in reasoning" in err
    assert main(["bench", "sentinel", "--baseline", base, "--candidate", worse, "--json"]) == 1
    verdict = json.loads(capsys.readouterr().out)
    assert verdict["regression"] and {r["category"] for r in verdict["regressions"]} == {"reasoning"}


def test_command_takes_more_baseline_sessions_into_the_noise(tmp_path):
    base = write(tmp_path, "a.json", record(1))
    more = write(tmp_path, "a2.json", record(4))
    same = write(tmp_path, "b.json", record(2))
    assert main(["bench", "sentinel", "--baseline", base, "--baseline-session", more, "--candidate", same]) == 0


@pytest.mark.parametrize("content, field", [
    ("{not json", "cannot read sentinel record"),
    (json.dumps({"schema": "sparkdeploy.bench/1"}), "schema: expected 'sparkdeploy.sentinel/1'"),
    (json.dumps({"schema": sentinel.SCHEMA, "categories": {}}), "categories: expected"),
    (json.dumps({"schema": sentinel.SCHEMA, "categories": {"code": {"acceptance_length": ["x"]}}}),
     "categories.code.acceptance_length: expected a list of numbers"),
    (json.dumps({"schema": sentinel.SCHEMA, "categories": {"code": {"accept_pos": [1.0]}}}),
     "categories.code.accept_pos: expected a list"),
])
def test_command_exits_2_naming_the_bad_file_and_field(tmp_path, capsys, content, field):
    good = write(tmp_path, "good.json", record(1))
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    assert main(["bench", "sentinel", "--baseline", good, "--candidate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and field in err


def test_command_exits_2_on_a_missing_file_and_on_records_not_alike(tmp_path, capsys):
    good = write(tmp_path, "good.json", record(1))
    assert main(["bench", "sentinel", "--baseline", str(tmp_path / "none.json"), "--candidate", good]) == 2
    assert "none.json: cannot read sentinel record" in capsys.readouterr().err
    other = record(2)
    other["settings"]["prompt_index"] = 1
    assert main(["bench", "sentinel", "--baseline", good, "--candidate", write(tmp_path, "o.json", other)]) == 2
    err = capsys.readouterr().err
    assert "o.json against" in err and "settings.prompt_index" in err


# --------------------------------------------------------------------------------------------- measuring
@pytest.mark.slow  # several seconds: out of the fast unit run, still in `make test`
def test_measure_records_every_category_with_its_repeats_from_the_counters(tmp_path):
    with FakeVllm() as fake:
        svc = client.discover(fake.url)
        a = sentinel.measure(svc, tokens=20, runs=3, warmup=1, release={"number": 3})
        b = sentinel.measure(svc, tokens=20, runs=3, warmup=1, release={"number": 3})
    assert list(a["categories"]) == list(prompts.SENTINEL_CATEGORIES)
    code = a["categories"]["code"]
    # 10 verify steps per request, positions accepted 8 and 5 times (the fake's 0.75 / 0.5, rounded)
    assert code["acceptance_length"] == [2.3] * 3
    assert code["accept_pos"] == [[0.8] * 3, [0.5] * 3]
    assert code["decode_tok_s"] == [pytest.approx(19 / 0.02)] * 3 and a["decode_source"] == "server"
    assert a["release"] == {"number": 3} and a["settings"]["tokens"] == 20
    sentinel.validate(a, "a")
    assert sentinel.load(sentinel.save(a, tmp_path / "r" / "a.json")) == a
    assert not sentinel.compare(a, b)["regression"]


def test_record_command_writes_a_record_with_the_release_facts(tmp_path, capsys):
    out = tmp_path / "rec.json"
    with FakeVllm() as fake:
        assert main(["bench", "record", "--url", fake.url, "--category", "code", "--category", "prose_zh",
                     "--tokens", "20", "--runs", "2", "--warmup", "0", "--release-number", "4", "--image", "v:1",
                     "--flag=--speculative-config", "--flag={}", "--out", str(out)]) == 0
    rec = sentinel.load(out)
    assert list(rec["categories"]) == ["code", "prose_zh_hant", "prose_zh_hans"]
    assert rec["release"] == {"number": 4, "image": "v:1", "flags": ["--speculative-config", "{}"]}
    assert rec["categories"]["code"]["acceptance_length"] == [2.3, 2.3]
    assert main(["bench", "sentinel", "--baseline", str(out), "--candidate", str(out)]) == 0
    # exact figures (every repeat the same) are described as such, not with a float-rounding bound
    worse = json.loads(out.read_text())
    worse["categories"]["code"]["acceptance_length"] = [2.0, 2.0]
    v = sentinel.compare(rec, worse)
    assert sentinel.describe(v["regressions"][0]).endswith("every repeat gave the same figure, so any change is real)")


def test_the_summary_kept_with_a_release_says_what_the_last_check_found():
    first = sentinel.summary(None, None)
    assert not first["regression"] and first["against"] is None and "first record" in first["text"]
    quiet = sentinel.summary(sentinel.compare(record(1), record(2)), 3)
    assert quiet == {"against": 3, "regression": False, "categories": [],
                     "text": "no regression beyond noise against release 3"}
    drop = sentinel.summary(sentinel.compare(record(1, release={"list_sha": "a" * 64}),
                                             record(2, drop={"code": 0.5}, release={"list_sha": "b" * 64})), 3)
    assert drop["regression"] and drop["categories"] == ["code"]
    assert drop["text"].startswith("SPEED REGRESSION against release 3: code: ") and "the draft list changed" in drop["text"]


def test_command_wants_both_files_or_neither(tmp_path, capsys):
    a = sentinel.save(record(1), tmp_path / "a.json")
    assert main(["bench", "sentinel", "--baseline", str(a)]) == 2
    assert "give both --baseline and --candidate, or neither" in capsys.readouterr().err


@pytest.mark.slow  # several seconds: out of the fast unit run, still in `make test`
def test_check_release_keeps_the_record_with_its_verdict_against_the_last_healthy_release(monkeypatch):
    """`up`'s probe after the gate, against the fake vLLM; the head's release files in memory."""
    from types import SimpleNamespace

    from sparkdeploy.model.schema import SentinelConfig
    from sparkdeploy.ops import releases
    from sparkdeploy.remote.connection import Conn, Target

    class Head(Conn):
        def __init__(self):
            self.target, self.files = Target("node1", "h"), {}

        def _put(self, path, data, *, mode, owner):
            self.files[path] = data

        def get(self, path):
            return self.files.get(path)

    head = Head()
    nrs = {"node1": releases.NodeReleases(complete={3: {"image": "img:3"}, 4: {"image": "img:4"}}, current=4,
                                          healthy={3, 4})}
    argv = ["vllm", "serve", "m", "--additional-config",
            json.dumps({"spark_overlays": {"shortlist": {"enabled": True, "sha256": "ab" * 32}}})]
    head.files[f"{releases.rdir(layout.PLAIN, 4)}/node-plan.json"] = json.dumps({"image": "img:4", "node": {"serve_argv": argv}})
    with FakeVllm() as fake:
        how = SentinelConfig(categories=("code", "reasoning"), tokens=20, runs=2, warmup=0)  # inventory `sentinel:`
        cx = SimpleNamespace(head="node1", lay=layout.PLAIN, conn=lambda n: head, scan=lambda: nrs, inv=SimpleNamespace(
            auth=SimpleNamespace(api_key=lambda: None), sentinel=how),
            plan=SimpleNamespace(api_url=fake.url, served_name=None))
        first = sentinel.check_release(cx, 3)
        second = sentinel.check_release(cx, 4)
        again = sentinel.check_release(cx, 4, against=4)  # a rollback to 4: its own record
    assert first["against"] is None and "first record" in first["text"]
    assert releases.read_sentinel(head, layout.PLAIN, 3)["release"] == {"number": 3, "list_sha": None, "image": "img:3",
                                                          "flags": []}  # no node-plan.json: the meta's image
    assert second == {"against": 3, "regression": False, "categories": [],
                      "text": "no regression beyond noise against release 3"}
    assert again["against"] == 4 and not again["regression"]
    kept = releases.read_sentinel(head, layout.PLAIN, 4)
    assert kept["verdict"] == again and kept["release"] == {"number": 4, "list_sha": "ab" * 32, "image": "img:4",
                                                            "flags": argv}  # as the head's release files say
    sentinel.validate(kept, "release 4")
    assert list(kept["categories"]) == ["code", "reasoning"] and all(  # measured as the inventory said
        len(c["acceptance_length"]) == 2 for c in kept["categories"].values()), kept["categories"]
    assert {k: kept["settings"][k] for k in ("tokens", "runs", "warmup")} == {"tokens": 20, "runs": 2, "warmup": 0}
