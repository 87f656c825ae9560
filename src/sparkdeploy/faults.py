"""A seam for failure tests: `SPARKDEPLOY_FAULT=<boundary>` makes the kit fail once at that named boundary.

Used only where a real fault cannot hit a boundary reliably (docs/failures.md says which cases): the memory
guard needs a node short of memory at the exact moment of the start, which a shared test host cannot arrange
without starving its neighbours. A boundary fires once per process, so the recovery that follows (which
passes the same boundary again) runs for real.
"""

from __future__ import annotations

import os

ENV = "SPARKDEPLOY_FAULT"
BOUNDARIES = (
    "after-stop",    # engine stopped on every node, `current` not switched yet
    "after-switch",  # `current` switched on every node, nothing started
    "memory-guard",  # inside the start: where the memory guard refuses
    "after-gate",    # the new release passed its gate, the watchdog is not back on yet
    "release-one-node",  # vocab rollout: the new release is written on the head, a worker's write fails
)

_fired: set[str] = set()


class InjectedFault(RuntimeError):
    """The failure asked for by SPARKDEPLOY_FAULT (tests only). Not one of the kit's own errors: it stands for
    the failure nobody foresaw (a bug, a library's exception), which must be rolled back like the foreseen ones."""


def hit(boundary: str) -> None:
    """Raise InjectedFault the first time `boundary` is reached when SPARKDEPLOY_FAULT names it."""
    assert boundary in BOUNDARIES, boundary
    if os.environ.get(ENV) == boundary and boundary not in _fired:
        _fired.add(boundary)
        raise InjectedFault(f"injected fault at {boundary} ({ENV}={boundary})")
