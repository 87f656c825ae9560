"""`up` and `rollback` over several services (steps/deploy.up_turns, rollback_turns): which turns run, which are
skipped, when the router's step runs. One service's own `up`/`rollback` is replaced by a recorder here: its
behaviour is the cluster tests' (tests/cluster/test_services.py); these pin the order and the stop rules."""

from __future__ import annotations

import pytest

from sparkdeploy.model import inventory
from sparkdeploy.steps import deploy as D
from sparkdeploy.steps.up import UpResult
from tests.unit.test_services import _sim_services, _write


class Recorded:
    def __init__(self):
        self.said: list[tuple] = []

    def begin(self, key):
        self.said.append(("begin", key))

    def end(self, key, run):
        self.said.append(("end", key, None if run is None else run.result.healthy))

    def begin_router(self):
        self.said.append(("router",))


@pytest.fixture
def views(tmp_path):
    """`a` as two replicas (a/1 on node1 + node2, a/2 on node3 + node4), then `b` on a/1's nodes."""
    data = _sim_services()
    data["services"][0].update(replicas=2, nodes=["node1", "node2", "node3", "node4"])
    data["services"][1]["nodes"] = ["node2", "node1"]  # its head on node2: a/1 has its ports on node1
    data.update(auth={"api_key_file": "api_key"}, router={"node": "node1", "port": 8080})
    path = _write(tmp_path, data)
    return str(path), inventory.load_services(path)


def _served_as(monkeypatch, verdicts: dict, interrupted=()):
    calls = []

    def one(path, opts, key, measure=None, *more):
        calls.append(key)
        return D.Served(UpResult(healthy=verdicts[key], release=7), None, key in interrupted)

    monkeypatch.setattr(D, "up_service", one)
    monkeypatch.setattr(D, "rollback_service", lambda path, opts, key, number, measure=None: one(path, opts, key))
    routers = []
    monkeypatch.setattr(D, "router_up", lambda path, opts: routers.append(path) or D.RouterResult(True, "router: 0"))
    return calls, routers


def test_a_failed_replica_leaves_the_next_on_its_release_and_the_other_service_still_goes(views, monkeypatch):
    path, vs = views
    calls, routers = _served_as(monkeypatch, {"a/1": False, "a/2": True, "b": True})
    progress = Recorded()
    turns = D.up_turns(path, D.Options(), vs, None, progress)
    assert calls == ["a/1", "b"]
    assert turns.runs["a/2"] is None and not turns.ok and not turns.interrupted
    assert routers == [] and turns.router is None  # the router waits for every service to serve
    assert progress.said == [("begin", "a/1"), ("end", "a/1", False), ("begin", "a/2"), ("end", "a/2", None),
                             ("begin", "b"), ("end", "b", True)]


def test_every_service_served_then_the_router_and_its_failure_fails_the_up(views, monkeypatch):
    path, vs = views
    calls, routers = _served_as(monkeypatch, {"a/1": True, "a/2": True, "b": True})
    progress = Recorded()
    turns = D.up_turns(path, D.Options(), vs, None, progress)
    assert calls == ["a/1", "a/2", "b"] and routers == [path] and turns.ok
    assert progress.said[-1] == ("router",)
    monkeypatch.setattr(D, "router_up", lambda p, opts: D.RouterResult(False, "router: node1 unreachable"))
    assert not D.up_turns(path, D.Options(), vs, None, Recorded()).ok


def test_a_signal_ends_the_turns_at_the_service_it_hit(views, monkeypatch):
    path, vs = views
    calls, routers = _served_as(monkeypatch, {"a/1": True, "a/2": True, "b": True}, interrupted={"a/2"})
    turns = D.up_turns(path, D.Options(), vs, None, Recorded())
    assert calls == ["a/1", "a/2"] and turns.interrupted and routers == []


def test_a_rollback_stops_at_the_first_replica_that_fails(views, monkeypatch):
    path, _ = views
    calls, _ = _served_as(monkeypatch, {"a/1": False, "a/2": True})
    turns = D.rollback_turns(path, D.Options(), ["a/1", "a/2"], None, None, Recorded())
    assert calls == ["a/1"] and not turns.ok
    calls.clear()
    _served_as(monkeypatch, {"a/1": True, "a/2": True})
    assert D.rollback_turns(path, D.Options(), ["a/1", "a/2"], None, None, Recorded()).ok
