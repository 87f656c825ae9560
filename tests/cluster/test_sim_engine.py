"""A real two-rank vLLM (CPU) across the two sim nodes, started by hand inside the nodes' own Docker engines.

Worker (rank 1, --headless) on node2 first, head (rank 0) on node1 second; TP=2 over gloo on eth0; the image is
the serving image built from the rendered Dockerfile. n-gram speculation is on (as in the sim-tiny profile), so
the spec-decode counters move. Tests assert structure and equality, never wall-clock times.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request

import pytest

from sparkdeploy.sim import engine as sim_engine

pytestmark = pytest.mark.cluster

ENGINE = "sim-test-vllm"
READY_TIMEOUT = 420  # 2 busy cores: ~30 s alone, several minutes when everything else runs too
PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n" \
         "def fibonacci"


def _get(url: str, timeout: float = 10) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


def _post(url: str, body: dict, timeout: float = 120) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        assert resp.status == 200
        return json.loads(resp.read())


def _wait_healthy(sim_cluster, base: str) -> float:
    from sparkdeploy.errors import SimError

    try:
        return sim_engine.wait_healthy(base, READY_TIMEOUT)
    except SimError as err:
        pytest.fail(f"{err}\n{sim_engine.logs(sim_cluster.cluster, name=ENGINE)}")


def _complete(base: str, max_tokens: int = 24) -> dict:
    return _post(f"{base}/v1/completions", {"model": "tiny", "prompt": PROMPT, "max_tokens": max_tokens,
                                            "temperature": 0})


def _metrics(base: str) -> dict[str, float]:
    status, text = _get(f"{base}/metrics")
    assert status == 200
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"^(vllm:[a-z_]+)(\{[^}]*\})? ([0-9.eE+-]+)$", line)
        if m:
            key = m.group(1) + (m.group(2) or "")
            out[key] = float(m.group(3))
    return out


def _total(metrics: dict[str, float], name: str) -> float:
    return sum(v for k, v in metrics.items() if k == name or k.startswith(name + "{"))


@pytest.fixture(scope="module")
def tiny_engine(sim_cluster, sim_engine_loaded, sim_timings):
    """The pair running; yields the API base URL. Removed at the end of the module."""
    # The image again where a module before this one took it away (test_image_layers empties the worker's
    # Docker engine); nodes that hold it are skipped.
    sim_cluster.cluster.preload(sim_engine_loaded)
    t0 = time.monotonic()
    # Ports of its own (8011/29511), so a deployment's engine on the same session cluster cannot collide with it.
    base = sim_engine.start_pair(sim_cluster.cluster, sim_engine_loaded, speculative=sim_engine.NGRAM, name=ENGINE,
                                 api_port=8011, master_port=29511)
    _wait_healthy(sim_cluster, base)
    sim_timings["engine start (docker run -> /health 200)"] = round(time.monotonic() - t0, 1)
    yield base
    sim_engine.stop_pair(sim_cluster.cluster, name=ENGINE)


def test_health_and_models(tiny_engine):
    assert _get(f"{tiny_engine}/health")[0] == 200
    status, body = _get(f"{tiny_engine}/v1/models")
    assert status == 200
    models = json.loads(body)["data"]
    assert [m["id"] for m in models] == ["tiny"] and models[0]["max_model_len"] == 512


def test_metrics_are_real_and_spec_decode_counters_move(tiny_engine):
    before = _metrics(tiny_engine)
    for name in ("vllm:num_requests_running", "vllm:request_success_total", "vllm:generation_tokens_total",
                 "vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_accepted_tokens_total",
                 "vllm:prefix_cache_queries_total"):
        assert any(k == name or k.startswith(name + "{") for k in before), f"{name} missing from /metrics"
    n = 3
    for _ in range(n):
        out = _complete(tiny_engine, max_tokens=32)
        assert out["usage"]["completion_tokens"] == 32
    after = _metrics(tiny_engine)
    assert _total(after, "vllm:request_success_total") - _total(before, "vllm:request_success_total") == n
    assert _total(after, "vllm:generation_tokens_total") - _total(before, "vllm:generation_tokens_total") == 32 * n
    drafts = _total(after, "vllm:spec_decode_num_drafts_total") - _total(before, "vllm:spec_decode_num_drafts_total")
    drafted = (_total(after, "vllm:spec_decode_num_draft_tokens_total")
               - _total(before, "vllm:spec_decode_num_draft_tokens_total"))
    accepted = (_total(after, "vllm:spec_decode_num_accepted_tokens_total")
                - _total(before, "vllm:spec_decode_num_accepted_tokens_total"))
    assert drafts > 0 and drafted > 0, "n-gram speculation proposed nothing"
    assert 0 < accepted <= drafted, "a repetitive random model should accept some n-gram drafts"


def test_greedy_completion_identical_across_restart(sim_cluster, tiny_engine):
    first = _complete(tiny_engine)
    text = first["choices"][0]["text"]
    assert first["usage"]["completion_tokens"] == 24 and text
    assert first["system_fingerprint"].startswith("vllm-0.32.0")
    head, worker = sim_cluster.head, sim_cluster.worker
    # Restart both ranks as one unit: head down, worker restarted, head started (workers first).
    sim_cluster.ssh(head, f"docker stop {ENGINE}", check=True, timeout=120)
    sim_cluster.ssh(worker, f"docker restart {ENGINE}", check=True, timeout=120)
    sim_cluster.ssh(head, f"docker start {ENGINE}", check=True, timeout=120)
    _wait_healthy(sim_cluster, tiny_engine)
    again = _complete(tiny_engine)
    assert again["choices"][0]["text"] == text
    assert again["usage"] == first["usage"]
