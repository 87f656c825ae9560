"""Write a copy of the tiny Qwen3-Next + MTP model whose target counts (greedy next token = current + 1) and
whose MTP draft predicts the token after that, so acceptance measures the draft head (run with the vLLM venv).

Every projection that writes into the residual stream is zeroed, so each position's hidden state is its own
token embedding E[t] (norm weights 0: GemmaRMSNorm scales by 1 + w). The shared lm_head row u is E[u - 1]
normalised: the target's argmax after token t is t + 1 (random 64-d rows are far from parallel). The MTP
``fc`` keeps only the embedding half of [norm(embed(next)), norm(hidden)], so the draft after t + 1 says t + 2.

    python counting_model.py SRC_DIR OUT_DIR
"""
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

src, out = Path(sys.argv[1]), Path(sys.argv[2])
shutil.copytree(src, out, dirs_exist_ok=True)
w = load_file(str(src / "model.safetensors"))
g = torch.Generator().manual_seed(0)
embed = torch.randn(w["model.embed_tokens.weight"].shape, generator=g)
w["model.embed_tokens.weight"] = embed.to(torch.bfloat16)
w["lm_head.weight"] = torch.nn.functional.normalize(embed.roll(1, 0), dim=-1).to(torch.bfloat16)
for name in w:
    if name.endswith(("out_proj.weight", "o_proj.weight", "down_proj.weight")) or "norm.weight" in name:
        w[name] = torch.zeros_like(w[name])
fc = torch.zeros_like(w["mtp.fc.weight"])
hidden = fc.shape[0]
fc[:, :hidden] = torch.eye(hidden)
w["mtp.fc.weight"] = fc
save_file(w, str(out / "model.safetensors"), metadata={"format": "pt"})
print("OK", out)
