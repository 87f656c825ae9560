"""Patch 2: skinny GEMM for decode-time BF16 linears and lm_heads (switch: ``skinny_gemm.enabled``).

After a model is loaded (target and draft alike, see ``loader_hook``), every ``LinearBase`` whose
quant method is exactly ``UnquantizedLinearMethod`` and every ``ParallelLMHead`` with exactly
``UnquantizedEmbeddingMethod``, BF16, whose local (N, K) has a plan for this device, gets its quant
method's class swapped to a subclass whose ``apply`` calls the custom op ``torch.ops.vllm.spark_skinny_gemm``.
The op (registered with a fake implementation, so it is opaque to torch.compile and capturable in CUDA
graphs) looks up (capability, N, K, M): a planned, shape-valid config on a CUDA tensor runs vLLM's CuTe-DSL
``shape_dynamic_skinny_gemm``; everything else runs ``F.linear``. On a CPU no layer is swapped at all.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import skinny_plans
from ._util import info

OP_NAME = "spark_skinny_gemm"
_state = {"capability": "unset", "registered": False, "kernel": None}


def _capability() -> tuple[int, int] | None:
    if _state["capability"] == "unset":
        cap = None
        try:
            from vllm.platforms import current_platform

            if current_platform.is_cuda():
                c = current_platform.get_device_capability()
                cap = (c.major, c.minor) if c is not None else None
        except Exception:  # noqa: BLE001
            cap = None
        _state["capability"] = cap
    return _state["capability"]  # type: ignore[return-value]


def _kernel():
    """vLLM's CuTe-DSL skinny GEMM (0.33+ with cutlass-dsl), else None."""
    if _state["kernel"] is None:
        try:
            from vllm.model_executor.kernels.linear.cute_dsl.skinny_gemm import (
                SkinnyGemmConfig,
                shape_dynamic_skinny_gemm,
            )

            ok = shape_dynamic_skinny_gemm.is_available()
            _state["kernel"] = (shape_dynamic_skinny_gemm, SkinnyGemmConfig) if ok else False
        except Exception:  # noqa: BLE001
            _state["kernel"] = False
    return _state["kernel"] or None


def select(x: torch.Tensor, weight: torch.Tensor, capability=None, plans=skinny_plans.PLANS):
    """The plan to use for this call, or None for ``F.linear`` (shape, dtype, device and layout checks)."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        return None
    if x.dtype != torch.bfloat16 or weight.dtype != torch.bfloat16:
        return None
    plan = skinny_plans.lookup(capability, weight.shape[0], weight.shape[1], x.shape[0], plans)
    if plan is None:
        return None
    if not weight.is_contiguous() or x.stride(1) != 1 or x.stride(0) % plan.vector_width:
        return None
    return plan


def skinny_gemm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The op body: planned kernel on CUDA, ``F.linear`` for everything else."""
    if x.is_cuda and weight.is_cuda:
        plan = select(x, weight, _capability())
        kernel = _kernel() if plan is not None else None
        if kernel is not None and x.data_ptr() % (plan.vector_width * x.element_size()) == 0:
            gemm, Cfg = kernel
            cfg = Cfg(x.shape[0], plan.block_size, plan.outputs_per_block, k_unroll=plan.k_unroll,
                      vector_width=plan.vector_width, static_k=plan.static_k)
            return gemm(x, weight, cfg)
    return F.linear(x, weight)


def _fake(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def register_op() -> None:
    """Register ``torch.ops.vllm.spark_skinny_gemm`` once per process (no CUDA work)."""
    if _state["registered"] or hasattr(torch.ops.vllm, OP_NAME):
        _state["registered"] = True
        return
    from vllm.utils.torch_utils import direct_register_custom_op

    direct_register_custom_op(op_name=OP_NAME, op_func=skinny_gemm, fake_impl=_fake)
    _state["registered"] = True


def _op(x, weight):
    return getattr(torch.ops.vllm, OP_NAME)(x, weight)


# -------------------------------------------------------------------- quant-method subclasses (made lazily)
_classes: dict[type, type] = {}


def _skinny_class(base: type) -> type:
    if base not in _classes:
        def apply(self, layer, x, bias=None):
            if bias is None and x.dim() == 2:
                return _op(x, layer.weight)
            return base.apply(self, layer, x, bias)

        _classes[base] = type(f"SparkSkinny{base.__name__}", (base,), {"apply": apply})
    return _classes[base]


def swap(model: torch.nn.Module, capability, plans=skinny_plans.PLANS) -> list[str]:
    """Swap eligible layers' quant methods in place; return the swapped module names. Idempotent."""
    from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, UnquantizedEmbeddingMethod

    if capability is None:
        return []
    planned = skinny_plans.shapes(capability, plans)
    if not planned:
        return []
    register_op()
    swapped = []
    for name, mod in model.named_modules():
        qm = getattr(mod, "quant_method", None)
        if isinstance(mod, LinearBase):
            base = UnquantizedLinearMethod
        elif isinstance(mod, ParallelLMHead):
            base = UnquantizedEmbeddingMethod
        else:
            continue
        if type(qm) is not base:  # quantized, or already swapped
            continue
        w = getattr(mod, "weight", None)
        if w is None or w.dim() != 2 or w.dtype != torch.bfloat16 or tuple(w.shape) not in planned:
            continue
        qm.__class__ = _skinny_class(base)
        swapped.append(name)
    return swapped


def enable(model: torch.nn.Module, vllm_config, capability="auto") -> None:
    from . import settings as _settings

    if _settings.switched_on(getattr(vllm_config, "additional_config", None), "skinny_gemm") is None:
        return
    cap = _capability() if capability == "auto" else capability
    if cap is None:
        info("skinny_gemm: no CUDA device; F.linear kept for %s", type(model).__name__)
        return
    names = swap(model, cap)
    info("skinny_gemm: %d layers of %s routed through %s (capability %s)", len(names), type(model).__name__,
         OP_NAME, cap)
