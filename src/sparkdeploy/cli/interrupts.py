"""Ctrl-C (SIGINT) or SIGTERM during a command that changes the cluster must not leave it half-switched.

The first signal becomes one `Interrupted` failure raised where the command is, so its guarded block treats
it like any other failure (before the first stop: nothing switched; after it: the last good release serves
again). Later signals are refused with a note until the command has put things back; SIGQUIT (Ctrl-\\) and
SIGKILL still end it at once, at the user's choice.
"""

from __future__ import annotations

import signal
from contextlib import contextmanager
from typing import Callable, Iterator

from sparkdeploy.errors import Interrupted

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Signalled:
    """What the guarded block can ask afterwards: did a signal end it (a command over several services then
    stops instead of going on to the next)."""

    fired = False
    reason = ""

    def tell(self, message: str) -> str:
        """The outcome's message, naming the signal even where a library it interrupted (paramiko waiting on
        a channel) reported it as an error of its own ("ssh session lost")."""
        return f"{self.reason}: {message}" if self.fired and self.reason not in message else message


@contextmanager
def interrupt_as_failure(what: str, note: Callable[[str], None]) -> Iterator[Signalled]:
    state = Signalled()

    def handler(signum, _frame):
        name = signal.Signals(signum).name
        if state.fired:
            note(f"{name} again: still putting the last good release back; wait (Ctrl-\\ quits at once, "
                 "leaving the cluster as it is at that moment)")
            return
        state.fired, state.reason = True, f"{what} interrupted by {name}"
        note(f"{name}: stopping {what} and putting the last good release back")
        raise Interrupted(state.reason)

    before = {s: signal.signal(s, handler) for s in SIGNALS}
    try:
        yield state
    finally:
        for s, h in before.items():
            signal.signal(s, h)
