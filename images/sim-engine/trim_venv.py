"""Remove from /opt/venv what no process of the simulated cluster loads: every move of the image (a push into
a fresh head registry, each node's pull, `sim load`) then handles about 0.5 GB less of its 2.8 GB.

Removed: the two of vLLM's three CPU kernel libraries that this CPU does not load (chosen by the checks of
vLLM's CpuPlatform.import_kernels; the image is built on the machine that runs it), torch's C++ tests, headers
and protoc, Ray's Java jars, Intel's GPU-offload runtimes that came with intel-openmp, static libraries and
debug files. The Dockerfile's last step proves the kernels still load."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch

VENV = Path(sys.prefix)
SITE = VENV / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
KERNELS = ("_C.abi3.so", "_C_AVX512.abi3.so", "_C_AVX2.abi3.so")


def kernel_library() -> str:
    """The one vllm.platforms.cpu.CpuPlatform.import_kernels imports on this CPU (x86)."""
    if torch.cpu._is_avx512_supported():
        return KERNELS[0] if torch.cpu._is_avx512_bf16_supported() else KERNELS[1]
    return KERNELS[2]


def unused() -> list[Path]:
    keep = kernel_library()
    paths = [SITE / "vllm" / k for k in KERNELS if k != keep]
    paths += [SITE / "torch" / d for d in ("test", "include")] + [SITE / "ray" / "jars"]
    paths += [p for p in sorted((SITE / "torch" / "bin").iterdir())  # torch_shm_manager stays: torch runs it
              if p.is_file() and (p.name.startswith(("test_", "protoc")) or p.name.endswith("StoreTest"))]
    lib = VENV / "lib"
    for pattern in ("libomptarget.rtl.level0.so", "libomptarget.rtl.opencl.so",
                    "libomptarget.rtl.unified_runtime.so", "libomptarget.sycl.wrap.so", "libur_*", "libpi_*",
                    "libsycl_*", "*.a", "*.dbg"):
        paths += sorted(lib.glob(pattern))
    return [p for p in paths if p.exists() or p.is_symlink()]


def main() -> None:
    freed = 0
    for p in unused():
        if p.is_dir() and not p.is_symlink():
            freed += sum(f.stat().st_size for f in p.rglob("*") if f.is_file() and not f.is_symlink())
            shutil.rmtree(p)
        else:
            freed += 0 if p.is_symlink() else p.stat().st_size
            p.unlink()
    print(f"trimmed {freed / 1e6:.0f} MB from {VENV} (kept vllm/{kernel_library()})")


if __name__ == "__main__":
    main()
