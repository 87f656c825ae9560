import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_gpu_kernels_exits_0_with_a_message_without_cuda():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: run bench/gpu_kernels.py by hand")
    out = subprocess.run([sys.executable, str(REPO / "bench/gpu_kernels.py")], capture_output=True, text=True)
    assert out.returncode == 0
    assert "no CUDA device" in out.stdout
