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
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from sparkdeploy import paths
from sparkdeploy.bench import client, metrics, sentinel
from sparkdeploy.checks import exporter
from sparkdeploy.cli import main
from sparkdeploy.steps import monitoring
from tests.support.vllm_server import free_port, venv_python
from tests.unit.bench.fake_vllm import FakeVllm
from tests.unit.bench.metrics_text import metrics_text

MONITORING = paths.repo_root() / "deploy" / "monitoring"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None and not os.environ.get("CI"),
                                    reason="no promtool (apt-get install prometheus; scripts/setup.sh does)")

STATE = {"release": 7, "restarts": [1000.0, 1100.0], "restarts_total": 5, "failures": 1, "last_tick": 1200.0,
         "last_ok": 900.0, "last_restart": 1100.0, "last_action": "restart", "last_why": "wedged; coupled restart 2/4",
         "ranks_down": ["node2"], "busy_low_power_since": 1150.0,
         "gpu": {"power_w": 18.5, "sm_clock_mhz": 2405.0, "util_pct": 95.0, "at": 1200.0}}
IDENTITY = {"service": "chat", "node": "spark1"}
RECORD = {"schema": sentinel.SCHEMA, "release": {"number": 7}, "settings": {}, "service": {},
          "categories": {"code": {"acceptance_length": [2.5, 2.6, 2.4], "accept_pos": [[0.8, 0.9, 0.7], [0.6] * 3],
                                  "decode_tok_s": [40.0, 41.0, 39.0]},
                         "prose_zh_hans": {"acceptance_length": [1.2] * 3, "accept_pos": [[0.1] * 3, [0.05] * 3],
                                           "decode_tok_s": [30.0] * 3}}}


def samples(fams, identity=IDENTITY) -> dict[tuple[str, tuple], float]:
    """Each sample by name and its own labels, once it was checked to carry the exporter's identity labels."""
    out = {}
    for f in fams:
        for s in f.samples:
            assert {k: s.labels.get(k) for k in identity} == identity, s
            out[(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in identity)))] = s.value
    return out


def families(**read):
    return exporter.families(identity=IDENTITY, **{"state": None, "release": None, "record": None, "engine": None,
                                                   **read})


# ------------------------------------------------------------------------------------------------ pure
def test_figures_from_the_watchdog_state_release_and_sentinel_record():
    got = samples(families(state=STATE, release=7, record=dict(RECORD, verdict={"regression": True}),
                           engine=metrics.parse(metrics_text()), memory={"available": 30 * 2**30, "reserve": 28 * 2**30}))
    assert got[("sparkdeploy_release_number", ())] == 7
    assert got[("sparkdeploy_watchdog_verdict", (("action", "restart"),))] == 1
    assert got[("sparkdeploy_watchdog_verdict", (("action", "none"),))] == 0
    assert got[("sparkdeploy_watchdog_unstable_restarts", ())] == 2 and got[("sparkdeploy_watchdog_failures", ())] == 1
    assert got[("sparkdeploy_watchdog_restarts_total", ())] == 5  # a counter: increase() over any window
    assert got[("sparkdeploy_watchdog_ranks_down", ())] == 1
    assert got[("sparkdeploy_watchdog_busy_at_low_power", ())] == 1
    assert got[("sparkdeploy_watchdog_busy_low_power_since_timestamp_seconds", ())] == 1150.0
    assert got[("sparkdeploy_gpu_power_watts", ())] == 18.5 and got[("sparkdeploy_gpu_sm_clock_hertz", ())] == 2.405e9
    assert got[("sparkdeploy_gpu_utilization_ratio", ())] == 0.95
    assert got[("sparkdeploy_sentinel_regression", ())] == 1
    assert got[("sparkdeploy_memory_available_bytes", ())] == 30 * 2**30
    assert got[("sparkdeploy_memory_reserve_bytes", ())] == 28 * 2**30
    assert got[("sparkdeploy_watchdog_gave_up", ())] == 0
    assert got[("sparkdeploy_watchdog_last_restart_timestamp_seconds", ())] == 1100.0
    assert ("sparkdeploy_watchdog_gave_up_timestamp_seconds", ()) not in got
    assert got[("sparkdeploy_sentinel_acceptance_length", (("category", "code"),))] == 2.5  # the median
    assert got[("sparkdeploy_sentinel_accept_position", (("category", "code"), ("position", "0")))] == 0.8
    assert got[("sparkdeploy_sentinel_decode_tokens_per_second", (("category", "prose_zh_hans"),))] == 30.0
    assert got[("sparkdeploy_sentinel_release_number", ())] == 7
    assert all(got[("sparkdeploy_exporter_source_up", (("source", s),))] == 1 for s in exporter.SOURCES)


def test_a_give_up_and_missing_inputs_show_as_such():
    state = dict(STATE, gave_up=True, gave_up_at=1300.0, last_action="give_up", gpu=None)
    del state["busy_low_power_since"]
    got = samples(families(state=state))
    assert got[("sparkdeploy_watchdog_gave_up", ())] == 1
    assert got[("sparkdeploy_watchdog_gave_up_timestamp_seconds", ())] == 1300.0
    assert got[("sparkdeploy_watchdog_verdict", (("action", "give_up"),))] == 1
    assert got[("sparkdeploy_exporter_source_up", (("source", "release"),))] == 0
    assert got[("sparkdeploy_exporter_source_up", (("source", "sentinel"),))] == 0
    assert got[("sparkdeploy_watchdog_busy_at_low_power", ())] == 0
    assert not any(name.startswith(("sparkdeploy_sentinel", "sparkdeploy_release", "sparkdeploy_engine",
                                    "sparkdeploy_gpu", "sparkdeploy_memory")) for name, _ in got)


def test_the_engines_counters_are_relayed_as_counters_for_rate():
    """No window is computed here: Prometheus' rate() over these gives live acceptance (rules.yml records it)."""
    snap = metrics.parse(metrics_text(drafts=140, draft_tokens=280, accepted=180, per_pos=(100, 80), success=6,
                                      gen_tokens=900))
    got = samples(families(engine=snap))
    assert got[("sparkdeploy_engine_drafts_total", ())] == 140
    assert got[("sparkdeploy_engine_accepted_tokens_total", ())] == 180
    assert got[("sparkdeploy_engine_draft_tokens_total", ())] == 280
    assert got[("sparkdeploy_engine_accepted_tokens_per_position_total", (("position", "1"),))] == 80
    assert got[("sparkdeploy_engine_generation_tokens_total", ())] == 900
    assert got[("sparkdeploy_engine_requests_succeeded_total", ())] == 6
    assert [f.type for f in families(engine=snap) if f.name == "sparkdeploy_engine_drafts"] == ["counter"]
    # the same engine read twice gives the same figures: nothing depends on an earlier scrape
    assert samples(families(engine=snap)) == got
    no_spec = samples(families(engine=metrics.parse(metrics_text(spec=False))))
    assert ("sparkdeploy_engine_drafts_total", ()) not in no_spec


def test_memory_reads_memavailable(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       127000000 kB\nMemAvailable:    31457280 kB\n")
    assert exporter.memory(str(meminfo), reserve_gib=28) == {"available": 30 * 2**30, "reserve": 28 * 2**30}
    assert exporter.memory(str(tmp_path / "absent")) is None


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
    (tmp / "sentinel.json").write_text(json.dumps(dict(RECORD, verdict={"against": 6, "regression": False})))
    return ["--state", str(tmp / "watchdog.json"), "--current", str(tmp / "current"),
            "--sentinel", str(tmp / "sentinel.json"), "--service", "chat", "--node", "spark1",
            "--memory-reserve-gib", "1"]


@contextlib.contextmanager
def _serving(python: list[str], engine_url: str, inputs: list[str], **popen):
    """The exporter started with `python` on a free loopback port; yields its /metrics URL once it answers."""
    port = free_port()
    proc = subprocess.Popen([*python, "-m", "sparkdeploy.checks.exporter", "--listen", f"127.0.0.1:{port}",
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
    """`python -m sparkdeploy.checks.exporter` on a free loopback port against the fake engine: real traffic, then a
    scrape; returns its text."""
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
    assert (code / "sparkdeploy" / "checks" / "exporter.py").is_file() and count > 20
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(code), "PYTHONDONTWRITEBYTECODE": "1"}
    where = subprocess.run([str(python), "-c", "import sparkdeploy.checks.exporter as e; print(e.__file__)"],
                           capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert where.stdout.strip() == str(code / "sparkdeploy" / "checks" / "exporter.py"), where.stderr[-2000:]
    with FakeVllm() as engine, _serving([str(python)], engine.url, _inputs(tmp_path), env=env, cwd=tmp_path) as url:
        text = requests.get(url, timeout=5).text
    values = samples(text_string_to_metric_families(text))
    assert values[("sparkdeploy_release_number", ())] == 7
    assert values[("sparkdeploy_exporter_source_up", (("source", "engine"),))] == 1
    assert values[("sparkdeploy_sentinel_decode_tokens_per_second", (("category", "code"),))] == 40.0


def published(text: str) -> set[str]:
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def test_the_scrape_over_http_carries_every_kind_of_figure(scrape):
    names = published(scrape)
    for name in ("sparkdeploy_release_number", "sparkdeploy_watchdog_verdict", "sparkdeploy_watchdog_restarts_total",
                 "sparkdeploy_watchdog_gave_up", "sparkdeploy_sentinel_acceptance_length", "sparkdeploy_gpu_power_watts",
                 "sparkdeploy_engine_drafts_total", "sparkdeploy_memory_available_bytes",
                 "sparkdeploy_exporter_source_up"):
        assert name in names, name
    # 20 tokens: the fake engine counts 10 verify steps, positions accepted round(7.5) and 5 times: 13 accepted
    assert 'sparkdeploy_engine_drafts_total{node="spark1",service="chat"} 10.0' in scrape
    assert 'sparkdeploy_engine_accepted_tokens_total{node="spark1",service="chat"} 13.0' in scrape


@needs_promtool
def test_promtool_accepts_the_scrape(scrape):
    r = subprocess.run([PROMTOOL or "promtool", "check", "metrics"], input=scrape, capture_output=True, text=True)
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), r.stdout + r.stderr


def _render_example(tmp_path, monkeypatch):
    """`sparkdeploy render` of the four-node example (two services) into tmp_path/out."""
    monkeypatch.setenv("HOME", str(tmp_path))  # the example reads its API key from ~/.config/sparkdeploy/api_key
    key = tmp_path / ".config" / "sparkdeploy" / "api_key"
    key.parent.mkdir(parents=True)
    key.write_text("sk-example-0123456789\n")
    key.chmod(0o600)
    out = tmp_path / "out"
    assert main(["render", "--inventory", str(paths.repo_root() / "examples" / "inventory.4node.yaml"),
                 "--out", str(out)]) == 0
    return out


def test_render_writes_a_prometheus_target_per_service_head(tmp_path, monkeypatch):
    out = _render_example(tmp_path, monkeypatch)
    assert json.loads((out / "prometheus-targets.json").read_text()) == [
        {"targets": ["10.0.0.11:9466"], "labels": {"service": "chat", "node": "spark1"}},
        {"targets": ["10.0.0.13:9467"], "labels": {"service": "super", "node": "spark3"}}]


@needs_promtool
def test_promtool_accepts_the_scrape_config_with_the_rendered_targets_and_rules(tmp_path, monkeypatch):
    out = _render_example(tmp_path, monkeypatch)
    for name in ("prometheus.yml", "rules.yml"):
        shutil.copy(MONITORING / name, out / name)
    r = subprocess.run([PROMTOOL or "promtool", "check", "config", str(out / "prometheus.yml")],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "WARNING" not in r.stdout + r.stderr, r.stdout + r.stderr
    assert "SUCCESS: 1 rule files found" in r.stdout


@needs_promtool
def test_the_shipped_alert_rules_pass_promtool_check_and_their_tests():
    """rules.test.yml: each alert (sentinel regression, watchdog gave up, rank down, busy at low power, memory
    margin low) fires for the service and node whose series raise it and not before its `for`; the recorded
    live acceptance and joules per token compute from the counters."""
    r = subprocess.run([PROMTOOL or "promtool", "check", "rules", "rules.yml"], capture_output=True, text=True,
                       cwd=MONITORING)
    assert r.returncode == 0 and "SUCCESS: 7 rules found" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([PROMTOOL or "promtool", "test", "rules", "rules.test.yml"], capture_output=True, text=True,
                       cwd=MONITORING)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def test_every_alert_reads_series_the_exporter_publishes(scrape):
    import yaml

    rules = yaml.safe_load((MONITORING / "rules.yml").read_text())
    names = published(scrape)
    read = {n for g in rules["groups"] for rule in g["rules"] for n in metric_names(rule["expr"])}
    assert read and read <= names, read - names
    alerts = {rule["alert"] for g in rules["groups"] for rule in g["rules"] if "alert" in rule}
    assert alerts == {"SparkdeploySentinelRegression", "SparkdeployWatchdogGaveUp", "SparkdeployRankDown",
                      "SparkdeployBusyAtLowPower", "SparkdeployMemoryMarginLow"}


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

    from sparkdeploy.node.layout import ServiceLayout
    from sparkdeploy.remote import connection
    from sparkdeploy.remote import ssh as remote
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


# ------------------------------------------------------------------------ two services' exporters, in process
def _scrape_values(url: str) -> dict[tuple[str, tuple], float]:
    text = requests.get(url, timeout=5).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_two_services_exporters_keep_their_service_label_and_parallel_scrapers_read_the_same_acceptance(tmp_path):
    """Two services' exporters (as two heads run them), each against its own engine, served in this process and
    scraped over HTTP: every series names its service; and two scrapers hitting one exporter at once, between
    and after requests, read the same spec-decode counters as the engine itself (no between-scrape window)."""
    servers = []
    with FakeVllm() as chat, FakeVllm(accept_per_pos=(0.5, 0.25)) as code:
        urls = {}
        for name, engine in (("chat", chat), ("code", code)):
            inputs = tmp_path / name
            inputs.mkdir()
            args = _inputs(inputs)
            port = free_port()
            servers.append(exporter.serve(exporter.Exporter(
                engine_url=engine.url, service=name, node=f"{name}-head", state_path=args[1], current_link=args[3],
                sentinel_path=args[5]), "127.0.0.1", port)[0])
            urls[name] = f"http://127.0.0.1:{port}/metrics"
        try:
            for name, engine in (("chat", chat), ("code", code)):
                client.stream_chat(client.discover(engine.url), [{"role": "user", "content": "hello"}], 20)
            for name, url in urls.items():
                scraped = _scrape_values(url)
                assert {dict(labels).get("service") for _, labels in scraped} == {name}
                assert {dict(labels).get("node") for _, labels in scraped} == {f"{name}-head"}

            def acceptance(url: str) -> float:
                v = _scrape_values(url)
                who = (("node", "chat-head"), ("service", "chat"))
                return 1 + v[("sparkdeploy_engine_accepted_tokens_total", who)] / v[("sparkdeploy_engine_drafts_total", who)]

            engine = metrics.scrape(chat.url)
            truth = 1 + engine.value(metrics.ACCEPTED) / engine.value(metrics.DRAFTS)
            with ThreadPoolExecutor(2) as pool:  # two Prometheus servers scraping the same exporter at once
                seen = list(pool.map(acceptance, [urls["chat"]] * 8))
            assert seen == [truth] * 8  # the old between-scrape window gave the second scraper no drafts at all
            assert truth == pytest.approx(1 + 13 / 10)  # 20 tokens: 10 verify steps, 13 accepted
        finally:
            for server in servers:
                server.shutdown()
