"""The host's Docker engine, driven through the Docker SDK for Python (`docker`, the `sim` extra) with objects
instead of `docker` CLI subprocesses and `--format` templates. The nodes' own engines are not reached from
here: the kit and the tests keep the docker CLI over SSH for those, as on real nodes.

Errors become SimError naming what failed (`what`) and the engine's own words, as the CLI's stderr did.
"""

from __future__ import annotations

import functools
import math
import socket
import subprocess
from pathlib import Path
from typing import Iterable, Iterator

from sparkdeploy import extras, poll
from sparkdeploy.errors import SimError
from sparkdeploy.sim._proc import Done

API_TIMEOUT = 120  # seconds for one API call
# Seconds a long call (build, import, save stream, exec) may stay silent before it counts as hung; an exec's own
# limit is the in-container `timeout` wrapped around its command.
STREAM_TIMEOUT = 3600
CHUNK = 1 << 20


def sdk():
    """The `docker` package (ExtraMissing naming `sparkdeploy[sim]` when it is not installed)."""
    return extras.require("sim", "docker")


@functools.cache
def api(timeout: float = API_TIMEOUT):
    """A low-level client of the host's engine (DOCKER_HOST or the default socket): API_TIMEOUT, or STREAM_TIMEOUT
    for long calls."""
    docker = sdk()
    try:
        return docker.APIClient(**docker.utils.kwargs_from_env(), timeout=timeout, version="auto")
    except docker.errors.DockerException as err:
        raise unreachable(err) from None


def unreachable(err: Exception) -> SimError:
    return SimError("cannot reach the Docker engine on this host; start dockerd (e.g. `setsid dockerd "
                    f">/var/log/dockerd.log 2>&1 &`) and retry: {str(err).strip()[:200]}")


def errors():
    """The SDK's exception module (`errors().NotFound`, `errors().APIError`)."""
    return sdk().errors


def engine_errors() -> tuple[type[BaseException], ...]:
    """What a call to the engine may raise: the SDK's errors, and the HTTP layer's and the socket's midway
    through a stream (urllib3's are not OSErrors)."""
    import urllib3

    return (errors().DockerException, urllib3.exceptions.HTTPError, OSError)


def failed(what: str, err: Exception) -> SimError:
    """A SimError naming `what` with the engine's explanation (an APIError's text without the HTTP preamble)."""
    text = getattr(err, "explanation", None) or str(err)
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return SimError(f"{what} failed: {str(text).strip()[:400]}")


def call(what: str, fn, *args, **kwargs):
    """Run one API call; any engine error becomes SimError naming `what`."""
    try:
        return fn(*args, **kwargs)
    except engine_errors() as err:
        raise failed(what, err) from None


def inspect_or_none(fn, ref: str, what: str) -> dict | None:
    """`fn(ref)` (an inspect call); None when the object does not exist."""
    try:
        return fn(ref)
    except errors().NotFound:
        return None
    except engine_errors() as err:
        raise failed(what, err) from None


def exec_run(container: str, argv: list[str], *, what: str, timeout: float = 30) -> Done:
    """Run `argv` in a running container (`timeout` kills it there, as coreutils' timeout does); a Done with the
    exit code and the split output. A container that is gone or stopped answers rc 1 with the engine's words."""
    client = api(STREAM_TIMEOUT)  # the HTTP read waits for the command; the `timeout` below ends it first
    try:
        exec_id = client.exec_create(container, ["timeout", str(max(1, math.ceil(timeout))), *argv])["Id"]
        out, err = client.exec_start(exec_id, demux=True)
        rc = _exit_code(client, exec_id, what)
    except errors().APIError as exc:  # gone or not running: the caller waits or says so
        return Done(1, "", str(exc.explanation or exc))
    except engine_errors() as exc:
        raise failed(what, exc) from None
    if rc == 124:
        raise SimError(f"{what}: `{' '.join(argv)[:80]}` did not finish within {timeout:.0f} s")
    return Done(rc if rc is not None else 1, (out or b"").decode("utf-8", "replace"),
                (err or b"").decode("utf-8", "replace"))


def _exit_code(client, exec_id: str, what: str) -> int | None:
    """The exec's exit code. Its output can end before the engine records the exit (ExitCode None while it
    says Running, on a loaded host): read again until it is recorded. A None then read as 1 made a node whose
    host keys were there look keyless (`sim up`: "no SSH host keys")."""

    def recorded() -> int | None:
        info = client.exec_inspect(exec_id)
        if info.get("Running"):
            raise poll.NotYet("the exec still runs")
        return info["ExitCode"]

    try:
        return poll.until(recorded, timeout=30, interval=0.05)
    except poll.TimedOut:
        raise SimError(f"{what}: the engine never recorded the command's exit") from None


def exec_fed(container: str, argv: list[str], chunks: Iterable[bytes], *, what: str) -> Done:
    """Run `argv` in a running container with `chunks` as its stdin (e.g. a save stream into `docker load`), end
    its input, and wait for it; a Done with its exit code and what it printed (stdout and stderr together)."""
    client = api(STREAM_TIMEOUT)
    try:
        exec_id = client.exec_create(container, argv, stdin=True)["Id"]
        sock = client.exec_start(exec_id, socket=True)._sock  # the hijacked connection: a plain socket
        try:
            for chunk in chunks:
                sock.sendall(chunk)
            sock.shutdown(socket.SHUT_WR)
            said = b""
            while data := sock.recv(CHUNK):
                said = (said + data)[-2048:]
        finally:
            sock.close()
        rc = _exit_code(client, exec_id, what)
    except engine_errors() as exc:
        raise failed(what, exc) from None
    # the output is docker's multiplexed stream: 8-byte frame headers between the text; only its end matters here
    return Done(rc if rc is not None else 1, said.decode("utf-8", "replace"), "")


def tar_stream(root: Path, log: Path) -> Iterator[bytes]:
    """`tar -C root -c .` in chunks (device nodes, hard links and xattrs as tar keeps them, no temp file); its
    stderr goes to `log`. Raises SimError naming the log when tar fails."""
    with open(log, "ab") as fh:
        fh.write(f"\n$ tar -C {root} -c .  (streamed to the Docker engine)\n".encode())
        fh.flush()
        proc = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE, stderr=fh)
        try:
            assert proc.stdout is not None
            while chunk := proc.stdout.read(CHUNK):
                yield chunk
        finally:
            if proc.poll() is None and proc.stdout is not None:
                proc.stdout.close()
            rc = proc.wait()
    if rc != 0:
        raise SimError(f"tar of {root} failed (exit {rc}); see {log}")
