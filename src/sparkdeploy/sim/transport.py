"""Stream one `docker save` into several `docker load` commands at once (the sim's image preload).

Plain OS pipes, so end-of-file reaches every `docker load` when the stream ends (fabric's `in_stream` never
sends it). The general node-to-node transport belongs to `sparkdeploy.remote`; this one only serves the sim:
host image -> every sim node, in one read of the image.
"""

from __future__ import annotations

import subprocess
import tempfile
from typing import Mapping, Sequence

from sparkdeploy.errors import SimError

CHUNK = 1 << 20


def stream_image(image: str, sinks: Mapping[str, Sequence[str]], *, timeout: float = 1800) -> int:
    """`docker save image` piped into each sink command (e.g. ssh ... docker load); return the bytes streamed."""
    errs = {name: tempfile.TemporaryFile() for name in sinks}
    procs = {name: subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=errs[name], stderr=errs[name])
             for name, argv in sinks.items()}
    save_err = tempfile.TemporaryFile()
    save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE, stderr=save_err)
    total = 0
    broken: dict[str, str] = {}
    try:
        assert save.stdout is not None
        while True:
            chunk = save.stdout.read(CHUNK)
            if not chunk:
                break
            total += len(chunk)
            for name, proc in procs.items():
                if name in broken:
                    continue
                try:
                    assert proc.stdin is not None
                    proc.stdin.write(chunk)
                except (BrokenPipeError, OSError) as err:
                    broken[name] = str(err)
            if len(broken) == len(procs):
                break
        for name, proc in procs.items():
            try:
                assert proc.stdin is not None
                proc.stdin.close()
            except OSError:
                pass
        save_rc = save.wait(timeout=60) if total else save.wait(timeout=timeout)
        rcs = {name: proc.wait(timeout=timeout) for name, proc in procs.items()}
    except subprocess.TimeoutExpired:
        for proc in [save, *procs.values()]:
            proc.kill()
        raise SimError(f"copying {image} into {', '.join(sinks)} did not finish within {timeout:.0f} s") from None
    finally:
        if save.poll() is None:
            save.kill()
            save.wait()

    def text(fh) -> str:
        fh.seek(0)
        return fh.read().decode("utf-8", "replace").strip()[-400:]

    if save_rc != 0:
        raise SimError(f"docker save {image} failed (exit {save_rc}): {text(save_err)}")
    failed = {name: rc for name, rc in rcs.items() if rc != 0 or name in broken}
    if failed:
        detail = "; ".join(f"{name}: exit {rc}: {text(errs[name]) or broken.get(name, '')}" for name, rc in failed.items())
        raise SimError(f"docker load of {image} failed on {detail}; check the node's disk (`sparkdeploy sim ssh "
                       f"{next(iter(failed))} -- df -h /var/lib/docker`) and retry")
    return total
