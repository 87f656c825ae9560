"""Health verdicts from node snapshots and API answers (pure: no nodes, a fake HTTP layer)."""

from __future__ import annotations

import json

import pytest

from sparkdeploy.ops import health

EXP = health.NodeExpect("node1", "head", "sparkdeploy-engine.service", "sparkdeploy-engine", "sha256:aa", 2 << 30, 3,
                        (8000, 29501), ("sparkdeploy-watchdog.timer",))
GOOD = {"docker": "28.3.3", "docker_enabled": "enabled", "unit_enabled": "enabled", "unit_active": "active",
        "extra": {"sparkdeploy-watchdog.timer": ("enabled", "active")},
        "container": "running sha256:aa 2026-11-30T12:00:00Z 0", "mem": str(10 << 30),
        "current": "releases/0003"}


def verdicts(snap, stale=()):
    rep = health.Report()
    health.check_node(rep, EXP, snap, list(stale))
    return rep, {c.name: (c.ok, c.reason) for c in rep.checks}


def test_good_node_is_healthy():
    rep, v = verdicts(GOOD)
    assert rep.healthy, rep.failed()
    assert v["memory"][1].startswith("MemAvailable 10.0 GiB, reserve 2.0 GiB, margin +8.0 GiB")


def test_thin_memory_margin_warns_without_failing():
    rep, v = verdicts({**GOOD, "mem": str(int(2.2 * (1 << 30)))})
    assert rep.healthy and v["memory"][0]
    assert "warning" in v["memory"][1]


@pytest.mark.parametrize("change,check,words", [
    ({"docker": "DOWN"}, "docker", "not answering"),
    ({"unit_enabled": "disabled"}, "unit", "disabled"),
    ({"unit_active": "failed"}, "unit", "failed"),
    ({"container": "absent"}, "container", "does not exist"),
    ({"container": "running sha256:bb 2026 0"}, "container", "expected release image"),
    ({"container": "exited sha256:aa 2026 1"}, "container", "exited"),
    ({"mem": str(1 << 30)}, "memory", "reserve"),
    ({"current": "releases/0002"}, "boot persistence", "expected releases/0003"),
    ({"docker_enabled": "disabled"}, "boot persistence", "docker.service disabled"),
    ({"extra": {"sparkdeploy-watchdog.timer": ("enabled", "inactive")}}, "unit sparkdeploy-watchdog.timer", "inactive"),
    ({"watchdog": json.dumps({"gave_up": True, "reason": "wedged; 2 coupled restarts"})}, "watchdog", "2 coupled"),
])
def test_each_problem_is_named(change, check, words):
    rep, v = verdicts({**GOOD, **change})
    assert not rep.healthy and not v[check][0] and words in v[check][1]


def test_stale_units_are_listed():
    rep, v = verdicts(GOOD, ["old-vllm.service"])
    assert not v["stale units"][0] and "old-vllm.service" in v["stale units"][1]


class FakeResp:
    def __init__(self, status=200, body=None, text=""):
        self.status_code, self._body, self.text = status, body, text

    def json(self):
        return self._body

    def raise_for_status(self):
        if self.status_code >= 400:
            import requests

            raise requests.HTTPError(f"HTTP {self.status_code}")


def _api(monkeypatch, completion="Paris!", health_status=200):
    def get(url, timeout, headers=None):
        if url.endswith("/health"):
            return FakeResp(health_status)
        if url.endswith("/v1/models"):
            return FakeResp(body={"data": [{"id": "tiny"}]})
        return FakeResp(text="vllm:num_requests_running 0\n")

    def post(url, timeout, json, headers=None):
        assert json["temperature"] == 0
        if completion is None:
            return FakeResp(500)
        return FakeResp(body={"choices": [{"text": completion}]})

    monkeypatch.setattr(health.requests, "get", get)
    monkeypatch.setattr(health.requests, "post", post)


def test_probe_byte_identical(monkeypatch):
    _api(monkeypatch)
    rep = health.Report()
    health.check_api(rep, health.ServiceExpect("http://h:8000", "tiny", [], probe_expected="Paris!"))
    assert rep.healthy and "byte-identical" in next(c.reason for c in rep.checks if c.name == "generation")


def test_probe_differs_or_fails_while_health_says_200(monkeypatch):
    _api(monkeypatch, completion="Lyon")
    rep = health.Report()
    health.check_api(rep, health.ServiceExpect("http://h:8000", "tiny", [], probe_expected="Paris!"))
    assert not rep.healthy and "DIFFERS" in rep.failed()[0].reason
    _api(monkeypatch, completion=None)  # the wedged pair: /health 200, a real request fails
    rep = health.Report()
    health.check_api(rep, health.ServiceExpect("http://h:8000", "tiny", [], probe_expected="Paris!"))
    v = {c.name: c.ok for c in rep.checks}
    assert v["/health"] and not v["generation"]


def test_snapshot_reads_a_missing_unit_and_a_stopped_docker_from_the_probe():
    """The probe's sections -> the snapshot check_node reads: a unit systemd does not know is "missing and
    inactive" (what `is-enabled || echo missing` / `is-active` said), MemAvailable comes in bytes."""
    from sparkdeploy.node import probes

    out = ("@@@ docker\nDOWN\n@@@ rc=0\n@@@ units\nId=docker.service\nUnitFileState=disabled\nActiveState=inactive\n\n"
           "Id=sparkdeploy-engine.service\nUnitFileState=\nActiveState=inactive\n\n@@@ rc=0\n"
           "@@@ meminfo\nMemTotal: 125000000 kB\nMemAvailable: 1048576 kB\n@@@ rc=0\n@@@ container\nabsent\n@@@ rc=0\n")
    snap = health.snapshot(probes.split_sections(out), "sparkdeploy-engine.service", ("sparkdeploy-watchdog.timer",))
    assert (snap["docker"], snap["docker_enabled"], snap["mem"]) == ("DOWN", "disabled", str(1 << 30))
    assert snap["extra"] == {"sparkdeploy-watchdog.timer": ("missing", "")}
    rep, v = verdicts(snap)
    assert v["unit"] == (False, "sparkdeploy-engine.service is missing and inactive")
    assert v["docker"] == (False, "dockerd not answering")
    assert v["container"] == (False, "container sparkdeploy-engine does not exist")


def test_the_watchdogs_state_is_read_though_its_file_ends_without_a_newline(tmp_path):
    """The watchdog writes its JSON state without a final newline, so `cat` leaves it on the line of the
    probe's end marker; the parser splits the marker off (before, the section was lost and health never said
    the supervisor had stopped the service)."""
    from sparkdeploy.node import probes
    from sparkdeploy.node.layout import ServiceLayout
    from sparkdeploy.remote.connection import Target
    from sparkdeploy.remote.ssh import LocalConn

    lay = ServiceLayout(etc_root=str(tmp_path / "etc"), state_root=str(tmp_path))
    state = {"gave_up": True, "reason": "retry cap 1 reached"}
    (tmp_path / "etc").mkdir()
    with open(lay.watchdog_state, "w") as f:
        f.write(json.dumps(state))
    argv = probes.named_probe_argv("health", health.NODE_SECTIONS, health.node_values(lay))
    out = LocalConn(Target("node1", "127.0.0.1", local=True)).query(argv, check=False).stdout
    snap = health.snapshot(probes.split_sections(out), lay.unit)
    assert json.loads(snap["watchdog"]) == state
    assert probes.split_sections("@@@ a\nx\nlast@@@ rc=3\n@@@ b\ny\n@@@ rc=0\n") == {
        "a": probes.Section(3, "x\nlast"), "b": probes.Section(0, "y")}
