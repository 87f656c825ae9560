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

One small module per procedure, this one puts the verbs on the cluster context:

    context.py      Options, Context: connections, plan + render, releases found, the desired files
    engine.py       watchdog, stop, evict + memory guard + start, switch, readiness, gate;
                    switch_and_restart and serve_again (the one switch and the one rollback)
    units.py        stale units, units, supervision wiring, retiring nodes outside the plan
    vocab.py        the draft list; secrets.py: the engine's secrets file; image.py: the serving image
    release.py      the new numbered release (or none), prune
    up.py           up + its automatic rollback, UpResult; rollback.py, down.py, healthcheck.py
"""

from __future__ import annotations

import dataclasses

from sparkdeploy import fanout
from sparkdeploy.ops import health as H
from sparkdeploy.steps import down as _down
from sparkdeploy.steps import healthcheck, release
from sparkdeploy.steps import rollback as _rollback
from sparkdeploy.steps import up as _up
from sparkdeploy.steps.base import Outcome
from sparkdeploy.steps.context import Context, Log, Options, facts_from_dict, served
from sparkdeploy.steps.up import UpResult

__all__ = ["Cluster", "Log", "Options", "UpResult", "dry_run_services", "facts_from_dict", "load_cluster", "served"]


class Cluster(Context):
    """Connections + plan for one inventory (steps.context.Context) with the verbs (`up`, `down`, ...) as methods,
    each the function of its procedure module."""

    def __enter__(self) -> "Cluster":
        return self

    # verbs
    def up(self) -> UpResult:
        return _up.up(self)

    def rollback(self, to: int | None) -> UpResult:
        return _rollback.rollback(self, to)

    def down(self, keep_enabled: bool = False) -> list[Outcome]:
        return _down.down(self, keep_enabled)

    def expect(self) -> H.ServiceExpect:
        return healthcheck.expect(self)

    def health(self) -> H.Report:
        return healthcheck.check(self)

    # the release decision, as the step tests drive it
    def current_matches(self) -> tuple[bool, dict[str, str]]:
        return release.current_matches(self)

    def step_release(self, out: list[Outcome]) -> int:
        return release.step_release(self, out)


def load_cluster(inventory_path: str, opts: Options, service: str | None = None) -> Cluster:
    """The cluster of one service of the inventory (`service`, or its only one)."""
    from sparkdeploy.model import inventory as I

    return Cluster(I.load(inventory_path, service), opts)


def dry_run_services(inventory_path: str, opts: Options, services: list[str | None]) -> dict[str | None, UpResult]:
    """`up --dry-run` of each service, side by side: a dry run only reads its own nodes and records, so the
    read-and-diff of N services costs about one (each thread has its own recording context)."""
    dry = dataclasses.replace(opts, dry_run=True)

    def one(service: str | None) -> UpResult:
        with load_cluster(inventory_path, dry, service) as cluster:
            return cluster.up()

    return dict(zip(services, fanout.each(services, one)))
