"""Run by test_vllm_integration.py with the vLLM venv python: the skinny swap on real vLLM 0.32 layers."""
import socket, json
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
from spark_overlays import skinny_gemm
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
print("RESULT " + json.dumps(out))
