"""A test double for the GB10 GPU under Ray (loaded by sim_gpu_for_ray.pth). vLLM's CPU platform has no Ray
support, and `--distributed-executor-backend ray` on the sim needs two things the CUDA platform of a Spark has:

- a Ray device: the CPU platform's `ray_device_key` is "" ("current platform cpu does not support ray"). The
  sim's `ray start --num-gpus 1` declares each node's one CPU rank as a GPU resource, and this names it, so
  vLLM's Ray executor places one worker per node as it does on Sparks;
- per-node shared memory: the CPU TP communicator names its shared-memory segment after the rendezvous port,
  which every Ray worker is given alike, so ranks on two nodes take one name and each opens a segment only
  the other node has (`open shm in SHMManager failed. errno: 2`). With the node's hostname in the name the
  ranks disagree and vLLM falls back to torch.distributed (gloo), as it does with the mp launcher.

Everything else (placement group, actors, gloo between the ranks) is vLLM's and Ray's own code.
"""

import importlib.abc
import importlib.machinery
import socket
import sys


def _name_the_ray_device(module):
    module.CpuPlatform.ray_device_key = "GPU"


def _shm_name_per_node(module):
    make_group_name = module._CPUSHMDistributed.make_group_name

    def per_node(communicator):
        return f"{make_group_name(communicator)}-{socket.gethostname()}"

    module._CPUSHMDistributed.make_group_name = staticmethod(per_node)


_PATCHES = {"vllm.platforms.cpu": _name_the_ray_device,
            "vllm.distributed.device_communicators.cpu_communicator": _shm_name_per_node}


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
