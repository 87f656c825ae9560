"""`sparkdeploy bench` against a real vLLM CPU server (tiny Qwen3, n-gram speculation, prefix caching on).

One server for the whole module (each start costs 30-50 s). Assertions are about structure, counters and
plausibility, never wall-clock figures.
"""

from __future__ import annotations

import threading

import pytest
import requests

from sparkdeploy.bench import client, compare, prompts
from sparkdeploy.bench.harness import harness
from sparkdeploy.bench.probe import probe
from sparkdeploy.bench.turn2 import turn2
from sparkdeploy.cli import main
from sparkdeploy.errors import BenchError
from tests.support.vllm_server import VllmServer

pytestmark = pytest.mark.engine

NGRAM = '{"method":"ngram","num_speculative_tokens":2,"prompt_lookup_max":3,"prompt_lookup_min":1}'
MAX_MODEL_LEN = 2048  # the tiny model's max_position_embeddings; turn2 scales --prefix-tokens down to fit
API_KEY = "bench-test-key-0123456789"  # the server runs behind a key, as a deployed one should


@pytest.fixture(scope="module")
def server(tiny_models, tmp_path_factory):
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    # a generous start timeout: on a loaded 2-core machine engine start has taken over 3 minutes
    with VllmServer(tiny_models / "tiny-qwen3", max_model_len=MAX_MODEL_LEN, log_path=log, timeout=480,
                    args=["--enforce-eager", "--enable-prefix-caching", "--speculative-config", NGRAM],
                    api_key=API_KEY) as srv:
        yield srv


@pytest.fixture(scope="module")
def service(server):
    return client.discover(server.base_url, api_key=API_KEY)


def test_discover_without_the_key_says_the_api_wants_one(server):
    with pytest.raises(BenchError, match="HTTP 401: the API wants a key"):
        client.discover(server.base_url)


@pytest.fixture(scope="module")
def cats():
    return prompts.load()


def test_discover_reads_model_version_and_length(service):
    assert service.model == "tiny"
    assert service.vllm_version and service.vllm_version.startswith("0.")
    assert service.max_model_len == MAX_MODEL_LEN


@pytest.fixture(scope="module")
def probe_result(service, cats):
    return probe(service, prompts.select(cats, ["code"]), tokens=64, runs=3, warmup=1)


def test_probe_gives_plausible_numbers_from_counter_deltas(probe_result):
    r = probe_result
    assert not r["discarded"]
    assert [run["warmup"] for run in r["runs"]] == [True, False, False, False]
    m = r["metrics"]
    assert m["code/server_decode_tok_s"]["n"] == 3 and m["code/server_decode_tok_s"]["median"] > 0
    assert m["code/ttft_s"]["median"] > 0
    # n-gram speculation with k=2: between 1 and 3 tokens per verify step, two positions in [0, 1]
    assert 1.0 < m["code/acceptance_length"]["median"] <= 3.0
    assert 0 <= m["code/accept_pos1"]["median"] <= m["code/accept_pos0"]["median"] <= 1
    for run in r["runs"]:
        assert run["counters"]["request_success"] == 1
        assert run["counters"]["generation_tokens"] == 64
        assert run["requests"][0]["completion_tokens"] == 64


def test_stray_request_during_a_run_is_discarded_not_averaged(service, cats):
    strays = []

    def stray(group, attempt):
        """Send a stray request and return only once the server streams its first token: a thread that was
        merely started could reach the server after our request had been judged (seen under CI load)."""
        if attempt == 2:  # the second measured run (attempt 0 is the warm-up)
            body = {"model": service.model, "prompt": "stray " * 20, "max_tokens": 200, "temperature": 0,
                    "ignore_eos": True, "stream": True}
            arrived = threading.Event()

            def send():
                with requests.post(service.url + "/v1/completions", json=body, timeout=120,
                                   headers=service.headers, stream=True) as resp:
                    for line in resp.iter_lines():
                        if line.startswith(b"data:"):
                            arrived.set()
                arrived.set()

            t = threading.Thread(target=send)
            t.start()
            strays.append(t)
            assert arrived.wait(120)

    # the stray reached the server before the run is judged: it overlaps ours, or is still running at its end
    r = probe(service, prompts.select(cats, ["code"]), tokens=256, runs=3, warmup=1, on_run_start=stray)
    for t in strays:
        t.join()
    assert len(r["discarded"]) == 1
    reason = r["discarded"][0]["reason"]
    assert "another request" in reason or "still running" in reason or "stray" in reason, reason
    bad = [run for run in r["runs"] if not run["kept"]]
    assert len(bad) == 1 and not bad[0]["warmup"]
    # three kept runs besides the discarded one, and the figures come from them only
    kept = [run for run in r["runs"] if run["kept"] and not run["warmup"]]
    assert len(kept) == 3
    assert r["metrics"]["code/acceptance_length"]["n"] == 3
    assert r["metrics"]["code/acceptance_length"]["values"] == [k["values"]["acceptance_length"] for k in kept]


def test_harness_categories_overall_and_concurrency_sweep(service, cats):
    chosen = prompts.select(cats, ["code", "prose_zh_hant", "tool_json"])
    r = harness(service, chosen, tokens=48, runs=2, warmup=1, concurrency=[1, 4])
    m = r["metrics"]
    assert not r["discarded"], r["discarded"]
    for c in chosen:
        assert m[f"{c.name}/server_decode_tok_s"]["n"] == 2
        assert m[f"{c.name}/acceptance_length"]["median"] > 1
    assert m["overall/server_decode_tok_s" if "overall/server_decode_tok_s" in m else "overall/decode_tok_s"]
    assert m["c4/throughput_tok_s"]["median"] > 0
    for run in r["runs"]:
        if run["group"] == "c4":
            assert run["counters"]["request_success"] == 4
            assert run["peak_running"] <= 4
    assert set(r["peak_check"]) == {"c1", "c4"}


def test_turn2_gets_prefix_cache_hits_only_on_turn_two(service):
    r = turn2(service, [1000], tokens=16, runs=2, warmup=1)
    m = r["metrics"]
    assert not r["discarded"], r["discarded"]
    assert m["prefix1000/prefix_hits_turn1"]["max"] == 0  # a fresh nonce per run: turn one is cold
    assert m["prefix1000/prefix_hits_turn2"]["min"] >= 512  # most of the ~1000-token prefix, in whole blocks
    assert m["prefix1000/prompt_tokens"]["median"] > 1000
    assert m["prefix1000/ttft_turn2_s"]["n"] == 2


def test_compare_same_config_is_within_noise_for_deterministic_acceptance(service, cats, probe_result):
    again = probe(service, prompts.select(cats, ["code"]), tokens=64, runs=3, warmup=1)
    cmp = compare.compare(probe_result, again)
    rows = {row["metric"]: row for row in cmp["rows"]}
    assert rows["code/acceptance_length"]["verdict"] == "within noise"
    assert all(row["verdict"] in ("better", "worse", "within noise", "unknown noise") for row in rows.values())
    assert not cmp["comparability"]


def test_cli_probe_then_compare_and_report(server, tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    key_file = tmp_path / "api.key"
    key_file.write_text(API_KEY + "\n")
    key_file.chmod(0o600)
    for out in (a, b):
        assert main(["bench", "probe", "--url", server.base_url, "--api-key-file", str(key_file), "--tokens", "16",
                     "--runs", "2",
                     "--warmup", "0", "--category", "prose_zh", "--out", str(out)]) == 0
    assert main(["bench", "compare", str(a), str(b)]) == 0
    assert main(["bench", "report", str(a), str(b), "--compare", "--out", str(tmp_path / "rep")]) == 0
    md = (tmp_path / "rep" / "README.md").read_text()
    assert "## Comparison" in md and (tmp_path / "rep" / "acceptance_per_position.png").exists()


def test_watchdog_probes_an_idle_engine_but_adds_nothing_to_real_traffic(server):
    """The head's watchdog (a node file, stdlib only) against the real server: a bench's counter deltas must
    not carry the watchdog's probes, so it probes only when no completion has finished since its last tick."""
    import importlib.util

    from sparkdeploy import paths

    spec = importlib.util.spec_from_file_location("wd", paths.repo_root() / "src/sparkdeploy/node/scripts/watchdog.py")
    wd = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(wd)
    url = server.base_url

    assert not wd.probe_api(url, "tiny", None, 30)["probe_ok"]  # without the node's key the probe is refused
    first = wd.probe_api(url, "tiny", None, 30, API_KEY)  # no earlier tick: probe
    assert first["health_ok"] and first["probe_ok"] and first["probed"] and first["served_total"] is not None
    idle = wd.probe_api(url, "tiny", first["served_total"], 30, API_KEY)  # nothing since: probe again (its own is not traffic)
    assert idle["probed"] and idle["probe_ok"] and idle["served_total"] == first["served_total"] + 1

    server.completion("def main():", max_tokens=4)  # real traffic between two ticks
    busy = wd.probe_api(url, "tiny", idle["served_total"], 30, API_KEY)
    assert busy["probe_ok"] and not busy["probed"]
    assert busy["served_total"] == idle["served_total"] + 1  # exactly our request: the watchdog sent none
