"""What the sim's CPU vLLM does as vLLM does on a GB10 (loaded by sim_gb10.pth into every Python of the
serving image's venv, and of the engine tests' vLLM venv: scripts/setup.sh).

Ray. vLLM's CPU platform has no Ray support, and `--distributed-executor-backend ray` on the sim needs two
things the CUDA platform of a Spark has:

- a Ray device: the CPU platform's `ray_device_key` is "" ("current platform cpu does not support ray"). The
  sim's `ray start --num-gpus 1` declares each node's one CPU rank as a GPU resource, and this names it, so
  vLLM's Ray executor places one worker per node as it does on Sparks;
- per-node shared memory: the CPU TP communicator names its shared-memory segment after the rendezvous port,
  which every Ray worker is given alike, so ranks on two nodes take one name and each opens a segment only
  the other node has (`open shm in SHMManager failed. errno: 2`). With the node's hostname in the name the
  ranks disagree and vLLM falls back to torch.distributed (gloo), as it does with the mp launcher.

Forked processes. On a GB10 vLLM forks its engine core and workers (VLLM_WORKER_MULTIPROC_METHOD's default;
it spawns only once CUDA is initialized); the CPU platform forces spawn, so each engine start imported vLLM
and torch three times over (API server, engine core, worker: ~8 CPU-seconds each) and a cluster test's time
went mostly to imports. Forked, an engine start on an idle host took 12 CPU-seconds instead of 26, with the
same greedy output and decode speed (bench/sim_engine_start.py). A spawned worker's OpenMP runtime reads the
thread count and CPUs the CPU platform sets in its environment when it starts; a forked one inherits the
engine core's, so it takes them from that environment itself (with two threads where one was set, decode
ran at a tenth of its speed).

Everything else (placement group, actors, gloo between the ranks, the processes' own code) is vLLM's and
Ray's.
"""

import importlib.abc
import importlib.machinery
import os
import socket
import sys


def _cpu_platform(module):
    module.CpuPlatform.ray_device_key = "GPU"
    check_and_update_config = module.CpuPlatform.check_and_update_config.__func__

    def fork_as_on_a_gb10(cls, vllm_config):
        check_and_update_config(cls, vllm_config)
        if os.environ.get("SPARKDEPLOY_SIM_SPAWN") != "1":  # bench/sim_engine_start.py measures both
            os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"

    module.CpuPlatform.check_and_update_config = classmethod(fork_as_on_a_gb10)


_worker_main = None  # vLLM's WorkerProc.worker_main


def worker_main_with_its_own_threads(*args, **kwargs):
    """A module-level function: a spawned worker's target is pickled by name, and runs before its process
    imported vLLM's executor (whose import hands this `_worker_main`)."""
    import torch
    import vllm.v1.executor.multiproc_executor  # noqa: F401

    cpus = os.environ.get("OMP_PLACES", "").strip("{}").replace(",", " ") or os.environ.get("GOMP_CPU_AFFINITY", "")
    if cpus.split():
        os.sched_setaffinity(0, {int(c) for c in cpus.split()})
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    return _worker_main(*args, **kwargs)


def _worker_threads_from_its_environment(module):
    global _worker_main
    _worker_main = module.WorkerProc.worker_main
    module.WorkerProc.worker_main = staticmethod(worker_main_with_its_own_threads)


def _shm_name_per_node(module):
    make_group_name = module._CPUSHMDistributed.make_group_name

    def per_node(communicator):
        return f"{make_group_name(communicator)}-{socket.gethostname()}"

    module._CPUSHMDistributed.make_group_name = staticmethod(per_node)


_PATCHES = {"vllm.platforms.cpu": _cpu_platform,
            "vllm.distributed.device_communicators.cpu_communicator": _shm_name_per_node,
            "vllm.v1.executor.multiproc_executor": _worker_threads_from_its_environment}


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        patch = _PATCHES.get(name)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


sys.meta_path.insert(0, _PatchOnImport())
