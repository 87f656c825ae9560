"""The step framework, pyinfra style: a step reads a node's actual state, compares it with the plan, and
returns only the actions that close the difference. Apply runs them; a dry run runs them against
`connection.recording(dry=True)`, which carries nothing out, so both report the same exact effects (each command
and file write, `Outcome.effects`): what `up --dry-run` prints is what `up` then does.

Each step reports per node: ok (nothing to do), changed (actions ran), failed (with the reason), skipped.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

from sparkdeploy.errors import SparkdeployError
from sparkdeploy.fanout import parallel
from sparkdeploy.remote.connection import recording
from sparkdeploy.verdict import Status

# the per-node outcome of a step, in the kit's one result vocabulary
OK, CHANGED, WARN, FAILED, SKIPPED, WOULD = (Status.OK, Status.CHANGED, Status.WARN, Status.FAILED, Status.SKIPPED,
                                             Status.WOULD_CHANGE)


@dataclass
class Action:
    what: str  # one line, shown by --dry-run and in the report
    do: Callable[[], object]


@dataclass
class Outcome:
    step: str
    node: str
    status: Status
    detail: str = ""
    actions: list[str] = field(default_factory=list)
    seconds: float = 0.0
    effects: list[str] = field(default_factory=list)  # "node: run ARGV" / "node: write PATH mode ..." / "node: link"

    def to_dict(self) -> dict:
        return {"step": self.step, "node": self.node, "status": self.status, "detail": self.detail,
                "actions": self.actions, "effects": self.effects, "seconds": round(self.seconds, 3),
                "diffs": {e: e.diff for e in self.effects if getattr(e, "diff", "")}}  # a dry run's file writes


class StepFailed(SparkdeployError):
    """A step failed on at least one node; carries the outcomes."""

    def __init__(self, step: str, outcomes: list[Outcome]):
        self.outcomes = outcomes
        bad = [o for o in outcomes if o.status == FAILED]
        super().__init__(f"step {step} failed: " + "; ".join(f"{o.node}: {o.detail}" for o in bad))


def run_one(step: str, node: str, diff: Callable[[], list[Action]], dry_run: bool,
            log: Callable[[str], None] | None = None) -> Outcome:
    t0 = time.monotonic()
    done: list[str] = []
    effects: list[str] = []
    try:
        actions = diff()
        if not actions:
            return Outcome(step, node, OK, "", [], time.monotonic() - t0)
        for a in actions:
            if log and not dry_run:
                log(f"{node}: {step}: {a.what}")
            with recording(dry=dry_run) as made:
                try:
                    a.do()
                finally:
                    effects += made
            done.append(a.what)
        return Outcome(step, node, WOULD if dry_run else CHANGED, "", done, time.monotonic() - t0, effects)
    except Exception as err:  # noqa: BLE001 - every failure becomes a per-node outcome with its reason
        msg = str(err) if isinstance(err, SparkdeployError) else f"{type(err).__name__}: {err}"
        return Outcome(step, node, FAILED, msg, done, time.monotonic() - t0, effects)


def run_step(step: str, nodes: Iterable[str], diff_for: Callable[[str], list[Action]], *, dry_run: bool = False,
             ordered: bool = False, log: Callable[[str], None] | None = None, fail_fast: bool = True) -> list[Outcome]:
    """Run a step on nodes (in parallel unless `ordered`); raise StepFailed if any node failed."""
    names = list(nodes)
    if ordered:
        outs = []
        for n in names:
            o = run_one(step, n, lambda n=n: diff_for(n), dry_run, log)
            outs.append(o)
            if o.status == FAILED and fail_fast:
                break
    else:
        res = parallel(names, lambda n: run_one(step, n, lambda: diff_for(n), dry_run, log))
        outs = [res[i] for i in range(len(names))]
    if any(o.status == FAILED for o in outs):
        raise StepFailed(step, outs)
    return outs
