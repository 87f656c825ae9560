"""poll.until, the one poll-until loop, on a fake clock (sleeping advances it): the counts below are exact; and
fanout, the one fan-out."""

from __future__ import annotations

import pytest

from sparkdeploy import poll


@pytest.fixture
def clock(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(poll.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(poll.time, "sleep", lambda s: now.__setitem__(0, now[0] + s))
    return now


def test_returns_the_first_value_and_tries_at_once(clock):
    calls = []

    def attempt():
        calls.append(clock[0])
        if len(calls) < 3:
            raise poll.NotYet(f"try {len(calls)}")
        return "up"

    assert poll.until(attempt, timeout=10, interval=2) == "up"
    assert calls == [0.0, 2.0, 4.0]


def test_times_out_naming_the_last_reason(clock):
    seen = iter(["booting", "loading", "warming"] + ["loading weights"] * 10)

    def attempt():
        raise poll.NotYet(next(seen))

    with pytest.raises(poll.TimedOut) as out:
        poll.until(attempt, timeout=6, interval=2)
    assert out.value.last == "loading weights" and out.value.elapsed == 6.0


def test_an_empty_reason_keeps_the_one_before(clock):
    reasons = iter(["HTTP 503", "", ""])

    def attempt():
        raise poll.NotYet(next(reasons))

    with pytest.raises(poll.TimedOut) as out:
        poll.until(attempt, timeout=2, interval=1)
    assert out.value.last == "HTTP 503"


def test_notes_are_spaced_and_carry_the_last_reason(clock):
    notes = []

    def attempt():
        raise poll.NotYet("ConnectionError")

    with pytest.raises(poll.TimedOut):
        poll.until(attempt, timeout=40, interval=5, note=lambda el, last: notes.append((el, last)))
    assert notes == [(0.0, "ConnectionError"), (15.0, "ConnectionError"), (30.0, "ConnectionError")]


def test_the_side_check_runs_first_at_once_then_spaced_and_may_end_the_wait(clock):
    ran = []

    class RankLost(Exception):
        pass

    def side():
        ran.append(clock[0])
        if clock[0] >= 20:
            raise RankLost("node2 rank 1 exited")

    def attempt():
        raise poll.NotYet("not yet")

    with pytest.raises(RankLost):
        poll.until(attempt, timeout=100, interval=2, side=side, side_every=10)
    assert ran == [0.0, 10.0, 20.0]


def test_an_attempt_that_raises_something_else_ends_the_wait(clock):
    def attempt():
        raise PermissionError("host key changed")

    with pytest.raises(PermissionError):
        poll.until(attempt, timeout=100, interval=2)
    assert clock[0] == 0.0


# ------------------------------------------------------------------------------ fanout, the one fan-out
def test_each_keeps_the_items_order_and_raises_the_first_failure_after_all_ran():
    import threading

    from sparkdeploy import fanout

    ran, lock = [], threading.Lock()

    def fn(i):
        with lock:
            ran.append(i)
        if i in (2, 4):
            raise RuntimeError(f"node{i} failed")
        return i * 10

    assert fanout.each([3, 1, 0], fn) == [30, 10, 0]
    with pytest.raises(RuntimeError, match="node2 failed"):
        fanout.each([0, 2, 4, 1], fn)
    assert sorted(ran[3:]) == [0, 1, 2, 4]  # every call ran, though two failed
    assert fanout.parallel([], fn) == {}
    res = fanout.parallel([4, 5], fn)
    assert isinstance(res[0], RuntimeError) and res[1] == 50
