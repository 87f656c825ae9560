"""What a checkpoint's own files say about its weights, and what that means for vLLM's quantization flags. Pure.

vLLM takes a pre-quantized checkpoint's method from its `config.json` (`quantization_config.quant_method`) or
ModelOpt's `hf_quant_config.json`; a `--quantization` flag on top is at best ignored (ModelOpt overrides it)
and at worst refused at config time (compressed-tensors with `--quantization online`). So FP8 GDN weights, which
vLLM does with online quantization, apply only to an unquantized (BF16) checkpoint with GDN layers.

Formats (`checkpoint.format` in a profile, or read from the head's checkpoint by the planner's facts):

    bf16                 unquantized 16/32-bit weights (no quantization_config)
    modelopt_fp4         ModelOpt NVFP4          modelopt_fp8   ModelOpt FP8
    compressed-tensors   llm-compressor output   fp8            block/channel FP8 (e.g. Qwen *-FP8)
    mxfp4                gpt-oss                 awq, gptq, bitsandbytes, gguf, ...: other quant_method values
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

UNQUANTIZED = "bf16"
KNOWN_FORMATS = (UNQUANTIZED, "modelopt_fp4", "modelopt_fp8", "compressed-tensors", "fp8", "mxfp4", "awq", "gptq",
                 "bitsandbytes", "gguf", "torchao", "quark")
# model_type values of the hybrid families whose GDN projections the FP8 targets name (linear_attn.*)
GDN_MODEL_TYPES = ("qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text", "qwen4_exp")


@dataclass(frozen=True)
class Checkpoint:
    format: str
    source: str  # "profile" (checkpoint.format) | "head:<dir>" (read from the files) | "unknown"
    has_gdn: bool | None = None  # None: not known (declared in a profile, no config read)


def _modelopt_format(algo: Any) -> str:
    text = str(algo or "").upper()
    return "modelopt_fp4" if "FP4" in text else "modelopt_fp8" if "FP8" in text else f"modelopt_{text.lower() or 'unknown'}"


def _has_gdn(config: Mapping[str, Any]) -> bool:
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else config
    layer_types = text.get("layer_types") or config.get("layer_types") or ()
    if isinstance(layer_types, (list, tuple)) and "linear_attention" in layer_types:
        return True
    return str(text.get("model_type") or config.get("model_type") or "") in GDN_MODEL_TYPES


def detect(config: Mapping[str, Any], hf_quant_config: Mapping[str, Any] | None = None, *,
           source: str = "files") -> Checkpoint:
    """The checkpoint's format from its config.json and (ModelOpt) hf_quant_config.json contents."""
    if hf_quant_config:
        quant = hf_quant_config.get("quantization") or {}
        return Checkpoint(_modelopt_format(quant.get("quant_algo")), source, _has_gdn(config))
    qc = config.get("quantization_config")
    if not isinstance(qc, Mapping) and isinstance(config.get("text_config"), Mapping):
        qc = config["text_config"].get("quantization_config")
    if not isinstance(qc, Mapping) or not qc:
        return Checkpoint(UNQUANTIZED, source, _has_gdn(config))
    method = str(qc.get("quant_method") or "unknown").lower()
    if method in ("modelopt", "modelopt_fp4"):
        return Checkpoint(_modelopt_format(qc.get("quant_algo") or ("FP4" if method.endswith("fp4") else "")),
                          source, _has_gdn(config))
    return Checkpoint(method.replace("_", "-") if method == "compressed_tensors" else method, source,
                      _has_gdn(config))


def fp8_gdn_applies(ckpt: Checkpoint | None) -> tuple[bool, str]:
    """Whether online FP8 for the GDN projections applies to this checkpoint, and why not when it does not."""
    if ckpt is None:
        return False, ("checkpoint format unknown: declare checkpoint.format in the profile (`up` reads it from "
                       "the checkpoint's config.json on the head)")
    if ckpt.format != UNQUANTIZED:
        return False, (f"checkpoint is pre-quantized ({ckpt.format}): vLLM takes its quantization from the "
                       "checkpoint, so no --quantization flag is rendered")
    if ckpt.has_gdn is False:
        return False, "the model has no GDN (linear attention) layers for the FP8 targets"
    return True, ""
