import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_gpu_kernels_runs_end_to_end_on_the_cpu_at_small_scale():
    """The GPU script is rarely run (a device is lent to few sessions): its whole path must work beforehand."""
    pytest.importorskip("torch")
    out = subprocess.run([sys.executable, str(REPO / "bench/gpu_kernels.py"), "--cpu-smoke", "--iters", "2",
                          "--rounds", "1", "--m", "1,3,5", "--json"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    shapes = {(r["N"], r["K"]) for r in report["rows"]}
    assert len(shapes) >= 8 and len(report["rows"]) == 3 * len(shapes)
    assert not report["failures"] and all(r["linear_err"] < 2e-2 for r in report["rows"])
    assert report["copy_GBps"] > 0 and all(r["skinny_us"] is None for r in report["rows"])  # no kernel on the CPU
    assert [(d["tp"], d["M"]) for d in report["draft_step"]] == [(1, 1), (1, 3), (1, 5), (2, 1), (2, 3), (2, 5)]
    assert all(d["full_us"] > 0 and d["short_us"] > 0 for d in report["draft_step"])


def test_gpu_kernels_exits_0_with_a_message_without_cuda():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: run bench/gpu_kernels.py by hand")
    out = subprocess.run([sys.executable, str(REPO / "bench/gpu_kernels.py")], capture_output=True, text=True)
    assert out.returncode == 0
    assert "no CUDA device" in out.stdout


def test_the_kernel_files_load_from_a_vllm_source_without_vllm_installed():
    pytest.importorskip("torch")
    src = Path("/opt/sparkdeploy/vllm-0.33.0-src")
    if not (src / "vllm" / "model_executor").is_dir():
        pytest.skip("vLLM 0.33.0 source not unpacked")
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from pathlib import Path; import gpu_kernels as g\n"
            "g.stub_vllm_for_kernel(Path(sys.argv[2]))\n"
            "from vllm.model_executor.kernels.linear.cute_dsl.skinny_gemm import SkinnyGemmConfig as C\n"
            "print(C(3, 64, 2, k_unroll=2))")
    out = subprocess.run([sys.executable, "-c", code, str(REPO / "bench"), str(src)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "SkinnyGemmConfig(num_rows=3, block_size=64, outputs_per_block=2, k_unroll=2" in out.stdout
