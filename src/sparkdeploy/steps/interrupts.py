"""Ctrl-C (SIGINT) or SIGTERM during a command that changes the cluster must not leave it half-switched.

The first signal becomes one `Interrupted` failure raised where the command is, so its guarded block treats
it like any other failure (before the first stop: nothing switched; after it: the last good release serves
again). It is raised only where the main thread runs our own code, or waits on a thread primitive our code
called. Raised inside a library (the stdlib or site-packages: logging between taking and releasing its module
lock, paramiko mid-channel) it can leave a lock held, and every thread that logs afterwards deadlocks (seen:
`up` hung after a SIGINT). There it is put off, and asked again every 20 ms (SIGALRM) until the main thread
is back in our code or in a wait. Later signals are refused with a note until the command has put things
back; SIGQUIT (Ctrl-\\) and SIGKILL still end it at once, at the user's choice.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import sysconfig
import threading
from contextlib import contextmanager
from typing import Callable, Iterator

from sparkdeploy.errors import Interrupted

SIGNALS = (signal.SIGINT, signal.SIGTERM)
RETRY_S = 0.02
_LIBRARIES = tuple({os.path.abspath(sysconfig.get_paths()[k]) + os.sep for k in ("stdlib", "purelib", "platlib")})
_THREADING = os.path.abspath(threading.__file__)
_FUTURES = os.path.dirname(os.path.abspath(concurrent.futures.__file__))


def safe_to_raise(frame) -> bool:
    """Our own code is running, or only thread-primitive waits (threading, concurrent.futures) that our code
    called: raised there, the exception unwinds through `with` and `finally` only."""
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith(_LIBRARIES):
            return True
        if not (path == _THREADING or path.startswith(_FUTURES + os.sep)):
            return False
        frame = frame.f_back
    return True


class Signalled:
    """What the guarded block can ask afterwards: did a signal end it (a command over several services then
    stops instead of going on to the next)."""

    fired = False
    reason = ""

    def tell(self, message: str) -> str:
        """The outcome's message, naming the signal even where the failure it raised reached the report
        reworded as another error (CI once read "start: node1: ssh session lost" after a SIGINT)."""
        return f"{self.reason}: {message}" if self.fired and self.reason not in message else message


@contextmanager
def interrupt_as_failure(what: str, note: Callable[[str], None]) -> Iterator[Signalled]:
    state = Signalled()

    pending: list[str] = []  # a signal put off while a library runs; SIGALRM asks again every RETRY_S
    alarm_before: list = []

    def handler(signum, frame):
        if signum == signal.SIGALRM:
            if not pending:
                return
            name = pending[0]
        else:
            name = signal.Signals(signum).name
            if state.fired or pending:
                note(f"{name} again: still putting the last good release back; wait (Ctrl-\\ quits at once, "
                     "leaving the cluster as it is at that moment)")
                return
        if not safe_to_raise(frame):
            pending[:] = [name]
            if not alarm_before:
                alarm_before.append(signal.signal(signal.SIGALRM, handler))
            signal.setitimer(signal.ITIMER_REAL, RETRY_S)
            return
        pending.clear()
        state.fired, state.reason = True, f"{what} interrupted by {name}"
        note(f"{name}: stopping {what} and putting the last good release back")
        raise Interrupted(state.reason)

    before = {s: signal.signal(s, handler) for s in SIGNALS}
    try:
        yield state
    finally:
        if alarm_before:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, alarm_before[0])
        for s, h in before.items():
            signal.signal(s, h)
