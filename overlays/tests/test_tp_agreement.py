"""Fail closed together: one rank rejecting the list disables the shortlist on every rank, and a live swap
starts only when every rank sees the same list pointer (gloo, 2 processes).

The ranks meet through a file store, not a TCP port: a port found free and then closed can be taken by another
test worker, and the TCP store's server thread on rank 0 aborted the process once in CI ("terminate called without
an active exception") when rank 1 tore down first. Both ranks pass a barrier before tearing down for the same
reason."""

import sys
import types

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402


CASES = [((True, True), True), ((True, False), False), ((False, True), False), ((False, False), False)]
SAME = [((5, 5), True), ((5, 6), False), ((6, 5), False), ((-3, 3), False), ((2**60 - 1, 2**60 - 1), True)]


def _worker(rank, store_file, results):
    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank, world_size=2)
    group = types.SimpleNamespace(world_size=2, cpu_group=dist.group.WORLD)
    ps = types.ModuleType("vllm.distributed.parallel_state")
    ps.get_tp_group = lambda: group
    ps.model_parallel_is_initialized = lambda: True
    for name in ("vllm", "vllm.distributed"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["vllm.distributed.parallel_state"] = ps
    from spark_overlays._util import tp_agree, tp_same

    results[rank] = [tp_agree(oks[rank]) for oks, _ in CASES] + [tp_same(values[rank]) for values, _ in SAME]
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
def test_tp_agree_is_unanimous(tmp_path):
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_worker, args=(str(tmp_path / "store"), results), nprocs=2, join=True)
        expected = [e for _, e in CASES + SAME]
        assert dict(results) == {0: expected, 1: expected}


def test_single_process_without_vllm_keeps_local_answer():
    from spark_overlays._util import tp_agree

    if "vllm" in sys.modules or __import__("importlib").util.find_spec("vllm") is not None:
        pytest.skip("vLLM importable here")
    assert tp_agree(False) is False  # import fails -> treated as disagreement, never as ok
