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
    assert all(d["full_us"] > 0 and d["short_us"] > 0 and d["fp8_us"] is None for d in report["draft_step"])
    assert report["wins_034_rule"] == []  # nothing timed against the kernel on the CPU


def test_gpu_kernels_exits_0_with_a_message_without_cuda():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: run bench/gpu_kernels.py by hand")
    out = subprocess.run([sys.executable, str(REPO / "bench/gpu_kernels.py")], capture_output=True, text=True)
    assert out.returncode == 0
    assert "no CUDA device" in out.stdout


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_the_kernel_files_load_from_a_vllm_source_without_vllm_installed(version):
    pytest.importorskip("torch")
    src = Path(f"/opt/sparkdeploy/vllm-{version}-src")
    if not (src / "vllm" / "model_executor").is_dir():
        pytest.skip(f"vLLM {version} source not unpacked (scripts/setup.sh)")
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from pathlib import Path; import gpu_kernels as g\n"
            "g.stub_vllm_for_kernel(Path(sys.argv[2]))\n"
            "from vllm.model_executor.kernels.linear.cute_dsl.skinny_gemm import SkinnyGemmConfig as C\n"
            "print(C(3, 64, 2, k_unroll=2))")
    out = subprocess.run([sys.executable, "-c", code, str(REPO / "bench"), str(src)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "SkinnyGemmConfig(num_rows=3, block_size=64, outputs_per_block=2, k_unroll=2" in out.stdout


def test_draft_head_lever_table_prints_bytes_for_every_lever_and_cpu_time_for_bf16():
    pytest.importorskip("torch")
    out = subprocess.run([sys.executable, str(REPO / "bench/draft_head_levers.py"), "--scale", "64", "--iters", "1",
                          "--json"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    rows = {(r["lever"], r["tp"]): r for r in json.loads(out.stdout)["rows"]}
    assert len(rows) == 2 * 12  # full, 3 shortlists, fp8, nvfp4, 6 stacked; at TP 1 and 2
    full, nvfp4 = rows[("full head BF16 (stock MTP)", 1)], rows[("full head nvfp4 (draft_lm_head_quantization)", 1)]
    vocab, hidden = 248320 // 64, 2560
    assert full["bytes"] == vocab * hidden * 2 + hidden * 2 + vocab * 2
    assert nvfp4["bytes"] == vocab * hidden // 2 + vocab * hidden // 16 + 4 + hidden * 2 + vocab * 2
    assert rows[("shortlist 16k BF16", 2)]["bytes"] < rows[("shortlist 16k BF16", 1)]["bytes"]
    assert all(r["cpu_us"] > 0 for r in rows.values() if r["format"] == "bf16")
    assert all(r["cpu_us"] is None for r in rows.values() if r["format"] != "bf16")  # no CPU kernel: not timed
    assert not any(r["on_034"] for (label, _), r in rows.items() if "+" in label)  # 0.34 cannot stack them
