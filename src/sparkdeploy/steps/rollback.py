"""`rollback [N]`: release N (default: the newest older one that passed its gate everywhere) serves again under
the plan it recorded; when that fails, the release that was serving goes back (up.back_to_last_good)."""

from __future__ import annotations

import time

from sparkdeploy.errors import HealthError, SparkdeployError, describe
from sparkdeploy.ops import releases
from sparkdeploy.remote.connection import dry_session, recording
from sparkdeploy.steps import engine
from sparkdeploy.steps.context import Context
from sparkdeploy.steps.secrets import step_secrets
from sparkdeploy.steps.up import UpResult, back_to_last_good


def rollback(cx: Context, to: int | None) -> UpResult:
    """Roll back; a dry run reads the nodes, lists the exact effects of the switch and restart, and stops there
    (one `dry_session`, inside a recording that carries nothing out, whatever it reaches)."""
    if cx.opts.dry_run:
        with dry_session(), recording(dry=True):
            return _rollback(cx, to)
    return _rollback(cx, to)


def _rollback(cx: Context, to: int | None) -> UpResult:
    res = UpResult()
    t0 = time.monotonic()
    try:
        cx.connect(res.outcomes)
        cx.scan()
        cur = cx.rel[cx.head].current
        common = releases.common_complete({n: cx.rel[n] for n in cx.names})
        if to is None:
            to = releases.last_healthy({n: cx.rel[n] for n in cx.names}, before=cur)
            if to is None:
                raise HealthError(f"no healthy release older than the current one ({cur}) on every node")
        if to not in common:
            lacking = {n: sorted(cx.rel[n].complete) for n in cx.names if to not in cx.rel[n].complete}
            raise HealthError(f"release {to} is not complete on every node: "
                              + "; ".join(f"{n} holds {h}" for n, h in lacking.items())
                              + f" (complete everywhere: {sorted(common)})")
        if engine.opens_without_key(cx, to):
            raise HealthError(f"release {to} was made by a kit that started it without the secrets env file: it "
                              f"would serve without the key auth.api_key_file names; pick a newer release")
        meta = cx.rel[cx.head].complete[to]
        cx.plan = cx.release_plan(to)
        step_secrets(cx, res.outcomes)  # the key is current state: the release starts with today's
        watchdog_was = engine.watchdog_active(cx)
        if cx.opts.dry_run:
            engine.restart_recorded(cx, to, res.outcomes, f"release {cur} -> {to}: stop head, stop workers, "
                                    f"switch, evict + memory guard, start workers, head; {engine.after_restart(cx)}")
            res.release = to
            res.message = f"dry run: would roll back from release {cur} to {to} ({meta.get('image')}); nothing changed"
            return res
        try:
            engine.restart_recorded(cx, to, res.outcomes, f"release {cur} -> {to} started workers-first")
            res.release, res.restarted = to, True
            res.rolled_back_to = to
            rec = releases.read_healthy(cx.conn(cx.head), cx.lay, to)
            res.probe = engine.wait_ready(cx, cx.opts.ready_timeout)
            if not rec:
                engine.gate(cx, to, res.outcomes)
        except Exception as err:  # noqa: BLE001 - see errors.describe
            # The release that was serving goes back, if it had passed its gate everywhere.
            why = describe(err, cx.log)
            back = cur if cur is not None and all(cur in cx.rel[n].healthy for n in cx.names) else None
            res.release = res.rolled_back_to = None
            back_to_last_good(cx, f"rollback to release {to} failed ({why})", back, res, watchdog_was)
            return res
        stopped = engine.after_gate(cx)
        if stopped:
            res.message = (f"release {to} passed its gate and serves, but `rollback` stopped before it finished "
                           f"({stopped[0]}); {stopped[1]}")
            return res
        res.healthy = True
        res.message = f"rolled back from release {cur} to {to} ({meta.get('image')}); healthy"
    except SparkdeployError as err:
        res.message = str(err)
    finally:
        res.seconds = time.monotonic() - t0
    return res
