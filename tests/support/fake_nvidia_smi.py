"""A test double for GB10's `nvidia-smi` (no GB10 here): a script on PATH that answers the kit's queries with
fixed lines, and refuses any other: the watchdog's (power.draw, clocks.sm, utilization.gpu; GB10 has no memory
fields) and, when given, doctor's clock/thermal query (`probes.GPU_CLOCK_FIELDS`)."""

from __future__ import annotations

from pathlib import Path

WATCHDOG_QUERY = "--query-gpu=power.draw,clocks.sm,utilization.gpu"


def install(bin_dir: Path, line: str, rc: int = 0, *, clocks: str | None = None) -> Path:
    """Write `bin_dir/nvidia-smi` answering the watchdog's query with `line` and exit status `rc` (and doctor's
    clock query with `clocks`, if given); returns bin_dir (put it on PATH)."""
    from sparkdeploy.node.probes import GPU_CLOCK_FIELDS

    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "nvidia-smi"
    doctor = (f'if [ "$1" = "--query-gpu={GPU_CLOCK_FIELDS}" ] && [ "$2" = "--format=csv,noheader,nounits" ]; then '
              f"echo '{clocks}'; exit 0; fi\n") if clocks is not None else ""
    script.write_text("#!/bin/sh\n" + doctor +
                      f'[ "$1" = "{WATCHDOG_QUERY}" ] || {{ echo "bad query $1" >&2; exit 9; }}\n'
                      '[ "$2" = "--format=csv,noheader,nounits" ] || exit 9\n'
                      f"echo '{line}'\nexit {rc}\n")
    script.chmod(0o755)
    return bin_dir
