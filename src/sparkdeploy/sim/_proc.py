"""Small helpers the sim modules share: running host commands, timing phases, reporting progress, locking.

Nothing here prints: progress goes to a `Reporter` the caller passes (the CLI's writes to stderr with rich).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from sparkdeploy.errors import SimError


class Reporter:
    """Receives progress. The default one records timings and says nothing."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}

    def phase_started(self, name: str, detail: str = "") -> None:  # pragma: no cover - overridden by the CLI
        pass

    def phase_done(self, name: str, seconds: float, detail: str = "") -> None:  # pragma: no cover
        pass

    def note(self, message: str) -> None:  # pragma: no cover
        pass

    @contextlib.contextmanager
    def phase(self, name: str, detail: str = "") -> Iterator[dict]:
        """Time a named step; the body may set `info["detail"]` to say what it found or did."""
        info: dict = {"detail": ""}
        self.phase_started(name, detail)
        t0 = time.monotonic()
        try:
            yield info
        finally:
            dt = time.monotonic() - t0
            self.timings[name] = round(self.timings.get(name, 0.0) + dt, 2)
        self.phase_done(name, dt, info.get("detail", ""))


@dataclass
class Done:
    rc: int
    out: str
    err: str


def need_tool(tool: str, package: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise SimError(f"`{tool}` is not installed on this host; install it (apt-get install -y {package}) and retry")
    return path


def run(argv: Sequence[str], *, what: str, input: bytes | None = None, timeout: float = 600, check: bool = True,
        log: Path | None = None, env: dict | None = None, cwd: str | Path | None = None) -> Done:
    """Run a host command; on failure raise SimError naming `what`, the command and its last stderr lines.

    With `log`, stdout and stderr go to that file (long builds) and the error names it.
    """
    full_env = None if env is None else {**os.environ, **env}
    try:
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            with open(log, "ab") as fh:
                fh.write(("\n$ " + " ".join(argv) + "\n").encode())
                fh.flush()
                proc = subprocess.run(list(argv), input=input, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout,
                                      env=full_env, cwd=cwd)
            out = err = ""
        else:
            proc = subprocess.run(list(argv), input=input, capture_output=True, timeout=timeout, env=full_env, cwd=cwd)
            out = proc.stdout.decode("utf-8", "replace")
            err = proc.stderr.decode("utf-8", "replace")
    except FileNotFoundError:
        raise SimError(f"{what}: `{argv[0]}` not found on this host") from None
    except subprocess.TimeoutExpired:
        where = f" (log: {log})" if log else ""
        raise SimError(f"{what}: `{' '.join(argv[:3])} ...` did not finish within {timeout:.0f} s{where}") from None
    if check and proc.returncode != 0:
        if log is not None:
            tail = _tail(log.read_text("utf-8", "replace"))
            raise SimError(f"{what} failed (exit {proc.returncode}); last lines of {log}:\n{tail}")
        tail = _tail(err or out)
        raise SimError(f"{what} failed (exit {proc.returncode}): {' '.join(argv[:4])} ...\n{tail}")
    return Done(proc.returncode, out, err)


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join("    " + line for line in text.strip().splitlines()[-lines:])


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock (two `sim up` runs must not build the same image at once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)



