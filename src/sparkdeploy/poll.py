"""The one poll-until loop. Every wait on something outside this process (an engine answering, a registry
coming up, the router listing its models, a node rebooting, an engine going idle) has the same parts: a
deadline, a pause between attempts, the last reason it was not there yet, a progress note now and then, and
sometimes a side check that may end the wait early (are the ranks still up?). Written once, they behave the
same everywhere: the first attempt is immediate, the time-out names what was seen last."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


class NotYet(Exception):
    """Raised by an attempt: not there yet; the message says why (shown in notes and in the time-out)."""


class TimedOut(Exception):
    """The deadline passed; `last` is the reason the last attempt gave, `elapsed` the seconds waited."""

    def __init__(self, last: str, elapsed: float):
        super().__init__(last)
        self.last, self.elapsed = last, elapsed


def until(attempt: Callable[[], T], *, timeout: float, interval: float,
          note: Callable[[float, str], None] | None = None, note_every: float = 15.0,
          side: Callable[[], None] | None = None, side_every: float = 10.0) -> T:
    """`attempt()` until it returns (its value is returned) instead of raising NotYet, every `interval` s for
    at most `timeout` s, then TimedOut. `note(elapsed, last)` runs at most every `note_every` s while waiting;
    `side()` every `side_every` s (first at once) and may raise to end the wait."""
    t0 = time.monotonic()
    last, next_note, next_side = "nothing yet", 0.0, 0.0
    while True:
        elapsed = time.monotonic() - t0
        try:
            return attempt()
        except NotYet as why:
            last = str(why) or last
        if side is not None and elapsed >= next_side:
            side()
            next_side = elapsed + side_every
        if elapsed >= timeout:
            raise TimedOut(last, elapsed)
        if note is not None and elapsed >= next_note:
            note(elapsed, last)
            next_note = elapsed + note_every
        time.sleep(interval)
