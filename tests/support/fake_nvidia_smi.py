"""A test double for GB10's `nvidia-smi` (no GB10 here): a script on PATH that answers the kit's one query
(power.draw, clocks.sm, utilization.gpu; GB10 has no memory fields) with a fixed line, and refuses any other."""

from __future__ import annotations

from pathlib import Path


def install(bin_dir: Path, line: str, rc: int = 0) -> Path:
    """Write `bin_dir/nvidia-smi` answering `line` with exit status `rc`; returns bin_dir (put it on PATH)."""
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "nvidia-smi"
    script.write_text("#!/bin/sh\n"
                      '[ "$1" = "--query-gpu=power.draw,clocks.sm,utilization.gpu" ] || { echo "bad query $1" >&2; exit 9; }\n'
                      '[ "$2" = "--format=csv,noheader,nounits" ] || exit 9\n'
                      f"echo '{line}'\nexit {rc}\n")
    script.chmod(0o755)
    return bin_dir
