"""Run by test_shortlist_head.py with the vLLM venv python: the real patched MTP draft class, built by vLLM's
own model initialiser from the tiny Qwen3-Next config (float32, so argmax ties cannot differ by rounding)."""
import json, socket, sys
import torch
import torch.nn.functional as F
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.distributed import init_distributed_environment, initialize_model_parallel
from vllm.engine.arg_utils import EngineArgs
from vllm.model_executor.model_loader.utils import initialize_model, process_weights_after_loading
import spark_overlays
from spark_overlays import vocab_list

model_dir, list_path = sys.argv[1], sys.argv[2]
spark_overlays.register()


def load(model, weights):
    """What the default loader does: the model's load_weights, then the per-layer post-processing."""
    model.load_weights(weights)
    process_weights_after_loading(model, model.vllm_config.model_config, torch.device("cpu"))


def build(shortlist: bool, **extra):
    setting = {"enabled": shortlist, "path": list_path, **extra}
    cfg = EngineArgs(model=model_dir, dtype="float32", enforce_eager=True, max_model_len=256,
                     speculative_config={"method": "mtp", "num_speculative_tokens": 1},
                     additional_config={"spark_overlays": {"shortlist": setting}},
                     ).create_engine_config()
    with set_current_vllm_config(cfg):
        return initialize_model(vllm_config=cfg, model_config=cfg.speculative_config.draft_model_config)


s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
with set_current_vllm_config(VllmConfig()):
    init_distributed_environment(world_size=1, rank=0, distributed_init_method=f"tcp://127.0.0.1:{port}",
                                 local_rank=0, backend="gloo")
    initialize_model_parallel(1, 1)
torch.manual_seed(0)
out = {}
draft = build(True)
vocab, hidden_size = draft.config.vocab_size, draft.config.hidden_size
full = torch.randn(vocab, hidden_size)
out["class"] = type(draft).__name__
load(draft, [("lm_head.weight", full.clone())])
ids = torch.as_tensor(vocab_list.read_ids(list_path), dtype=torch.long)
hidden = torch.randn(96, hidden_size)
full_top = F.linear(hidden, full).argmax(-1)
listed = torch.isin(full_top, ids)
top = draft.get_top_tokens(hidden)
out.update(active=draft._spark_active, own_head=getattr(draft, "has_own_lm_head", None), rows=int(draft.lm_head.org_vocab_size),
           on_list=int(listed.sum()), top_on_list_equal=bool(torch.equal(top[listed], full_top[listed])),
           top_is_listed_argmax=bool(torch.equal(top, ids[F.linear(hidden, full[ids]).argmax(-1)])),
           scatter_equal=bool(torch.equal(draft.compute_logits(hidden).argmax(-1), top)))
draft.draft_id_to_target_id.copy_(torch.roll(draft.draft_id_to_target_id, 1))  # a wrong id mapping
wrong = draft.get_top_tokens(hidden)
out["wrong_on_list_mismatches"] = int((wrong[listed] != full_top[listed]).sum())

stock_fallback = build(True)  # only a packed (NVFP4-like) head in the stream: back to stock before the runner looks
load(stock_fallback, [("lm_head.weight", torch.zeros(vocab, hidden_size // 2, dtype=torch.uint8)),
                      ("lm_head.weight_scale", torch.ones(vocab, hidden_size // 16))])
out.update(fallback_active=stock_fallback._spark_active, fallback_own_head=stock_fallback.has_own_lm_head,
           fallback_rows=int(stock_fallback.lm_head.org_vocab_size),
           fallback_d2t=hasattr(stock_fallback, "draft_id_to_target_id"))

# a capacity above the list: 100 padding rows with zero weights. Every listed logit is negative here, so a
# padding row's 0 would win the argmax were its -inf bias missing
padded = build(True, capacity=len(ids) + 100)
negative, positive = -full.abs(), hidden.abs()
load(padded, [("lm_head.weight", negative.clone())])
listed_top = ids[F.linear(positive, negative[ids]).argmax(-1)]
out.update(padded_rows=int(padded.lm_head.org_vocab_size),
           padded_top_equal=bool(torch.equal(padded.get_top_tokens(positive), listed_top)),
           padded_scatter_equal=bool(torch.equal(padded.compute_logits(positive).argmax(-1), listed_top)),
           padded_unmasked_padding_wins=bool((F.linear(positive, padded.lm_head.weight).argmax(-1) >= len(ids)).all()))

off = build(False)  # shortlist off: the stock head keeps local argmax (TP=1 here)
load(off, [("lm_head.weight", full.clone())])
out.update(off_class=type(off).__name__, off_top_equal=bool(torch.equal(off.get_top_tokens(hidden), full_top)))
print("RESULT " + json.dumps(out))
