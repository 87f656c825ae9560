"""One replica of a service out of the router's rotation while it restarts, and back in once it serves again.

vLLM's router keeps its workers in memory and changes them through its admin API, behind the API key on the
router's own port (the launcher passes every path but OpenAI's to the core): `DELETE /workers/{url}` sends the
worker no new request, `POST /workers` registers it again. What it is already serving finishes: the replica is
stopped only once its engine reports no request running or waiting, so a client of the router sees no failure
while the other replicas take the load (tests/unit/test_rotation.py drives the real router core).

Where the router does not answer (the first `up`, before the router step has installed it), the replica
restarts without leaving a rotation nobody serves from.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable
from urllib.parse import quote

import requests

from sparkdeploy import poll
from sparkdeploy.bench import metrics
from sparkdeploy.errors import BenchError
from sparkdeploy.model.inventory import Inventory
from sparkdeploy.ops.health import bearer
from sparkdeploy.plan.router import Worker, plan_router

IDLE_TIMEOUT_S = 300  # the longest a replica's requests in flight may take to finish before it stops anyway
SETTLE_S = 1.0  # a request the router sent just before the worker left reaches the engine within this


@dataclass
class Rotation:
    router_url: str
    api_key: str | None
    worker: Worker
    log: Callable[[str], None]
    out: bool = False  # taken out by `leave`, not yet put back

    def leave(self, api_url: str, idle_timeout: float = IDLE_TIMEOUT_S) -> None:
        """Take the replica out of the rotation, then wait until its engine (at `api_url`) serves no request."""
        try:
            workers = self.workers()
            if self.worker.url not in workers:
                self.log(f"{self.worker.key} ({self.worker.url}) is not in the router's rotation: nothing to take "
                         "out")
                return
            if not any(m == self.worker.model and u != self.worker.url for u, m in workers.items()):
                self.log(f"no other replica of {self.worker.model} is in the router's rotation: its requests get "
                         f"503 until {self.worker.key} serves again")
            requests.delete(f"{self.router_url}/workers/{quote(self.worker.url, safe='')}",
                            headers=bearer(self.api_key), timeout=10).raise_for_status()
        except (requests.RequestException, ValueError, KeyError, TypeError) as err:
            self.log(f"the router at {self.router_url} did not take {self.worker.key} out of its rotation "
                     f"({type(err).__name__}: {err}): it restarts without leaving it")
            return
        self.out = True
        self.log(f"{self.worker.key} out of the router's rotation; waiting for its requests in flight to finish")
        time.sleep(SETTLE_S)
        try:
            poll.until(lambda: _idle(api_url), timeout=idle_timeout, interval=0.5,
                       note=lambda el, last: self.log(f"{self.worker.key}: {last} ({el:.0f}/{idle_timeout:.0f} s)"))
        except poll.TimedOut as timed_out:
            self.log(f"{self.worker.key} still {timed_out.last} after {idle_timeout:.0f} s: stopping it anyway")

    def rejoin(self) -> None:
        """Put the replica back, if `leave` took it out (a failure is said, not raised: the release serves)."""
        if not self.out:
            return
        try:
            if self.worker.url not in self.workers():  # a router restarted meanwhile registered it from its config
                r = requests.post(f"{self.router_url}/workers", headers=bearer(self.api_key), timeout=30,
                                  json={"url": self.worker.url, "model_id": self.worker.model})
                r.raise_for_status()
        except (requests.RequestException, ValueError, KeyError, TypeError) as err:
            self.log(f"could not put {self.worker.key} back into the router's rotation ({err}): it serves, but "
                     f"the router sends it nothing until the router restarts (re-run `up`, or `systemctl restart "
                     f"sparkdeploy-router` on the router's node)")
            return
        self.out = False
        self.log(f"{self.worker.key} back in the router's rotation")

    def workers(self) -> dict[str, str]:
        """The router's workers: url -> model."""
        r = requests.get(f"{self.router_url}/workers", headers=bearer(self.api_key), timeout=10)
        r.raise_for_status()
        return {w["url"]: w["model_id"] for w in r.json()["workers"]}


def _idle(api_url: str) -> None:
    try:
        snap = metrics.scrape(api_url, timeout=5)
    except BenchError:
        return  # the engine does not answer: nothing left to finish
    busy = snap.value(metrics.RUNNING) + snap.value(metrics.WAITING)
    if busy:
        raise poll.NotYet(f"serving {busy:.0f} request(s)")


def of(inv: Inventory, views: tuple[Inventory, ...], log: Callable[[str], None]) -> Rotation | None:
    """The rotation a replica of `views` (the inventory's services) leaves while it restarts; None for a service
    with one copy or an inventory without a router."""
    rp = plan_router(views) if inv.replica else None
    if rp is None:
        return None
    worker = next(w for w in rp.workers if w.key == inv.key)
    return Rotation(rp.url, inv.auth.api_key(), worker, log)
