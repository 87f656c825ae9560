"""One service's `vocab rollout` or `vocab rollback` as a command runs it, the way steps.deploy.up_service runs
an `up`: a signal becomes the rollout's failure (so it rolls back), a replica that left the router's rotation
goes back once a list serves, and the speed sentinel measures a release the rollout made."""

from __future__ import annotations

from typing import Callable

from sparkdeploy.steps.context import Context, Options, load_context
from sparkdeploy.steps.deploy import Measure, Served, back_in_rotation
from sparkdeploy.steps.interrupts import interrupt_as_failure
from sparkdeploy.steps.vocab_rollout import Rollout, RolloutOptions
from sparkdeploy.steps.vocab_rollout.checks import Candidate
from sparkdeploy.verdict import Status


def rollout_service(inventory_path: str, run: Options, service: str | None, candidate: Callable[[Context], Candidate],
                    opts: RolloutOptions, tok, what: str, measure: Measure | None = None) -> Served:
    """Roll `candidate(context)` out on one service (or replica, `NAME/R`); `what` names the verb in messages."""
    speed = None
    with load_context(inventory_path, run, service) as cx, interrupt_as_failure(what, run.log) as signalled:
        res = Rollout(cx, candidate(cx), opts, tok).run()
        back_in_rotation(cx, True)  # a rollout leaves a list serving: the new one or the one before
        if measure and res.status == Status.CHANGED:
            speed = measure(cx, res.release)
    res.message = signalled.tell(res.message)
    res.sentinel = speed
    return Served(res, speed, signalled.fired)
