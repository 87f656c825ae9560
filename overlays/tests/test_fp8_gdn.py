import pytest

torch = pytest.importorskip("torch")

from spark_overlays.fp8_gdn import FP8_MAX, dequantize, is_target, quantize_per_channel  # noqa: E402


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("shape", [(64, 128), (96, 2560), (17, 33)])
def test_fp8_round_trip_within_e4m3_bounds(seed, shape):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(*shape, generator=g) * torch.logspace(-3, 1, shape[0]).unsqueeze(1)).to(torch.bfloat16)
    q, scale = quantize_per_channel(w)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (shape[0], 1)
    back = dequantize(q, scale, torch.float32)
    wf = w.float()
    # E4M3: 3 mantissa bits -> relative rounding error <= 2^-4 for normals; subnormal step is 2^-9 * scale
    bound = torch.maximum(wf.abs() * 2.0**-4, scale * 2.0**-10) * 1.001 + 1e-12
    assert ((back - wf).abs() <= bound).all()
    # per-channel scale: every row's max maps to the E4M3 max
    assert torch.allclose(q.float().abs().amax(dim=1), torch.full((shape[0],), FP8_MAX))


def test_zero_row_is_safe():
    q, scale = quantize_per_channel(torch.zeros(3, 16, dtype=torch.bfloat16))
    assert torch.equal(dequantize(q, scale, torch.float32), torch.zeros(3, 16))


@pytest.mark.parametrize("name, hit", [
    ("model.layers.0.linear_attn.in_proj_qkvz", True),
    ("model.layers.12.linear_attn.out_proj", True),
    ("model.layers.0.linear_attn.in_proj_ba", False),
    ("model.layers.3.self_attn.o_proj", False),
    ("model.layers.0.linear_attn.out_proj_extra", False),
])
def test_targets_leave_ba_in_bf16(name, hit):
    assert is_target(name) is hit
