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
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from sparkdeploy import fanout
from sparkdeploy.ops import releases
from sparkdeploy.steps.context import Context, Log, Options, facts_from_dict, load_context
from sparkdeploy.steps.down import down
from sparkdeploy.steps.healthcheck import check as health
from sparkdeploy.steps.healthcheck import expect
from sparkdeploy.steps.interrupts import interrupt_as_failure
from sparkdeploy.steps.rollback import rollback
from sparkdeploy.steps.up import UpResult, up

__all__ = ["Context", "Log", "Options", "Served", "UpResult", "back_in_rotation", "down", "dry_run_services", "expect",
           "facts_from_dict", "health", "load_context", "rollback", "rollback_service", "up", "up_service"]

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
