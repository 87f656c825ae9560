"""Stream one save of a host image (the Docker SDK's `get_image`) into several `docker load` commands at once
(the sim's image preload).

Plain OS pipes into the sinks, so end-of-file reaches every `docker load` when the stream ends (fabric's
`in_stream` never sends it). The general node-to-node transport belongs to `sparkdeploy.remote.ssh`; this one only
serves the sim: host image -> every sim node, in one read of the image.
"""

from __future__ import annotations

import subprocess
import tempfile
from typing import Mapping, Sequence

from sparkdeploy.errors import SimError
from sparkdeploy.sim import host_docker

CHUNK = 1 << 20


def stream_image(image: str, sinks: Mapping[str, Sequence[str]], *, timeout: float = 1800) -> int:
    """The image's save stream piped into each sink command (e.g. ssh ... docker load); return the bytes streamed."""
    try:
        save = host_docker.api(host_docker.STREAM_TIMEOUT).get_image(image, chunk_size=CHUNK)
    except host_docker.engine_errors() as err:
        raise host_docker.failed(f"docker save {image}", err) from None
    errs = {name: tempfile.TemporaryFile() for name in sinks}
    procs = {name: subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=errs[name], stderr=errs[name])
             for name, argv in sinks.items()}
    total = 0
    broken: dict[str, str] = {}
    try:
        for chunk in _chunks(save, image):
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
        rcs = {name: proc.wait(timeout=timeout) for name, proc in procs.items()}
    except subprocess.TimeoutExpired:
        for proc in procs.values():
            proc.kill()
        raise SimError(f"copying {image} into {', '.join(sinks)} did not finish within {timeout:.0f} s") from None
    finally:
        save.close()
        for proc in procs.values():
            if proc.poll() is None:  # the save stream failed midway: no sink waits for more
                proc.kill()
                proc.wait()

    def text(fh) -> str:
        fh.seek(0)
        return fh.read().decode("utf-8", "replace").strip()[-400:]

    failed = {name: rc for name, rc in rcs.items() if rc != 0 or name in broken}
    if failed:
        detail = "; ".join(f"{name}: exit {rc}: {text(errs[name]) or broken.get(name, '')}" for name, rc in failed.items())
        raise SimError(f"docker load of {image} failed on {detail}; check the node's disk (`sparkdeploy sim ssh "
                       f"{next(iter(failed))} -- df -h /var/lib/docker`) and retry")
    return total


def _chunks(save, image: str):
    """The save stream's chunks; an engine or socket error midway becomes SimError naming the image."""
    try:
        yield from save
    except host_docker.engine_errors() as err:
        raise host_docker.failed(f"docker save {image}", err) from None
