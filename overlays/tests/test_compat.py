import pytest

from spark_overlays import compat


@pytest.mark.parametrize("version", ["0.32.0", "0.32.0+cpu", "0.33.0", "0.33.2rc1", "v0.33.1+cu130"])
def test_every_feature_has_a_mode(version):
    for feature in compat.FEATURES:
        assert compat.mode(version, feature) in (compat.NATIVE, compat.OVERLAY)


def test_expected_table():
    assert compat.mode("0.33.0", "fp8_gdn") == "native"
    assert compat.mode("0.33.0", "prefix_align") == "native"
    assert compat.mode("0.32.0", "prefix_align") == "native"  # the overlay changed nothing on 0.32: deleted
    assert compat.mode("0.32.0", "shortlist") == "overlay"
    assert compat.mode("0.33.0", "skinny_gemm") == "overlay"
    flags = compat.native_flags("0.33.0", "fp8_gdn")
    assert flags[:3] == ["--quantization", "online", "--quantization-config"]
    assert "in_proj_qkvz" in flags[3] and "out_proj" in flags[3] and "in_proj_ba" not in flags[3]


def test_native_quant_config_is_json_with_escaped_dot():
    import json
    import re

    cfg = json.loads(compat.FP8_GDN_QUANT_CONFIG)
    pats = [p[3:] for p in cfg["targets"]]
    assert re.fullmatch(pats[0], "model.layers.3.linear_attn.in_proj_qkvz")
    assert not any(re.fullmatch(p, "model.layers.3.linear_attn.in_proj_ba") for p in pats)


@pytest.mark.parametrize("version", ["0.31.9", "1.0.0", "garbage"])
def test_unsupported_version_is_a_clear_error(version):
    with pytest.raises(compat.CompatError, match="spark_overlays|parse"):
        compat.mode(version, "shortlist")


def test_unknown_feature():
    with pytest.raises(compat.CompatError, match="unknown feature"):
        compat.mode("0.33.0", "warp_drive")


def test_compat_imports_no_vllm_or_torch():
    import subprocess
    import sys

    code = "import sys, spark_overlays.compat; print('torch' in sys.modules, 'vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
