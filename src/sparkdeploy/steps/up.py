"""`up`: converge the nodes on the plan; its automatic rollback; the result it reports (UpResult, `up --json`).

    connect -> facts -> plan + render -> stale units -> image -> vocab -> secrets -> release files -> units
    -> supervision wiring -> exporter -> retire -> [launch check in the new image -> switch + restart]
    -> wait for readiness -> health gate -> prune
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from sparkdeploy.errors import InputError, RemoteError, SparkdeployError, describe
from sparkdeploy.ops import releases
from sparkdeploy.remote.connection import dry_session, recording
from sparkdeploy.steps import engine
from sparkdeploy.steps import image as img
from sparkdeploy.steps.base import CHANGED, FAILED, OK, WARN, WOULD, Outcome, StepFailed
from sparkdeploy.steps.context import Context
from sparkdeploy.steps.launch_check import step_launch_check
from sparkdeploy.steps.monitoring import step_monitoring
from sparkdeploy.steps.release import prune, step_release
from sparkdeploy.steps.secrets import step_secrets
from sparkdeploy.steps.units import retire_others, step_stale, step_supervision, step_units
from sparkdeploy.steps.vocab import step_vocab


@dataclass
class UpResult:
    outcomes: list[Outcome] = field(default_factory=list)
    release: int | None = None
    new_release: bool = False
    restarted: bool = False
    rolled_back_to: int | None = None
    healthy: bool = False
    message: str = ""
    seconds: float = 0.0
    probe: str | None = None

    @property
    def changes(self) -> int:
        return sum(len(o.actions) for o in self.outcomes if o.status in (CHANGED, WOULD))

    def to_dict(self) -> dict:
        return {"healthy": self.healthy, "release": self.release, "new_release": self.new_release,
                "restarted": self.restarted, "rolled_back_to": self.rolled_back_to, "changes": self.changes,
                "seconds": round(self.seconds, 2), "message": self.message, "probe": self.probe,
                "outcomes": [o.to_dict() for o in self.outcomes]}


def step_image(cx: Context, out: list[Outcome]) -> str | None:
    """The serving image on every node, as layers through the head's registry (steps/image.py: converge)."""
    cx.image_id = img.converge(cx, out)
    return cx.image_id


def up(cx: Context) -> UpResult:
    """Converge; a dry run is one `connection.dry_session` (what a step would write is there for the next),
    inside a recording that carries nothing out, whatever it reaches."""
    if cx.opts.dry_run:
        with dry_session(), recording(dry=True):
            return _up(cx)
    return _up(cx)


def _up(cx: Context) -> UpResult:
    res = UpResult()
    t0 = time.monotonic()
    out = res.outcomes
    try:
        cx.connect(out)
        cx.connect([], cx.others, required=False)
        cx.scan()
        cx.make_plan(out)
        step_stale(cx, out)
        step_image(cx, out)
        step_vocab(cx, out)
        step_secrets(cx, out)
        num = step_release(cx, out)
        step_units(cx, out)
        step_supervision(cx, out)
        step_monitoring(cx, out)
        retire_others(cx, out)
        res.release = num
        cur = {cx.rel[n].current for n in cx.names}
        res.new_release = cur != {num}
        active = cx.map(lambda c: c.query(["systemctl", "is-active", "--quiet", cx.lay.unit], check=False).ok)
        need_start = res.new_release or not all(v is True for v in active.values()) or any(
            o.step == "retire" and o.status in (CHANGED, WOULD) for o in out)
        if not need_start and not engine.answers(cx):
            cx.log(f"release {num}: every unit is active but {cx.plan.api_url} answers no completion: "
                   "restarting it, workers first")
            need_start = True
        if need_start and not (num in cx.rel[cx.head].healthy):
            step_launch_check(cx, num, out)  # before anything stops: a refusal leaves the old release serving
        if cx.opts.dry_run:
            if need_start:
                engine.restart_recorded(cx, num, out, "stop head, stop workers, switch, evict + memory guard, "
                                        f"start workers, head; {engine.after_restart(cx)}")
            res.message = (f"dry run: {res.changes} change(s) would be made"
                           + (f"; release {num} would be started" if need_start else ""))
            return res
        watchdog_was = engine.watchdog_active(cx)
        stage = "start"
        # From the first stop on, any failure (memory guard, a node lost mid-switch, the gate) ends in
        # auto_rollback: the last release that passed its gate serving again, or the service stopped.
        try:
            if need_start:
                prev = cx.rel[cx.head].current
                cx.log(f"switching to release {num} (was {prev}): stop head, stop workers, switch, start "
                       "workers, head")
                engine.restart_recorded(cx, num, out, f"release {num} started workers-first")
                res.restarted = True
            stage = "health gate"
            healthy_rec = releases.read_healthy(cx.conn(cx.head), cx.lay, num)
            if need_start or not healthy_rec:
                res.probe = engine.gate(cx, num, out)
            else:
                res.probe = healthy_rec.get("probe")
                out.append(Outcome("health gate", cx.head, OK, f"release {num} already passed its gate"))
        except Exception as err:  # noqa: BLE001 - see errors.describe
            why = describe(err, cx.log)
            out.append(Outcome(stage, cx.head, FAILED, why))
            auto_rollback(cx, num, f"{stage}: {why}", res, watchdog_was)
            return res
        stopped = engine.after_gate(cx)
        if stopped:
            why, again = stopped
            out.append(Outcome("watchdog", cx.head, FAILED, why))
            res.message = (f"release {num} passed its gate and serves, but `up` stopped before it finished ({why}); "
                           f"{again}; re-run up to finish")
            return res
        res.healthy = True
        res.message = (f"release {num} healthy" + (" (new release)" if res.new_release else "")
                       + f"; {res.changes} change(s)")
        try:
            prune(cx)
        except SparkdeployError as err:  # the new release serves: old directories left is not a failed `up`
            out.append(Outcome("prune", "", WARN, f"old releases not pruned: {err}"))
            res.message += f"; old releases not pruned ({err})"
        return res
    except StepFailed as err:
        res.message = str(err)
        return res
    except InputError:
        raise  # bad input, found before anything changed: the CLI exits 2 naming the field
    except SparkdeployError as err:
        out.append(Outcome("up", "", FAILED, str(err)))
        res.message = str(err)
        return res
    finally:
        res.seconds = time.monotonic() - t0


# How long a rollback waits for a node that does not answer (it may be rebooting: the sim's take ~30 s).
REBOOT_WAIT_S = 180


def auto_rollback(cx: Context, failed: int, reason: str, res: UpResult, watchdog_was: bool) -> None:
    """After a failure past the first stop: the newest release older than `failed` that passed its gate on
    every node serves again under its own plan, with the watchdog as it was; with none, the service is
    stopped and disabled (a reboot must not start a release that never passed its gate). A node that fails
    the rollback (most often one rebooting: the reboot that failed the gate) is waited for, up to
    REBOOT_WAIT_S, and the rollback made once more from the start: switch_and_restart is whole each time."""
    what = f"release {failed} failed ({reason})"
    for last_try in (False, True):
        try:
            cx.scan()
            good = releases.last_healthy({n: cx.rel[n] for n in cx.names}, before=failed)
        except SparkdeployError as unread:  # `except ... as` unbinds its name at the block's end: keep it in `err`
            res.message = f"{what}; the releases on the nodes could not be read to roll back: {unread}"
            err: Exception | None = unread
        else:
            err = back_to_last_good(cx, what, good, res, watchdog_was)
            if not isinstance(err, RemoteError):
                return
        err_node = getattr(err, "node", None)
        if last_try or err_node not in cx.names:
            return
        cx.log(f"{err}: waiting up to {REBOOT_WAIT_S} s for {err_node} to answer, then rolling back again")
        if cx.reconnect([err_node], wait=REBOOT_WAIT_S):
            res.message += f"; {err_node} did not answer within {REBOOT_WAIT_S} s: re-run up once it does"
            return


def back_to_last_good(cx: Context, what: str, good: int | None, res: UpResult,
                      watchdog_was: bool) -> Exception | None:
    """Put release `good` (passed its gate on every node) back with engine.serve_again (its plan, watchdog as
    it was, waited for); with no good release, stop and disable the service. The message says which; returns
    the error that stopped it (None: done)."""
    try:
        if good is None:
            engine.stop_and_disable(cx)
            res.message = (f"{what}; no healthy release to go back to: the service is STOPPED and disabled; "
                           "fix and re-run `up`")
            return None
        if engine.opens_without_key(cx, good):
            engine.stop_and_disable(cx)
            res.message = (f"{what}; release {good}, the last that passed its gate, would serve without the key "
                           "auth.api_key_file names (a kit before keys were current state made it): the service is "
                           "STOPPED and disabled rather than open; fix and re-run `up`")
            return None
        cx.log(f"{what}: rolling back to release {good}")
        rec: dict = {}

        def ready() -> str:
            rec.update(releases.read_healthy(cx.conn(cx.head), cx.lay, good) or {})
            return engine.wait_ready(cx, cx.opts.rollback_timeout)

        text = engine.serve_again(cx, good, watchdog_was=watchdog_was,
                                  started=lambda: setattr(res, "rolled_back_to", good), wait=ready)
        ok = text == rec.get("probe", text)
        res.message = (f"{what}; ROLLED BACK to release {good}"
                       + (" which is healthy again" if ok else f" but its probe now differs: {text!r}"))
        return None
    except Exception as err:  # noqa: BLE001 - see errors.describe
        why = describe(err, cx.log)
        res.message = (f"{what}; rolling back to release {good} did not complete either: {why}"
                       if good is not None else f"{what}; and stopping the service failed: {why}")
        return err

