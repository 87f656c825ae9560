"""The main job: `up` (converge the nodes on the plan), `down`, `rollback`, and the health gate.

Order of `up` (each a step with ok | changed | failed per node; a failure stops before anything is switched):

    connect -> facts -> plan + render -> stale units -> image -> vocab -> secrets -> release files -> units
    -> supervision wiring -> monitoring -> retire nodes outside the plan -> launch check (the new image's
    vLLM judges the new argv) -> [switch + restart: stop head, stop workers, switch `current`, start workers,
    head] -> wait for readiness -> health gate (temperature-0 probe recorded) -> prune
    (docs/ARCHITECTURE.md section 1 has each step's effects on the node)

Nothing is half-applied: files land in a new numbered release directory that no unit reads until every node
holds all of it; `current` is switched on all nodes only then. A failed gate switches back to the last
healthy release (automatic rollback) or stops the service with the reason.

Idempotence: facts are re-used from the current release while its engine runs (measuring MemAvailable with
the engine loaded would change the memory figures and so the release), and the desired files are compared
byte for byte with the current release's: nothing differs -> no new release, no restart, zero changes.

The verbs, each a function of the cluster context (`Context`: connections, plan + render, releases found),
each in its own module; this one names them for the CLI, the rollout and the tests:

    context.py      Options, Context, load_context
    engine.py       watchdog, stop, evict + memory guard + start, switch, readiness, gate;
                    switch_and_restart and serve_again (the one switch and the one rollback)
    units.py        stale units, units, supervision wiring, retiring nodes outside the plan
    vocab.py        the draft list; secrets.py: the engine's secrets file; image.py: the serving image
    release.py      the new numbered release (or none), prune
    up.py           up + its automatic rollback, UpResult; rollback.py, down.py, healthcheck.py (health, expect)

and runs them over an inventory's services (one service's `up`/`rollback` with its signal and sentinel:
`up_service`, `rollback_service`; every service in turn: `up_turns` then `router_up`, `rollback_turns`,
`until_one_fails` for the vocab rollout).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Protocol

from sparkdeploy import fanout
from sparkdeploy.errors import SparkdeployError
from sparkdeploy.model import inventory as inventory_mod
from sparkdeploy.model.inventory import Inventory
from sparkdeploy.ops import releases
from sparkdeploy.steps.base import CHANGED, FAILED, WOULD, Outcome, StepFailed
from sparkdeploy.steps.context import Context, Log, Options, facts_from_dict, load_context
from sparkdeploy.steps.down import down
from sparkdeploy.steps.healthcheck import check as health
from sparkdeploy.steps.healthcheck import expect
from sparkdeploy.steps.interrupts import interrupt_as_failure
from sparkdeploy.steps.rollback import rollback
from sparkdeploy.steps.up import UpResult, up

__all__ = ["Context", "Log", "Options", "RouterResult", "Served", "Turns", "UpResult", "back_in_rotation", "down",
           "dry_run_services", "expect", "facts_from_dict", "health", "load_context", "rollback", "rollback_service",
           "rollback_turns", "router_up", "until_one_fails", "up", "up_service", "up_turns"]

# the speed sentinel's verdict on release `number`, which just passed its gate (compared with release `against`,
# None: the newest older healthy one); the CLI passes bench.sentinel's, which sits above this layer
Measure = Callable[..., dict]


@dataclass
class Served:
    """One service's `up`, `rollback` or vocab rollout (rollout.service) as a command runs it: the result, the
    sentinel's verdict (None: not measured) and whether a signal ended it (a command over several services then
    stops)."""
    result: UpResult  # or a RolloutResult
    speed: dict | None = None
    interrupted: bool = False


def up_service(inventory_path: str, opts: Options, service: str | None, measure: Measure | None = None) -> Served:
    """`up` of one service, a signal turned into its failure (so it rolls back); the sentinel measures a release
    that restarted, or one that serves without its speed record."""
    speed = None
    with load_context(inventory_path, opts, service) as cx, interrupt_as_failure("up", opts.log) as signalled:
        res = up(cx)
        back_in_rotation(cx, res.healthy or res.rolled_back_to is not None)
        if measure and res.healthy and (res.restarted or not releases.read_sentinel(cx.conn(cx.head), cx.lay,
                                                                                     res.release)):
            speed = measure(cx, res.release)
    res.message = signalled.tell(res.message)
    return Served(res, speed, signalled.fired)


def rollback_service(inventory_path: str, opts: Options, service: str | None, number: int | None,
                     measure: Measure | None = None) -> Served:
    """`rollback` of one service; the sentinel compares the release with its own earlier record where it has
    one (how fast it was when it served), else with the newest older healthy release."""
    speed = None
    with load_context(inventory_path, opts, service) as cx, interrupt_as_failure("rollback", opts.log) as signalled:
        res = rollback(cx, number)
        back_in_rotation(cx, res.healthy or res.rolled_back_to is not None)
        if measure and res.healthy and res.restarted:
            own = releases.read_sentinel(cx.conn(cx.head), cx.lay, res.release)
            speed = measure(cx, res.release, against=res.release if own else None)
    res.message = signalled.tell(res.message)
    return Served(res, speed, signalled.fired)


def back_in_rotation(cx: Context, serving: bool) -> None:
    """A replica that left the router's rotation to restart goes back once a release serves (the new one, or the
    one rolled back to); a stopped one (`serving` False) stays out."""
    if cx.rotation is not None and serving:
        cx.rotation.rejoin()


def dry_run_services(inventory_path: str, opts: Options, services: list[str | None]) -> dict[str | None, UpResult]:
    """`up --dry-run` of each service, side by side: a dry run only reads its own nodes and records, so the
    read-and-diff of N services costs about one (each thread has its own recording context)."""
    dry = dataclasses.replace(opts, dry_run=True)

    def one(service: str | None) -> UpResult:
        with load_context(inventory_path, dry, service) as cx:
            return up(cx)

    return dict(zip(services, fanout.each(services, one)))


class Progress(Protocol):
    """What a command over several services shows as it goes (the CLI prints; a test may record)."""

    def begin(self, key: str | None) -> None: ...  # a service's (replica's) turn starts

    def end(self, key: str | None, run: Served | None) -> None: ...  # it ended (None: skipped)

    def begin_router(self) -> None: ...  # `up`'s router step starts, after every service


@dataclass
class Turns:
    """A command's turns over the services it acts on, in order: each one's `Served` (None: skipped), whether
    all served, whether a signal ended the command, and the router's step after them (None: not run)."""
    runs: dict = field(default_factory=dict)
    ok: bool = True
    interrupted: bool = False
    router: RouterResult | None = None


@dataclass
class RouterResult:
    ok: bool
    message: str
    changes: int = 0
    outcomes: list[Outcome] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"ok": self.ok, "message": self.message, **({"changes": self.changes} if self.ok else {}),
                "outcomes": [o.to_dict() for o in self.outcomes]}


def served(run: Served, dry_run: bool) -> bool:
    """A service's turn succeeded: it serves healthy, or a dry run found nothing that would fail."""
    return run.result.healthy or (dry_run and not any(o.status == FAILED for o in run.result.outcomes))


def rolled_back(run: Served, dry_run: bool) -> bool:
    """A replica's rollback succeeded: it serves healthy, or a dry run found the release to go back to."""
    return run.result.healthy or (dry_run and run.result.release is not None)


def up_turns(inventory_path: str, opts: Options, views: tuple[Inventory, ...], measure: Measure | None,
             progress: Progress) -> Turns:
    """`up` of each service in turn, then the router. A dry run reads them side by side. A service's replicas go
    one at a time; one that fails leaves the next on their release (skipped), other services still go. A signal
    ends the turns at the service it hit, and the router is not touched unless every service served."""
    keys = [v.key for v in views]
    service_of = {v.key: v.service for v in views}
    dry = dry_run_services(inventory_path, opts, keys) if opts.dry_run and len(keys) > 1 else {}
    turns, failed = Turns(), set()
    for key in keys:
        progress.begin(key)
        if service_of[key] in failed and not opts.dry_run:
            turns.runs[key] = None
            progress.end(key, None)
            continue
        run = Served(dry[key]) if key in dry else up_service(inventory_path, opts, key, measure)
        turns.runs[key] = run
        progress.end(key, run)
        if not served(run, opts.dry_run):
            turns.ok = False
            failed.add(service_of[key])
        if run.interrupted:
            turns.interrupted = True
            break
    if turns.ok and not turns.interrupted and keys[0] is not None:
        progress.begin_router()
        turns.router = router_up(inventory_path, opts)
        turns.ok = turns.router.ok
    return turns


def rollback_turns(inventory_path: str, opts: Options, keys: list[str | None], number: int | None,
                   measure: Measure | None, progress: Progress) -> Turns:
    """`rollback` of each replica in turn, until one fails."""
    return until_one_fails(keys, lambda key: rollback_service(inventory_path, opts, key, number, measure),
                           lambda run: rolled_back(run, opts.dry_run), progress)


def until_one_fails(keys: list[str | None], run_one: Callable[[str | None], Served],
                    succeeded: Callable[[Served], bool], progress: Progress) -> Turns:
    """Each in turn; the first that fails, or a signal, ends the turns (the replicas after it keep their
    release). `rollback` and the vocab rollout and rollback go so."""
    turns = Turns()
    for key in keys:
        progress.begin(key)
        run = run_one(key)
        turns.runs[key] = run
        progress.end(key, run)
        turns.ok, turns.interrupted = succeeded(run), run.interrupted
        if not turns.ok or run.interrupted:
            break
    return turns


def router_up(inventory_path: str, opts: Options) -> RouterResult:
    """After every service: the router where the inventory names one, gone from the nodes where it does not."""
    from sparkdeploy.steps.router import step_router

    try:
        out = step_router(inventory_mod.load_services(inventory_path), dry_run=opts.dry_run,
                          trust_new_hosts=opts.trust_new_hosts, log=opts.log)
    except StepFailed as failed:
        return RouterResult(False, str(failed), outcomes=list(failed.outcomes))
    except SparkdeployError as failed:
        return RouterResult(False, str(failed))
    changes = sum(len(o.actions) for o in out if o.status in (CHANGED, WOULD))
    return RouterResult(True, f"router: {changes} change(s)", changes, out)
