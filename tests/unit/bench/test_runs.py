"""Measured runs against a fake vLLM: kept when the counters prove only our requests ran, discarded (and
not averaged in) after a server restart or a stray request."""

import pytest

from sparkdeploy.bench import client, prompts
from sparkdeploy.bench.harness import harness
from sparkdeploy.bench.probe import probe
from sparkdeploy.bench.run import wait_idle
from sparkdeploy.bench.turn2 import turn2
from sparkdeploy.errors import BenchError

from .fake_vllm import FakeVllm


@pytest.fixture
def fake():
    with FakeVllm() as f:
        yield f


@pytest.fixture
def code():
    return prompts.select(prompts.load(), ["code"])


def test_clean_probe_keeps_every_run_and_reads_acceptance_from_counters(fake, code):
    svc = client.discover(fake.url)
    assert (svc.model, svc.vllm_version, svc.max_model_len) == ("fake", "0.0.0-fake", 4096)
    r = probe(svc, code, tokens=40, runs=3, warmup=1)
    assert not r["discarded"] and len(r["runs"]) == 4
    m = r["metrics"]
    # 20 verify steps per request, positions accepted 15 and 10 times -> 1 + 25/20
    assert m["code/acceptance_length"]["values"] == [2.25] * 3
    assert m["code/accept_pos0"]["median"] == 0.75 and m["code/accept_pos1"]["median"] == 0.5
    assert m["code/server_decode_tok_s"]["median"] == pytest.approx(39 / 0.04)
    # client-side figures only from streams that were not bunched (a loaded test machine can stall the client)
    unbunched = sum(not q["bunched"] for run in r["runs"][1:] for q in run["requests"])
    assert m.get("code/decode_tok_s", {}).get("n", 0) == unbunched
    assert r["runs"][1]["requests"][0]["completion_tokens"] == 40


def test_server_restart_during_a_run_discards_it(fake, code):
    def restart(group, attempt):
        if attempt == 2:
            fake.restart()

    r = probe(client.discover(fake.url), code, tokens=20, runs=3, warmup=1, on_run_start=restart)
    assert len(r["discarded"]) == 1
    assert r["discarded"][0]["reason"].startswith("counter reset")
    assert r["metrics"]["code/acceptance_length"]["n"] == 3  # the three other runs


def test_stray_request_finishing_during_a_run_discards_it(fake, code):
    def stray(group, attempt):
        if attempt in (1, 3):
            fake.finish_stray()

    r = probe(client.discover(fake.url), code, tokens=20, runs=3, warmup=1, on_run_start=stray)
    assert [d["reason"] for d in r["discarded"]] == [
        "vllm:request_success_total rose by 2, expected 1: another request ran during the run"] * 2
    kept = [run for run in r["runs"] if run["kept"] and not run["warmup"]]
    assert len(kept) == 3 and r["metrics"]["code/ttft_s"]["n"] == 3


def test_gives_up_after_as_many_discards_as_runs(fake, code):
    r = probe(client.discover(fake.url), code, tokens=10, runs=2, warmup=0,
              on_run_start=lambda g, a: fake.finish_stray())
    assert len(r["discarded"]) == 3 and "code/ttft_s" not in r["metrics"]


def test_busy_engine_is_never_measured(fake):
    fake.c["running"] = 1
    with pytest.raises(BenchError, match="still busy"):
        wait_idle(client.discover(fake.url), timeout=0.3)


def test_harness_concurrency_counts_every_stream(fake):
    cats = prompts.select(prompts.load(), ["code", "tool_json"])
    r = harness(client.discover(fake.url), cats, tokens=30, runs=2, warmup=0, concurrency=[1, 3],
                watch_interval=0.01)
    m = r["metrics"]
    assert not r["discarded"]
    assert m["c3/throughput_tok_s"]["n"] == 2
    assert "code/throughput_tok_s" not in m  # one stream per category run: no throughput figure
    for run in r["runs"]:
        expect = {"c3": 3, "c1": 1}.get(run["group"], len(cats[0].prompts))
        assert run["counters"]["request_success"] == expect
    assert m["overall/decode_tok_s"]["n"] == 2
    assert r["peak_check"]["c3"]["concurrency"] == 3


def test_turn2_hits_come_from_turn_one_only(fake):
    r = turn2(client.discover(fake.url), [200], tokens=8, runs=2, warmup=1)
    m = r["metrics"]
    assert not r["discarded"]
    assert m["prefix200/prefix_hits_turn1"]["max"] == 0
    assert m["prefix200/prefix_hits_turn2"]["min"] >= 160


def test_turn2_refuses_a_prefix_longer_than_the_model(fake):
    with pytest.raises(BenchError, match="max_model_len 4096"):
        turn2(client.discover(fake.url), [5000])


def test_unreachable_service_is_a_bench_error():
    with pytest.raises(BenchError, match="cannot list models"):
        client.discover("http://127.0.0.1:9", timeout=1)


@pytest.mark.slow  # several seconds: out of the fast unit run, still in `make test`
def test_request_still_running_after_the_run_discards_it(fake, code):
    # the judge re-reads /metrics every 0.05 s for at most 3 s (60 reads): 80 outlast it, then the next
    # run's idle wait sees the engine idle again
    r = probe(client.discover(fake.url), code, tokens=10, runs=2, warmup=0,
              on_run_start=lambda g, a: a == 1 and fake.linger(80))
    assert len(r["discarded"]) == 1
    assert "still running or waiting" in r["discarded"][0]["reason"]
    assert r["metrics"]["code/ttft_s"]["n"] == 2


def test_gauge_lagging_by_a_step_is_not_a_stray(fake, code):
    r = probe(client.discover(fake.url), code, tokens=10, runs=2, warmup=0,
              on_run_start=lambda g, a: fake.linger(2))
    assert not r["discarded"]
