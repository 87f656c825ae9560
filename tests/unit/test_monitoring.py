"""The exporter and what ships with it under deploy/monitoring/: the figures as a pure function of the inputs,
a real HTTP scrape that Debian's `promtool check metrics` accepts, a scrape config `promtool check config`
accepts, and a Grafana dashboard whose every query names a metric the exporter really publishes.

promtool comes from the `prometheus` Debian package (scripts/setup.sh, .ci/run): these tests skip without it
only outside CI; in CI a missing promtool fails them.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from sparkdeploy import exporter, paths
from sparkdeploy.bench import client, metrics, sentinel
from sparkdeploy.steps import monitoring
from tests.support.vllm_server import free_port, venv_python
from tests.unit.bench.fake_vllm import FakeVllm
from tests.unit.bench.metrics_text import metrics_text

MONITORING = paths.repo_root() / "deploy" / "monitoring"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None and not os.environ.get("CI"),
                                    reason="no promtool (apt-get install prometheus; scripts/setup.sh does)")

STATE = {"release": 7, "restarts": [1000.0, 1100.0], "failures": 1, "last_tick": 1200.0, "last_ok": 900.0,
         "last_restart": 1100.0, "last_action": "restart", "last_why": "wedged; coupled restart 2/4"}
RECORD = {"schema": sentinel.SCHEMA, "release": {"number": 7}, "settings": {}, "service": {},
          "categories": {"code": {"acceptance_length": [2.5, 2.6, 2.4], "accept_pos": [[0.8, 0.9, 0.7], [0.6] * 3],
                                  "decode_tok_s": [40.0, 41.0, 39.0]},
                         "prose_zh_hans": {"acceptance_length": [1.2] * 3, "accept_pos": [[0.1] * 3, [0.05] * 3],
                                           "decode_tok_s": [30.0] * 3}}}


def samples(fams) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in fams for s in f.samples}


# ------------------------------------------------------------------------------------------------ pure
def test_figures_from_the_watchdog_state_release_and_sentinel_record():
    got = samples(exporter.families(state=STATE, release=7, record=RECORD, live=None, engine_up=True))
    assert got[("sparkdeploy_release_number", ())] == 7
    assert got[("sparkdeploy_watchdog_verdict", (("action", "restart"),))] == 1
    assert got[("sparkdeploy_watchdog_verdict", (("action", "none"),))] == 0
    assert got[("sparkdeploy_watchdog_restarts", ())] == 2 and got[("sparkdeploy_watchdog_failures", ())] == 1
    assert got[("sparkdeploy_watchdog_gave_up", ())] == 0
    assert got[("sparkdeploy_watchdog_last_restart_timestamp_seconds", ())] == 1100.0
    assert ("sparkdeploy_watchdog_gave_up_timestamp_seconds", ()) not in got
    assert got[("sparkdeploy_sentinel_acceptance_length", (("category", "code"),))] == 2.5  # the median
    assert got[("sparkdeploy_sentinel_accept_position", (("category", "code"), ("position", "0")))] == 0.8
    assert got[("sparkdeploy_sentinel_decode_tokens_per_second", (("category", "prose_zh_hans"),))] == 30.0
    assert got[("sparkdeploy_sentinel_release_number", ())] == 7
    assert all(got[("sparkdeploy_exporter_source_up", (("source", s),))] == 1 for s in exporter.SOURCES)


def test_a_give_up_and_missing_inputs_show_as_such():
    state = dict(STATE, gave_up=True, gave_up_at=1300.0, last_action="give_up")
    got = samples(exporter.families(state=state, release=None, record=None, live=None, engine_up=False))
    assert got[("sparkdeploy_watchdog_gave_up", ())] == 1
    assert got[("sparkdeploy_watchdog_gave_up_timestamp_seconds", ())] == 1300.0
    assert got[("sparkdeploy_watchdog_verdict", (("action", "give_up"),))] == 1
    assert got[("sparkdeploy_exporter_source_up", (("source", "release"),))] == 0
    assert got[("sparkdeploy_exporter_source_up", (("source", "sentinel"),))] == 0
    assert not any(name.startswith(("sparkdeploy_sentinel", "sparkdeploy_release", "sparkdeploy_live"))
                   for name, _ in got)


def test_live_acceptance_from_counter_deltas_and_none_across_a_restart():
    before = metrics.parse(metrics_text(drafts=100, accepted=150, per_pos=(80, 70), success=5))
    after = metrics.parse(metrics_text(drafts=140, accepted=180, per_pos=(100, 80), success=6))
    live = exporter.live_figures(before, after)
    got = samples(exporter.families(state=None, release=None, record=None, live=live, engine_up=True))
    assert got[("sparkdeploy_live_acceptance_length", ())] == pytest.approx(1 + 30 / 40)
    assert got[("sparkdeploy_live_accept_position", (("position", "0"),))] == pytest.approx(20 / 40)
    assert got[("sparkdeploy_live_drafts", ())] == 40
    idle = exporter.live_figures(after, after)  # no traffic between the scrapes: no figure, zero drafts
    got = samples(exporter.families(state=None, release=None, record=None, live=idle, engine_up=True))
    assert got[("sparkdeploy_live_drafts", ())] == 0 and ("sparkdeploy_live_acceptance_length", ()) not in got
    restarted = metrics.parse(metrics_text(drafts=5, accepted=5, per_pos=(3, 2), created=1.8e9, start=1.8e9))
    assert exporter.live_figures(after, restarted) is None
    assert exporter.live_figures(before, metrics.parse(metrics_text(spec=False))) is None


def test_release_number_is_where_current_points(tmp_path):
    (tmp_path / "releases" / "0012").mkdir(parents=True)
    (tmp_path / "current").symlink_to("releases/0012")
    assert exporter.release_number(str(tmp_path / "current")) == 12
    assert exporter.release_number(str(tmp_path / "absent")) is None


# ------------------------------------------------------------------------------------ a real HTTP scrape
def _inputs(tmp) -> list[str]:
    """The head's inputs, as files under tmp: release 7 current, the watchdog state, the sentinel record."""
    (tmp / "releases" / "0007").mkdir(parents=True)
    (tmp / "current").symlink_to("releases/0007")
    (tmp / "watchdog.json").write_text(json.dumps(STATE))
    (tmp / "sentinel.json").write_text(json.dumps(RECORD))
    return ["--state", str(tmp / "watchdog.json"), "--current", str(tmp / "current"),
            "--sentinel", str(tmp / "sentinel.json")]


@contextlib.contextmanager
def _serving(python: list[str], engine_url: str, inputs: list[str], **popen):
    """The exporter started with `python` on a free loopback port; yields its /metrics URL once it answers."""
    port = free_port()
    proc = subprocess.Popen([*python, "-m", "sparkdeploy.exporter", "--listen", f"127.0.0.1:{port}",
                             "--engine", engine_url, *inputs], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            **popen)
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        deadline = time.monotonic() + 30
        while True:
            try:
                requests.get(url, timeout=5).raise_for_status()
                break
            except requests.RequestException:
                if proc.poll() is not None or time.monotonic() > deadline:
                    said = proc.stdout.read() if proc.poll() is not None else ""
                    raise AssertionError(f"exporter did not serve: {said}")
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def scrape(tmp_path_factory):
    """`python -m sparkdeploy.exporter` on a free loopback port against the fake engine: one scrape, real
    traffic, a second scrape (so the live figures exist); returns the second scrape's text."""
    inputs = _inputs(tmp_path_factory.mktemp("exporter"))
    with FakeVllm() as engine, _serving([sys.executable], engine.url, inputs) as url:
        svc = client.discover(engine.url)
        client.stream_chat(svc, [{"role": "user", "content": "hello"}], 20)
        resp = requests.get(url, timeout=5)
        resp.raise_for_status()
        return resp.text


def test_the_code_shipped_to_the_head_runs_on_the_engine_images_python(tmp_path):
    """What `up` copies to the head (steps/monitoring.code_archive), run by the vLLM venv's Python (what the
    serving image has) from that copy alone: it imports, serves, and reads its inputs."""
    python = venv_python()
    if python is None:
        assert not os.environ.get("CI"), "the vLLM CPU venv is missing in CI"
        pytest.skip("no vLLM CPU venv (scripts/setup.sh makes it)")
    archive, digest, count = monitoring.code_archive()
    assert monitoring.code_archive()[:2] == (archive, digest)  # stable bytes: an unchanged kit ships nothing
    code = tmp_path / "kit"
    code.mkdir()
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(code, filter="data")
    assert (code / "sparkdeploy" / "exporter.py").is_file() and count > 20
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(code), "PYTHONDONTWRITEBYTECODE": "1"}
    where = subprocess.run([str(python), "-c", "import sparkdeploy.exporter as e; print(e.__file__)"],
                           capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert where.stdout.strip() == str(code / "sparkdeploy" / "exporter.py"), where.stderr[-2000:]
    with FakeVllm() as engine, _serving([str(python)], engine.url, _inputs(tmp_path), env=env, cwd=tmp_path) as url:
        text = requests.get(url, timeout=5).text
    values = {(s.name, tuple(sorted(s.labels.items()))): s.value
              for f in text_string_to_metric_families(text) for s in f.samples}
    assert values[("sparkdeploy_release_number", ())] == 7
    assert values[("sparkdeploy_exporter_source_up", (("source", "engine"),))] == 1
    assert values[("sparkdeploy_sentinel_decode_tokens_per_second", (("category", "code"),))] == 40.0


def published(text: str) -> set[str]:
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def test_the_scrape_over_http_carries_every_kind_of_figure(scrape):
    names = published(scrape)
    for name in ("sparkdeploy_release_number", "sparkdeploy_watchdog_verdict", "sparkdeploy_watchdog_restarts",
                 "sparkdeploy_watchdog_gave_up", "sparkdeploy_sentinel_acceptance_length",
                 "sparkdeploy_live_acceptance_length", "sparkdeploy_exporter_source_up"):
        assert name in names, name
    # 20 tokens: the fake engine counts 10 verify steps, positions accepted round(7.5) and 5 times -> 1 + 13/10
    assert 'sparkdeploy_live_acceptance_length 2.3' in scrape


@needs_promtool
def test_promtool_accepts_the_scrape(scrape):
    r = subprocess.run([PROMTOOL or "promtool", "check", "metrics"], input=scrape, capture_output=True, text=True)
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), r.stdout + r.stderr


@needs_promtool
def test_promtool_accepts_the_scrape_config():
    r = subprocess.run([PROMTOOL or "promtool", "check", "config", str(MONITORING / "prometheus.yml")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


# ------------------------------------------------------------------------------------------ the dashboard
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
                "offset"}


def dashboard() -> dict:
    return json.loads((MONITORING / "grafana-dashboard.json").read_text())


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers that are not functions, keywords, labels
    (inside {} or by/without (...)), strings or durations."""
    expr = re.sub(r'"[^"]*"|\'[^\']*\'', "", expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = re.finditer(r"(?<![A-Za-z0-9_:])[A-Za-z_:][A-Za-z0-9_:]*(?![A-Za-z0-9_:])(?!\s*\()", expr)
    return {m.group(0) for m in names if m.group(0) not in PROMQL_WORDS}


def test_the_dashboard_is_grafana_shaped():
    d = dashboard()
    assert isinstance(d["title"], str) and d["uid"] and isinstance(d["schemaVersion"], int)
    assert d["panels"] and len({p["id"] for p in d["panels"]}) == len(d["panels"])
    for p in d["panels"]:
        assert p["type"] in ("timeseries", "stat") and p["title"], p
        assert set(p["gridPos"]) == {"x", "y", "w", "h"} and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24, p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["refId"] and isinstance(t["expr"], str) and t["expr"].strip(), p["title"]


def test_every_query_of_the_dashboard_names_a_metric_the_exporter_publishes(scrape):
    names = published(scrape)
    used = {}
    for p in dashboard()["panels"]:
        for t in p["targets"]:
            used.update({n: p["title"] for n in metric_names(t["expr"])})
    assert used, "the dashboard queries no metric"
    unknown = {n: title for n, title in used.items() if n not in names}
    assert not unknown, f"queried but not published: {unknown}"
    # and the other way round: every family the exporter publishes is on the dashboard
    assert {n for n in names if n.startswith("sparkdeploy_")} <= set(used)


def test_the_name_reader_sees_through_functions_labels_and_ranges():
    expr = 'max by (action) (sparkdeploy_watchdog_verdict{action="x"})'
    assert metric_names(expr) == {"sparkdeploy_watchdog_verdict"}
    assert metric_names("changes(a_b[1h]) / ignoring(x) c - time()") == {"a_b", "c"}


@needs_promtool
def test_promtool_parses_every_dashboard_query(tmp_path):
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:q{i}", "expr": t["expr"]}
        for i, t in enumerate(t for p in dashboard()["panels"] for t in p["targets"])]}]}
    path = tmp_path / "rules.yml"
    path.write_text(json.dumps(rules))
    r = subprocess.run([PROMTOOL or "promtool", "check", "rules", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr



def test_a_node_that_is_no_longer_the_head_loses_its_exporter_and_the_head_gets_its_own(tmp_path, monkeypatch):
    """steps/monitoring: every node of the plan is diffed; the head against its rendered unit, the others against
    none (the head role moved: the old head's unit goes, naming why). The removal is checked against this
    machine's shell (LocalConn) without running it: systemctl is the sim's to exercise."""
    from types import SimpleNamespace

    from sparkdeploy import connection, remote
    from sparkdeploy.layout import ServiceLayout
    unit = tmp_path / "sparkdeploy-exporter.service"
    unit.write_text("[Service]\n")
    lay = ServiceLayout(systemd_dir=str(tmp_path))
    local = remote.LocalConn(connection.Target("n2", "localhost", local=True))
    [removal] = monitoring.actions(local, lay, None, "n2 is not the head")
    assert "remove sparkdeploy-exporter.service (n2 is not the head)" in removal.what
    unit.unlink()
    assert monitoring.actions(local, lay, None, "n2 is not the head") == []  # nothing there: nothing to do

    calls = {}
    monkeypatch.setattr(monitoring, "actions",
                        lambda conn, lay, want, *why: calls.setdefault(conn, (want, *why)) and [])
    cx = SimpleNamespace(names=["n1", "n2", "n3"], head="n1", conn=lambda n: n, log=None, lay=ServiceLayout(),
                         files={"n1/monitoring/sparkdeploy-exporter.service": b"unit"},
                         opts=SimpleNamespace(dry_run=False))
    out = []
    monitoring.step_monitoring(cx, out)
    assert calls == {"n1": (b"unit",), "n2": (None, "n2 is not the head"),
                     "n3": (None, "n3 is not the head")}
    assert [o.node for o in out] == ["n1", "n2", "n3"]
