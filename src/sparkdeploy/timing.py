"""Where the time goes: spans of the expensive things (deploy verbs, readiness waits, cluster bring-ups, image
builds, engine starts) appended as JSON lines to `$SPARKDEPLOY_TIMING_LOG` when it is set, and to nothing
otherwise.

CI sets it so that `scripts/ci_summary.py` can say how much of a run was bring-ups, builds, engine starts,
deploys and waits; test processes, xdist workers and `python -m sparkdeploy` subprocesses all append to the
one file (each line is one short O_APPEND write, so lines from several processes do not interleave).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator

ENV = "SPARKDEPLOY_TIMING_LOG"
KINDS = ("cluster bring-up", "image build", "engine start", "deploy", "wait")


def record(kind: str, what: str, seconds: float, *, ok: bool = True) -> None:
    """Append one span; never raises (timing must not fail the thing it times)."""
    path = os.environ.get(ENV)
    if not path:
        return
    line = json.dumps({"kind": kind, "what": what, "seconds": round(seconds, 2), "ok": ok,
                       "pid": os.getpid(), "end": round(time.time(), 2)}) + "\n"
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


@contextlib.contextmanager
def span(kind: str, what: str) -> Iterator[None]:
    """Time the block as one span of `kind`; a block that raises is recorded with ok false."""
    t0 = time.monotonic()
    ok = False
    try:
        yield
        ok = True
    finally:
        record(kind, what, time.monotonic() - t0, ok=ok)
