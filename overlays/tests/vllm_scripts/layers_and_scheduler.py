"""Run by test_vllm_integration.py with the vLLM venv python: the overlays on real vLLM 0.32 objects."""
import socket, types, json
import torch, torch.nn as nn, torch.nn.functional as F
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.distributed import init_distributed_environment, initialize_model_parallel
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
cfg = VllmConfig()
_ctx = set_current_vllm_config(cfg); _ctx.__enter__()
init_distributed_environment(world_size=1, rank=0, distributed_init_method=f"tcp://127.0.0.1:{port}", local_rank=0, backend="gloo")
initialize_model_parallel(1, 1)
from vllm.model_executor.layers.linear import ReplicatedLinear, ColumnParallelLinear, RowParallelLinear
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
from spark_overlays import skinny_gemm, fp8_gdn, prefix_align
out = {}
with set_current_vllm_config(cfg):
    torch.set_default_dtype(torch.bfloat16)
    m = nn.Module()
    m.ba = ReplicatedLinear(2560, 96, bias=False)
    m.other = ReplicatedLinear(2560, 100, bias=False)
    m.head = ParallelLMHead(16384, 2560)
    for p in m.parameters(): nn.init.normal_(p, std=0.02)
    names = skinny_gemm.swap(m, (12, 1))
    out["swapped"] = sorted(names)
    out["again"] = skinny_gemm.swap(m, (12, 1))
    x = torch.randn(3, 2560)
    y = m.ba.quant_method.apply(m.ba, x)
    out["ba_equal"] = bool(torch.equal(y, F.linear(x, m.ba.weight)))
    yh = m.head.quant_method.apply(m.head, x)
    out["head_equal"] = bool(torch.equal(yh, F.linear(x, m.head.weight)))
    out["op"] = hasattr(torch.ops.vllm, "spark_skinny_gemm")
    out["cpu_none"] = skinny_gemm.swap(m, None)
    g = nn.Module(); g.linear_attn = nn.Module()
    g.linear_attn.in_proj_qkvz = ColumnParallelLinear(256, 512, bias=False)
    g.linear_attn.in_proj_ba = ColumnParallelLinear(256, 8, bias=False)
    g.linear_attn.out_proj = RowParallelLinear(256, 256, bias=False)
    for p in g.parameters(): nn.init.normal_(p, std=0.02)
    ref_w = g.linear_attn.in_proj_qkvz.weight.detach().clone()
    out["fp8"] = sorted(fp8_gdn.convert(g))
    out["fp8_again"] = fp8_gdn.convert(g)
    out["fp8_dtype"] = str(g.linear_attn.in_proj_qkvz.weight.dtype)
    out["ba_dtype"] = str(g.linear_attn.in_proj_ba.weight.dtype)
    x = torch.randn(2, 256)
    yq = g.linear_attn.in_proj_qkvz(x)
    yq = yq[0] if isinstance(yq, tuple) else yq
    yr = F.linear(x, ref_w)
    out["fp8_rel_err"] = float((yq.float() - yr.float()).abs().max() / yr.float().abs().max())
# prefix align on the real 0.32 Scheduler method
import vllm.v1.core.sched.scheduler as sm
out["patched"] = prefix_align.patch("0.32.0")
out["patched_again"] = prefix_align.patch("0.32.0")
fn = sm.Scheduler._mamba_block_aligned_split
out["marker"] = getattr(fn, "_spark_overlay", False)
def fake(enabled, look):
    ns = types.SimpleNamespace(
        hash_block_size=64, mamba_partial_cache_hit=False, block_size=64, use_eagle_block_drop=False,
        mamba_has_prefill_checkpoint_blocks=False, max_num_scheduled_tokens=2048,
        scheduler_config=types.SimpleNamespace(long_prefill_token_threshold=0),
        mamba_prefill_checkpoint_alignment=None, mamba_shared_prefix_checkpoint=False,
        cache_config=types.SimpleNamespace(block_size=64), num_prefill_lookahead=look,
        vllm_config=types.SimpleNamespace(additional_config={"spark_overlays": {"prefix_align": {"enabled": enabled}}}))
    return ns
res = []
for start, n, prompt in [(0, 300, 300), (0, 200, 300), (256, 44, 300), (0, 255, 256), (64, 128, 1000), (0, 190, 192)]:
    req = types.SimpleNamespace(num_computed_tokens=start, num_prompt_tokens=prompt, num_tokens=prompt, shared_prefix_boundary=0)
    stock = fn.__wrapped__(fake(False, 2), req, n)
    off = fn(fake(False, 2), req, n)
    on = fn(fake(True, 2), req, n)
    res.append([start, n, prompt, stock, off, on])
out["align"] = res
print("RESULT " + json.dumps(out))
