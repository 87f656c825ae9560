"""The first SIGINT/SIGTERM becomes one failure the command handles (roll back); later ones wait for it."""

import os
import signal
import textwrap
import threading
import time
import traceback

import pytest

from sparkdeploy.errors import Interrupted
from sparkdeploy.steps import interrupts
from sparkdeploy.steps.interrupts import interrupt_as_failure


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_first_signal_fails_the_command_later_ones_wait_for_its_cleanup(sig):
    notes, cleaned = [], []
    before = signal.getsignal(sig)
    with pytest.raises(Interrupted, match=f"up interrupted by {sig.name}") as err:
        with interrupt_as_failure("up", notes.append):
            try:
                os.kill(os.getpid(), sig)
                raise AssertionError("the signal did not interrupt")
            finally:  # the rollback runs here: a second signal must not cut it short
                os.kill(os.getpid(), sig)
                cleaned.append(True)
    assert cleaned == [True] and err.value.exit_code == 130
    assert notes[0].startswith(f"{sig.name}: stopping up") and "still putting the last good release back" in notes[1]
    assert signal.getsignal(sig) == before


def test_a_signal_a_library_swallowed_is_still_named_in_the_outcome():
    """paramiko, interrupted while it waits on a channel, raises its own error; the command then reports that
    error ("ssh session lost") as the failure, and the outcome must still say a signal ended it."""
    with interrupt_as_failure("up", lambda _: None) as signalled:
        try:
            os.kill(os.getpid(), signal.SIGINT)
        except Interrupted:
            message = "release 9 failed (start: node1: ssh session lost: ); ROLLED BACK to release 8"
    assert signalled.tell(message) == "up interrupted by SIGINT: " + message
    assert signalled.tell("up interrupted by SIGINT; ROLLED BACK") == "up interrupted by SIGINT; ROLLED BACK"
    with interrupt_as_failure("up", lambda _: None) as calm:
        pass
    assert calm.tell("release 9 is healthy") == "release 9 is healthy"


def test_a_signal_inside_library_code_is_raised_once_the_main_thread_is_back_in_ours():
    """Raised inside a library the failure can leave a lock held (logging's module lock: every later log line
    of every thread then deadlocks, as `up` once did after a SIGINT). The signal lands while the main thread is
    deep in pure-Python stdlib code (textwrap); the failure must surface in our own frame, never in textwrap's."""
    text = "word " * 60_000
    with pytest.raises(Interrupted) as err:
        with interrupt_as_failure("up", lambda _: None):
            threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT)).start()
            for _ in range(100):
                textwrap.fill(text, width=7)  # ~0.1 s a call, all of it inside textwrap
                time.sleep(0.01)  # then our own code, where the put-off signal may be raised
    raised_in = [f.filename for f in traceback.extract_tb(err.value.__traceback__)
                 if os.path.abspath(f.filename) != os.path.abspath(interrupts.__file__)][-1]  # the frame the handler ran on top of
    assert not os.path.abspath(raised_in).startswith(interrupts._LIBRARIES), raised_in
