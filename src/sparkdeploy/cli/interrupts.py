"""Ctrl-C (SIGINT) or SIGTERM during a command that changes the cluster must not leave it half-switched.

The first signal becomes one `Interrupted` failure raised where the command is, so its guarded block treats
it like any other failure (before the first stop: nothing switched; after it: the last good release serves
again). It is raised only where the main thread runs our own code, or waits on a thread primitive our code
called. Raised inside a library (the stdlib or site-packages: logging between taking and releasing its module
lock, paramiko mid-channel) it can leave a lock held, and every thread that logs afterwards deadlocks (seen:
`up` hung after a SIGINT). There it is raised at the next line of our own code the library returns to (a frame
trace function). Later signals are refused with a note until the command has put things back; SIGQUIT
(Ctrl-\\) and SIGKILL still end it at once, at the user's choice.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import sys
import sysconfig
import threading
from contextlib import contextmanager
from typing import Callable, Iterator

from sparkdeploy.errors import Interrupted

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_LIBRARIES = tuple({os.path.abspath(sysconfig.get_paths()[k]) + os.sep for k in ("stdlib", "purelib", "platlib")})
_THREADING = os.path.abspath(threading.__file__)
_FUTURES = os.path.dirname(os.path.abspath(concurrent.futures.__file__))


def _in_library(frame) -> bool:
    return os.path.abspath(frame.f_code.co_filename).startswith(_LIBRARIES)


def raise_point(frame):
    """Where raising is safe: None if it is here already (our code, or a thread-primitive wait that our code
    called, which unwinds through `with` and `finally` only); else the innermost frame of our own code, to raise
    in once control is back there."""
    waits_only = True
    while frame is not None:
        if not _in_library(frame):
            return None if waits_only else frame
        path = os.path.abspath(frame.f_code.co_filename)
        waits_only = waits_only and (path == _THREADING or path.startswith(_FUTURES + os.sep))
        frame = frame.f_back
    return None


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

    deferred: list = []  # the frame of ours a signal waits to be raised in, while a library runs

    def fail(name: str):
        state.fired, state.reason = True, f"{what} interrupted by {name}"
        note(f"{name}: stopping {what} and putting the last good release back")
        raise Interrupted(state.reason)

    def handler(signum, frame):
        name = signal.Signals(signum).name
        if state.fired or deferred:
            note(f"{name} again: still putting the last good release back; wait (Ctrl-\\ quits at once, "
                 "leaving the cluster as it is at that moment)")
            return
        target = raise_point(frame)
        if target is None:
            fail(name)

        def on_line(f, event, _arg):  # the next line of our frame, once the library call returned
            if f is target and event == "line":
                sys.settrace(None)
                f.f_trace = None
                fail(name)
            return on_line

        state.fired, state.reason = True, f"{what} interrupted by {name}"  # said even if the library fails first
        deferred.append(target)
        target.f_trace, target.f_trace_lines = on_line, True
        sys.settrace(lambda *_: None)  # line events reach a frame's own f_trace only while tracing is on

    before = {s: signal.signal(s, handler) for s in SIGNALS}
    try:
        yield state
    finally:
        if deferred:
            sys.settrace(None)
            deferred[0].f_trace = None
        for s, h in before.items():
            signal.signal(s, h)
