"""Patch 2: skinny GEMM for decode-time BF16 linears and lm_heads (switch: ``skinny_gemm.enabled``).

After a model is loaded (target and draft alike, see ``loader_hook``), on a device with plans
(``skinny_plans``) and with vLLM's CuTe-DSL kernel importable:

* a BF16 layer whose quant method is exactly ``UnquantizedLinearMethod`` (a ``LinearBase``, or a
  ``ParallelLMHead``: ModelOpt gives an excluded lm_head that method) or ``UnquantizedEmbeddingMethod``
  (a ``ParallelLMHead``) gets its quant method's class swapped to one whose ``apply`` calls the custom op
  ``torch.ops.vllm.spark_skinny_gemm`` (registered with a fake implementation: opaque to torch.compile,
  capturable in CUDA graphs);
* a layer upstream's qwen4_exp code already routes (``Qwen4ExpLowLatency*Method``) is left to it, and the
  M values our table has and upstream's lacks are added to upstream's table in place
  (``QWEN4_EXP_GEMM_PLANS_BY_CAPABILITY``, read at every call);
* every (N, K, M) so planned is compiled and run once on the layer's own weight against ``F.linear``
  (:func:`check`); a config that fails to compile or disagrees stays on ``F.linear``, reason logged. So
  compilation happens at load, not inside graph capture, and a bad config cannot kill warm-up.

The log line says what was really routed: ``0 layers`` without a device or without the kernel library.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from . import skinny_plans
from ._util import info

OP_NAME = "spark_skinny_gemm"
UPSTREAM_MODULE = "vllm.models.qwen4_exp.nvidia.low_latency_gemm"
_state: dict = {"capability": "unset", "registered": False, "kernel": None, "kernel_error": ""}
_active: dict[tuple[int, int], dict[int, skinny_plans.Plan]] = {}  # (N, K) -> {M: plan} that passed check


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
    """``(shape_dynamic_skinny_gemm, SkinnyGemmConfig)`` from vLLM with cutlass-dsl, else None (reason kept)."""
    if _state["kernel"] is None:
        try:
            from vllm.model_executor.kernels.linear.cute_dsl.skinny_gemm import (
                SkinnyGemmConfig,
                shape_dynamic_skinny_gemm,
            )

            ok = shape_dynamic_skinny_gemm.is_available()
            _state["kernel"] = (shape_dynamic_skinny_gemm, SkinnyGemmConfig) if ok else False
            _state["kernel_error"] = "" if ok else "cutlass-dsl is not importable"
        except Exception as e:  # noqa: BLE001
            _state["kernel"], _state["kernel_error"] = False, f"{type(e).__name__}: {e}"
    return _state["kernel"] or None


def config(cfg_cls, m: int, plan: skinny_plans.Plan):
    return cfg_cls(m, plan.block_size, plan.outputs_per_block, k_unroll=plan.k_unroll,
                   vector_width=plan.vector_width, static_k=plan.static_k)


def _runtime_ok(x: torch.Tensor, weight: torch.Tensor, plan: skinny_plans.Plan) -> bool:
    """The kernel's layout rules for this call (shape rules were checked with the plan)."""
    return (x.dim() == 2 and x.dtype == weight.dtype == torch.bfloat16 and x.is_cuda and weight.is_contiguous()
            and x.shape[1] == weight.shape[1] and x.stride(1) == 1 and x.stride(0) % plan.vector_width == 0
            and x.data_ptr() % (plan.vector_width * x.element_size()) == 0)


def skinny_gemm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The op body: a checked plan on CUDA, ``F.linear`` for everything else."""
    plan = _active.get((weight.shape[0], weight.shape[1]), {}).get(x.shape[0])
    kernel = _kernel() if plan is not None else None
    if kernel is not None and _runtime_ok(x, weight, plan):
        gemm, cfg_cls = kernel
        return gemm(x, weight, config(cfg_cls, x.shape[0], plan))
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


# -------------------------------------------------------------------- quant-method subclasses (made lazily)
_classes: dict[type, type] = {}


def _skinny_class(base: type) -> type:
    if base not in _classes:
        def apply(self, layer, x, bias=None):
            import vllm.envs as envs

            if bias is None and x.dim() == 2 and not envs.VLLM_BATCH_INVARIANT:
                return getattr(torch.ops.vllm, OP_NAME)(x, layer.weight)
            return base.apply(self, layer, x, bias)

        _classes[base] = type(f"SparkSkinny{base.__name__}", (base,), {"apply": apply})
    return _classes[base]


def candidates(model: torch.nn.Module, capability, upstream: dict | None, plans=skinny_plans.PLANS):
    """``(ours, theirs)``: ``ours`` maps a module name to (module, stock method class, {M: plan}) for the
    layers this overlay would route; ``theirs`` maps (N, K) to (weight, {M: plan}) for the M values to add
    to upstream's table for layers upstream already routes."""
    from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, UnquantizedEmbeddingMethod

    ours, theirs = {}, {}
    for name, mod in model.named_modules():
        is_head = isinstance(mod, ParallelLMHead)
        w = getattr(mod, "weight", None)
        if not (is_head or isinstance(mod, LinearBase)) or w is None or w.dim() != 2 or w.dtype != torch.bfloat16 \
                or w.is_meta:
            continue
        shape = (int(w.shape[0]), int(w.shape[1]))
        method = type(getattr(mod, "quant_method", None))
        by_m = skinny_plans.plans_for(capability, *shape, lm_head=is_head, plans=plans)
        if method.__name__.startswith("Qwen4ExpLowLatency") and upstream is not None and shape in upstream:
            extra = {m: p for m, p in by_m.items() if m not in upstream[shape]}
            if extra:
                theirs[shape] = (w, extra)
        elif by_m and (method is UnquantizedLinearMethod or (is_head and method is UnquantizedEmbeddingMethod)):
            ours[name] = (mod, method, by_m)
    return ours, theirs


def check(planned: dict, run, tol: float = 2e-2) -> tuple[dict, list[str]]:
    """Run every planned (N, K, M) once on its layer's weight with ``run(x, weight, m, plan)`` and compare with
    ``F.linear``. Returns ({(N, K): {M: plan}} that passed, ["(N, K) M=m: reason", ...] that did not)."""
    passed: dict = {}
    failed: list[str] = []
    for (n, k), (weight, by_m) in planned.items():
        for m, plan in sorted(by_m.items()):
            x = torch.randn(m, k, dtype=weight.dtype, device=weight.device)
            try:
                ref = F.linear(x, weight).float()
                err = float((run(x, weight, m, plan).float() - ref).abs().max()) / max(float(ref.abs().max()), 1e-6)
                reason = "" if err <= tol else f"max relative error {err:.3g} > {tol}"
            except Exception as e:  # noqa: BLE001 - a config that does not compile falls back
                reason = f"{type(e).__name__}: {str(e)[:200]}"
            if reason:
                failed.append(f"({n}, {k}) M={m}: {reason}")
            else:
                passed.setdefault((n, k), {})[m] = plan
    return passed, failed


def route(model: torch.nn.Module, capability, kernel, upstream: dict | None, plans=skinny_plans.PLANS) -> dict:
    """Check the candidates on the device and route the ones that pass. Returns the figures the log reports."""
    gemm, cfg_cls = kernel
    ours, theirs = candidates(model, capability, upstream, plans)
    planned = {tuple(mod.weight.shape): (mod.weight, by_m) for mod, _, by_m in ours.values()}
    passed, failed = check({**planned, **theirs}, lambda x, w, m, p: gemm(x, w, config(cfg_cls, m, p)))
    for shape in theirs:
        for m, plan in passed.get(shape, {}).items():
            upstream[shape][m] = config(cfg_cls, m, plan)
    routed = []
    for name, (mod, method, _) in ours.items():
        shape = tuple(mod.weight.shape)
        if shape in passed:
            _active.setdefault(shape, {}).update(passed[shape])
            mod.quant_method.__class__ = _skinny_class(method)
            routed.append(name)
    if routed:
        register_op()
    unmeasured = sum(not p.measured for by_m in passed.values() for p in by_m.values())
    return {"routed": routed, "candidates": len(ours), "upstream_added": sum(len(passed.get(s, {})) for s in theirs),
            "checked": sum(len(b) for _, b in {**planned, **theirs}.values()), "unmeasured": unmeasured,
            "failed": failed}


def extend_pin_table(vllm_config, plan_module: str) -> list[tuple[int, int, int]]:
    """A pin with its own plan table (0.34: marked at load, looked up per call by token count): add our entries
    to its GB10 table before the model is built, under its rule (``plans: auto`` = measured entries only),
    instead of swapping kernels. Returns the (N, K, M) added."""
    import importlib

    from . import settings as _settings

    cfg = _settings.switched_on(getattr(vllm_config, "additional_config", None), "skinny_gemm")
    if cfg is None:
        return []
    upstream = importlib.import_module(plan_module)
    table = upstream.SKINNY_GEMM_PLANS_BY_CAPABILITY.setdefault((12, 1), {})
    added = skinny_plans.extend_upstream_table(table, upstream.SkinnyGemmConfig,
                                               only=skinny_plans.MEASURED_034 if cfg.plans == "auto" else None)
    info("skinny_gemm: %d (N, K, M) entries added to %s (plans=%s%s)%s", len(added), plan_module, cfg.plans,
         ": only entries measured on a GB10 under the table's rule, none yet" if cfg.plans == "auto" and not added
         else "", (": " + ", ".join(f"({n}, {k}) M={m}" for n, k, m in added)) if added else "")
    return added


def enable(model: torch.nn.Module, vllm_config, capability="auto") -> None:
    from . import settings as _settings

    if _settings.switched_on(getattr(vllm_config, "additional_config", None), "skinny_gemm") is None:
        return
    what = type(model).__name__
    cap = _capability() if capability == "auto" else capability
    kernel = _kernel() if cap is not None else None
    if kernel is None:
        info("skinny_gemm: 0 layers of %s routed: %s", what, "no CUDA device" if cap is None else _state["kernel_error"])
        return
    upstream_module = sys.modules.get(UPSTREAM_MODULE)  # imported by a qwen4_exp model, never by us
    upstream = upstream_module.QWEN4_EXP_GEMM_PLANS_BY_CAPABILITY.get(cap) if upstream_module else None
    r = route(model, cap, kernel, upstream)
    info("skinny_gemm: %d of %d planned layers of %s routed through %s (capability %s); %d M values added to "
         "upstream's table; %d configs checked on the device, %d of those in use unmeasured; %d failed and use "
         "F.linear%s", len(r["routed"]), r["candidates"], what, OP_NAME, cap, r["upstream_added"], r["checked"],
         r["unmeasured"], len(r["failed"]), (": " + "; ".join(r["failed"])) if r["failed"] else "")
