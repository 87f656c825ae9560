"""Patch 3: FP8 E4M3 GDN projection weights (switch: ``fp8_gdn.enabled``).

Where the pinned vLLM has online quantization with per-layer ``targets`` (0.32 and 0.33 both do, see
``compat``), the planner renders ``--quantization online --quantization-config {targets...}`` and this
overlay stays idle. For a pin without it, after load every BF16 ``linear_attn.in_proj_qkvz`` and
``linear_attn.out_proj`` (never ``in_proj_ba``) is converted to FP8 E4M3 with one scale per output channel;
its quant method becomes a weight-only method that dequantizes into ``F.linear`` (correct everywhere;
bytes stored halve, a fused W8A16 GEMV is future work).
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F

from ._util import info

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
TARGET_RE = re.compile(r"(^|\.)linear_attn\.(in_proj_qkvz|out_proj)$")


def quantize_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w [N, K]`` -> (FP8 E4M3 ``[N, K]``, fp32 scale ``[N, 1]``) with ``w ≈ q * scale``."""
    wf = w.float()
    amax = wf.abs().amax(dim=1, keepdim=True).clamp(min=1e-12)
    scale = amax / FP8_MAX
    q = (wf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype=torch.bfloat16) -> torch.Tensor:
    return (q.float() * scale).to(dtype)


def is_target(name: str) -> bool:
    return bool(TARGET_RE.search(name))


_classes: dict[type, type] = {}


def _fp8_class(base: type) -> type:
    if base not in _classes:
        def apply(self, layer, x, bias=None):
            w = dequantize(layer.weight, layer.spark_weight_scale, x.dtype)
            return F.linear(x, w, bias)

        _classes[base] = type(f"SparkFp8WeightOnly{base.__name__}", (base,), {"apply": apply})
    return _classes[base]


def convert(model: torch.nn.Module) -> list[str]:
    """Convert the target projections in place; return their names. Idempotent (FP8 weights are skipped)."""
    from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod

    done = []
    for name, mod in model.named_modules():
        if not (isinstance(mod, LinearBase) and is_target(name)):
            continue
        if type(getattr(mod, "quant_method", None)) is not UnquantizedLinearMethod:
            continue
        w = mod.weight
        if w.dtype not in (torch.bfloat16, torch.float16):
            continue
        q, scale = quantize_per_channel(w.data)
        mod.weight = torch.nn.Parameter(q, requires_grad=False)
        mod.register_buffer("spark_weight_scale", scale, persistent=False)
        mod.quant_method.__class__ = _fp8_class(UnquantizedLinearMethod)
        done.append(name)
    return done


def enable(model: torch.nn.Module, vllm_config, vllm_version: str) -> None:
    from . import compat
    from . import settings as _settings

    if _settings.switched_on(getattr(vllm_config, "additional_config", None), "fp8_gdn") is None:
        return
    if compat.mode(vllm_version, "fp8_gdn") == compat.NATIVE:
        info("fp8_gdn: native on vLLM %s (render %s); overlay not applied", vllm_version,
             " ".join(compat.native_flags(vllm_version, "fp8_gdn")[:2]))
        return
    names = convert(model)
    info("fp8_gdn: %d GDN projections converted to FP8 E4M3 (per-channel) in %s", len(names), type(model).__name__)
