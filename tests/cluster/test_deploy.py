"""The main job on the simulated cluster with the real vLLM CPU engine: up, idempotent re-run, health, stale
units, fault injection, reboot matrix, coupled supervision, --nodes 1. One deployed cluster is shared by the
whole module and the tests run in file order (cheap and non-destructive first, reboots and crash loops last).

Faults each end on the last good release or a clear stop, and a re-run converges. Timings are printed, never
asserted.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
import yaml

from sparkdeploy.bench import metrics
from sparkdeploy.model import inventory as I
from sparkdeploy.node import layout
from sparkdeploy.ops import releases
from sparkdeploy.steps import deploy as D

pytestmark = pytest.mark.cluster

READY = "600"
# the speed sentinel's probe is left out of every up but the one that tests it (test_rollback_command)
UP_FLAGS = ["--ready-timeout", READY, "--watchdog-grace", "180", "--watchdog-backoff", "10", "--watchdog-cap", "2",
            "--no-sentinel"]
TIMES: dict[str, float] = {}


def cli(*args: str, timeout: float = 1200) -> tuple[int, str, str]:
    p = subprocess.run([sys.executable, "-m", "sparkdeploy", *args], capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def up_json(inv: Path, *extra: str, sentinel: bool = False) -> tuple[int, dict, str]:
    flags = [f for f in UP_FLAGS if f != "--no-sentinel"] if sentinel else UP_FLAGS
    rc, out, err = cli("up", "-i", str(inv), "--json", *flags, *extra)
    try:
        return rc, json.loads(out), err
    except ValueError:
        raise AssertionError(f"up printed no JSON (rc {rc}): {err[-3000:]}") from None


def health_json(inv: Path) -> tuple[int, dict]:
    rc, out, err = cli("health", "-i", str(inv), "--json", "--probe-timeout", "30")
    return rc, json.loads(out) if out.strip() else {"healthy": False, "failed": [err[-500:]]}


def api_answers(inv: Path) -> bool:
    """The head's API lists its models (one HTTP request: cheap enough to poll, unlike a `health` run)."""
    from sparkdeploy.ops.health import bearer

    loaded = I.load(inv)
    try:
        return requests.get(f"http://{loaded.head.ssh.host}:{loaded.ports.api}/v1/models", timeout=5,
                            headers=bearer(loaded.auth.api_key())).status_code == 200
    except requests.RequestException:
        return False


def wait_healthy(inv: Path, timeout: float) -> float:
    """Until `health` passes. Polled by one HTTP request while the API is down: a `health` run (a process, SSH
    to every node, five probes each) costs about 2 CPU-seconds, which a reboot's wait would pay every 5 s."""
    t0 = time.monotonic()
    last = None
    while time.monotonic() - t0 < timeout:
        if api_answers(inv):
            rc, rep = health_json(inv)
            if rc == 0:
                return time.monotonic() - t0
            last = rep.get("failed")
        else:
            last = ["the API does not answer yet"]
        time.sleep(3)
    raise AssertionError(f"not healthy after {timeout:.0f} s; last failures: {last}")


def variant_of(base: Path, tmp: Path, name: str, *, engine_args: dict | None = None, **top) -> Path:
    """A copy of the inventory with top-level fields replaced (None drops one) and, given `engine_args`, a copy
    of its profile with those merged into its engine_args."""
    data = yaml.safe_load(base.read_text())
    profile = Path(data["profile"]) if str(data["profile"]).endswith(".yaml") else \
        Path(__file__).parents[2] / "deploy/profiles" / f"{data['profile']}.yaml"
    if engine_args:
        raw = yaml.safe_load(profile.read_text())
        raw["engine_args"] = {**(raw.get("engine_args") or {}), **engine_args}
        profile = tmp / f"{name}.profile.yaml"
        profile.write_text(yaml.safe_dump(raw, sort_keys=False))
    data["profile"] = str(profile)
    for key, value in top.items():
        data.pop(key, None) if value is None else data.__setitem__(key, value)
    out = tmp / f"{name}.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def variant(base: Path, tmp: Path, name: str, reserve: float) -> Path:
    """A copy of the inventory whose plan differs only in the memory reserve (-> a new release, same image)."""
    return variant_of(base, tmp, name, memory={"reserve_gib": reserve})


def api_status(sim, path: str = "/v1/models", key: str | None = None, port: int = 8000) -> int:
    import requests

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return requests.get(f"http://{sim.head.ip}:{port}{path}", headers=headers, timeout=30).status_code


def comparable(res: dict) -> list[str]:
    """The effects of an `up --json`, sorted; a release.json's size and hash left out (it records the time and
    the facts measured at the write)."""
    return sorted(re.sub(r" \d+ bytes sha256:\w+$", "", e) if e.endswith(layout.RELEASE_META) or
                  f"/{layout.RELEASE_META} mode" in e else e
                  for o in res["outcomes"] for e in o.get("effects", []))


def current(sim, node) -> str:
    return sim.ssh(node, ["readlink", layout.PLAIN.current_link]).out.strip()


PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n" \
         "def fibonacci"


def complete(inv: Path, max_tokens: int = 24) -> dict:
    """A temperature-0 completion of PROMPT from the head, with the inventory's key."""
    from sparkdeploy.ops.health import bearer

    loaded = I.load(inv)
    r = requests.post(f"http://{loaded.head.ssh.host}:{loaded.ports.api}/v1/completions", timeout=120,
                      headers=bearer(loaded.auth.api_key()),
                      json={"model": "tiny", "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0})
    assert r.status_code == 200, r.text[:500]
    return r.json()


@pytest.fixture(scope="module")
def deployed(sim_cluster, sim_engine_image, tmp_path_factory):
    """The sim cluster's inventory (with a reserve that fits a small VM) deployed once for the module."""
    tmp = tmp_path_factory.mktemp("deploy")
    inv = variant(sim_cluster.inventory, tmp, "base", 2.0)
    for node in sim_cluster.nodes:  # the pair starts out holding the serving image: this `up` delivers it
        done = sim_cluster.ssh(node, "docker ps -aq | xargs -r docker rm -f >/dev/null && docker image prune -af "
                                     ">/dev/null && docker images -q | wc -l")
        assert done.rc == 0 and done.out.strip() == "0", (node.name, done)
    t0 = time.monotonic()
    rc, res, err = up_json(inv)
    TIMES["up --nodes 2 from scratch"] = time.monotonic() - t0
    assert rc == 0 and res["healthy"], f"first up failed: {res['message']}\n{err[-4000:]}"
    yield {"inv": inv, "tmp": tmp, "first": res}
    cli("down", "-i", str(inv))


def test_up_from_scratch_is_healthy(deployed, sim_cluster):
    res = deployed["first"]
    assert res["new_release"] and res["release"] == 1 and res["restarted"]
    steps = {(o["step"], o["status"]) for o in res["outcomes"]}
    assert ("image", "changed") in steps and ("release", "changed") in steps and ("units", "changed") in steps
    assert current(sim_cluster, "node1") == current(sim_cluster, "node2") == "releases/0001"
    rc, rep = health_json(deployed["inv"])
    assert rc == 0, rep["failed"]
    names = {c["name"] for cs in rep["checks"].values() for c in cs}
    for want in ("ssh", "docker", "unit", "stale units", "container", "memory", "boot persistence", "/health",
                 "/v1/models", "generation", "metrics", "unit sparkdeploy-watchdog.timer",
                 "unit sparkdeploy-exporter.service"):
        assert want in names, want
    exporter = next(c for c in rep["checks"]["node1"] if c["name"] == "unit sparkdeploy-exporter.service")
    assert exporter["status"] == "ok", exporter
    gen = next(c for c in rep["checks"]["service"] if c["name"] == "generation")
    assert "byte-identical" in gen["reason"]


def test_second_up_changes_nothing_and_is_fast(deployed, sim_cluster):
    t0 = time.monotonic()
    rc, res, err = up_json(deployed["inv"])
    TIMES["second up (nothing changed)"] = time.monotonic() - t0
    print(f"\nsecond up with nothing changed: {res['seconds']:.1f} s, {res['changes']} changes")
    assert rc == 0 and res["healthy"]
    assert res["changes"] == 0 and not res["new_release"] and not res["restarted"], \
        [(o["step"], o["node"], o["status"], o["detail"], o["actions"]) for o in res["outcomes"] if o["status"] != "ok"]
    assert current(sim_cluster, "node1") == "releases/0001"


def test_the_engine_lists_its_model_and_its_speculation_drafts_for_real(deployed, sim_cluster):
    """The deployed pair is a real two-rank vLLM over gloo with n-gram speculation (the sim-tiny profile): its
    model listed, real counters, drafts proposed and some accepted. (From test_sim_engine.py, whose hand-started
    pair proved the same engine once more before any deploy.)"""
    from sparkdeploy.ops.health import bearer

    head = f"http://{sim_cluster.head.ip}:8000"
    key = I.load(deployed["inv"]).auth.api_key()
    models = requests.get(f"{head}/v1/models", headers=bearer(key), timeout=30).json()
    assert [m["id"] for m in models["data"]] == ["tiny"] and models["data"][0]["max_model_len"] == 512
    # the watchdog's probe would be traffic of its own between the two readings
    sim_cluster.ssh("node1", "systemctl stop sparkdeploy-watchdog.timer", check=True)
    try:
        before = metrics.scrape(head)
        for name in (metrics.RUNNING, metrics.SUCCESS, metrics.GENERATION_TOKENS, metrics.DRAFTS, metrics.ACCEPTED,
                     metrics.PREFIX_QUERIES):
            assert before.has(name), f"{name} missing from /metrics"
        n = 3
        for _ in range(n):
            assert complete(deployed["inv"], 32)["usage"]["completion_tokens"] == 32
        moved = metrics.Delta(before, metrics.scrape(head))
    finally:
        sim_cluster.ssh("node1", "systemctl start sparkdeploy-watchdog.timer", check=True)
    assert moved(metrics.SUCCESS) == n and moved(metrics.GENERATION_TOKENS) == 32 * n
    drafted = moved(metrics.DRAFT_TOKENS)
    assert moved(metrics.DRAFTS) > 0 and drafted > 0, "n-gram speculation proposed nothing"
    assert 0 < moved(metrics.ACCEPTED) <= drafted, "a repetitive random model should accept some n-gram drafts"


def test_the_heads_exporter_serves_prometheus_from_the_engine_image(deployed, sim_cluster):
    """`up` installed the exporter on the head (steps/monitoring.py): the kit's code run by the serving image's
    Python, as nobody; a scrape from outside the node sees the release serving and the engine's counters."""
    import requests
    from prometheus_client.parser import text_string_to_metric_families

    url = f"http://{sim_cluster.head.ip}:9466/metrics"
    deadline = time.monotonic() + 90
    while True:
        try:
            text = requests.get(url, timeout=10).text
            break
        except requests.RequestException:
            assert time.monotonic() < deadline, sim_cluster.ssh("node1", "journalctl -u sparkdeploy-exporter -n 20").out
            time.sleep(2)
    values = {(s.name, tuple(sorted(s.labels.items()))): s.value
              for f in text_string_to_metric_families(text) for s in f.samples}
    up_of = {dict(k[1])["source"]: v for k, v in values.items() if k[0] == "sparkdeploy_exporter_source_up"}
    assert up_of["release"] == 1 and up_of["engine"] == 1, up_of
    [(labels, release)] = [(dict(k[1]), v) for k, v in values.items() if k[0] == "sparkdeploy_release_number"]
    assert release == 1 and labels["node"] == "node1" and labels["service"].startswith("sim-")
    assert all(dict(k[1]).get("service") == labels["service"] for k in values)  # every series names its service
    if sim_cluster.ssh("node1", "test -e /var/lib/sparkdeploy/watchdog.json").rc == 0:
        assert up_of["watchdog_state"] == 1, up_of  # readable by nobody
    user = sim_cluster.ssh("node1", "docker inspect -f '{{.Config.User}}' sparkdeploy-exporter").out.strip()
    assert user == "65534:65534"
    assert sim_cluster.ssh("node2", "systemctl cat sparkdeploy-exporter.service").rc != 0  # the head's only
    # a stop is not a failure: `down` and restarts must not leave the unit failed (the node's systemd degraded)
    sim_cluster.ssh("node1", "systemctl stop sparkdeploy-exporter.service")
    try:
        assert sim_cluster.ssh("node1", "systemctl is-failed sparkdeploy-exporter.service").out.strip() == "inactive"
    finally:
        sim_cluster.ssh("node1", "systemctl start sparkdeploy-exporter.service")


def test_api_key_guards_the_api_and_stays_secret(deployed, sim_cluster):
    """The sim inventory, like a user's, names an API key file (issue 13): vLLM enforces it, every internal
    caller sends it (the health gate above passed), and it is in the nodes' 0600 secrets file only."""
    import requests

    inv = I.load(deployed["inv"])
    key = inv.auth.api_key()
    assert key and (inv.auth.api_key_file.stat().st_mode & 0o777) == 0o600
    api = f"http://{sim_cluster.head.ip}:8000"
    assert requests.get(f"{api}/v1/models", timeout=10).status_code == 401
    assert requests.post(f"{api}/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2},
                         timeout=30).status_code == 401
    ok = requests.post(f"{api}/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2},
                       headers={"Authorization": f"Bearer {key}"}, timeout=60)
    assert ok.status_code == 200 and ok.json()["choices"]
    rc, rep = health_json(deployed["inv"])
    check = next(c for c in rep["checks"]["service"] if c["name"] == "api key")
    assert rc == 0 and check["ok"] and "401" in check["reason"]
    for node in sim_cluster.nodes:
        assert sim_cluster.ssh(node, ["stat", "-c", "%a %U", "/etc/sparkdeploy/secrets.env"]).out.split() == ["600", "root"]
        # The key is read on the node from secrets.env, never passed in argv: sudo logs every command line, so the
        # journal would show any command that carried it (the kit's writes send it on stdin).
        leaks = sim_cluster.ssh(node, ["sh", "-c", 'k=$(sed -n "s/^VLLM_API_KEY=//p" /etc/sparkdeploy/secrets.env); '
                                       '[ -n "$k" ] || exit 9; grep -rlF -e "$k" /etc/sparkdeploy/releases '
                                       '/etc/systemd/system /usr/local/lib/sparkdeploy; '
                                       'pgrep -af -- "$k"; journalctl --no-pager -o cat | grep -cF -e "$k"'])
        assert leaks.out.split() == ["0"], f"{node.name}: the key shows in {leaks.out!r}"
        args = sim_cluster.ssh(node, ["docker", "inspect", "-f", "{{json .Args}}", "sparkdeploy-engine"]).out
        assert key not in args and "--tool-call-parser" in args  # the profile's engine_args reached vLLM
    rc, out, err = cli("plan", "-i", str(deployed["inv"]), "--json")
    assert rc == 0 and key not in out + err and "VLLM_API_KEY" in out  # the fingerprint, not the key


def test_dry_run_shows_a_change_without_making_it(deployed, sim_cluster):
    inv2 = variant(deployed["inv"], deployed["tmp"], "dry", 2.5)
    rc, out, err = cli("up", "-i", str(inv2), "--dry-run", "--json", *UP_FLAGS)
    res = json.loads(out)
    assert rc == 0 and res["changes"] >= 2 and res["new_release"]
    assert any("write release 2" in a for o in res["outcomes"] for a in o["actions"])
    assert sim_cluster.ssh("node1", ["test", "-e", releases.rdir(layout.PLAIN, 2)]).rc != 0


def test_planted_old_stack_unit_is_reported_and_disabled(deployed, sim_cluster):
    # it exits 3 when stopped, as an engine that does not stop cleanly: its unit ends "failed" unless `up` clears it
    unit = ("[Unit]\nDescription=old hand-made vLLM stack\n[Service]\n"
            "ExecStart=/bin/sh -c 'echo vllm serve /models/old --port 8000; "
            "trap \"exit 3\" TERM; sleep infinity & wait'\n"
            "[Install]\nWantedBy=multi-user.target\n")
    sim_cluster.ssh("node2", ["sh", "-c", "printf '%s' \"$1\" > /etc/systemd/system/old-vllm.service && "
                              "systemctl daemon-reload && systemctl enable --now old-vllm.service", "x", unit], check=True)
    rc, rep = health_json(deployed["inv"])
    assert rc == 1 and any("old-vllm.service" in f for f in rep["failed"])
    rc, res, err = up_json(deployed["inv"])
    assert rc == 0, res["message"]
    stale = [o for o in res["outcomes"] if o["step"] == "stale units" and o["node"] == "node2"][0]
    assert stale["status"] == "changed" and "old-vllm.service" in stale["actions"][0]
    assert not res["restarted"] and not res["new_release"]
    assert sim_cluster.ssh("node2", ["systemctl", "is-enabled", "old-vllm.service"]).out.strip() == "disabled"
    state = sim_cluster.ssh("node2", ["systemctl", "is-active", "old-vllm.service"]).out.strip()
    assert state == "inactive", state  # not "failed"
    assert health_json(deployed["inv"])[0] == 0


def test_dry_run_prints_the_exact_effects_up_then_makes(deployed, sim_cluster):
    """`up --dry-run` prints each command and file write (issue 15), and a real `up` then makes exactly those:
    a stale unit on node2, a changed engine unit on node1 and a damaged rank-ctl on node2 to repair."""
    unit = ("[Unit]\nDescription=another hand-made vLLM\n[Service]\nExecStart=/bin/sh -c 'echo vllm serve; "
            "exec sleep infinity'\n[Install]\nWantedBy=multi-user.target\n")
    sim_cluster.ssh("node2", ["sh", "-c", "printf '%s' \"$1\" > /etc/systemd/system/old-vllm2.service && "
                              "systemctl daemon-reload && systemctl enable --now old-vllm2.service && "
                              "echo '# edited' >> /usr/local/lib/sparkdeploy/rank-ctl", "x", unit], check=True)
    sim_cluster.ssh("node1", ["sh", "-c", f"echo '# edited' >> {layout.PLAIN.unit_path}"], check=True)
    before = {n.name: sim_cluster.ssh(n, ["sh", "-c", f"sha256sum {layout.PLAIN.unit_path} /usr/local/lib/sparkdeploy/* "
                                          "; systemctl is-active old-vllm2.service"]).out for n in sim_cluster.nodes}

    def effects(res: dict) -> list[str]:
        return sorted(e for o in res["outcomes"] for e in o.get("effects", []))

    rc, out, err = cli("up", "-i", str(deployed["inv"]), "--dry-run", "--json", *UP_FLAGS)
    dry = json.loads(out)
    assert rc == 0 and not dry["new_release"], dry["message"]
    after = {n.name: sim_cluster.ssh(n, ["sh", "-c", f"sha256sum {layout.PLAIN.unit_path} /usr/local/lib/sparkdeploy/* "
                                         "; systemctl is-active old-vllm2.service"]).out for n in sim_cluster.nodes}
    assert after == before  # the dry run changed nothing
    want = effects(dry)
    assert "node2: run systemctl disable --now old-vllm2.service" in want
    assert "node1: run systemctl daemon-reload" in want
    assert any(e.startswith(f"node1: write {layout.PLAIN.unit_path} mode 0644 ") for e in want)
    assert any(e.startswith(f"node2: write {layout.RANK_CTL} mode 0755 ") for e in want)
    for e in want:
        assert e in err, f"the dry run did not print {e!r}"
    rc, res, err = up_json(deployed["inv"])
    assert rc == 0 and res["healthy"] and not res["restarted"], res["message"]
    assert effects(res) == want
    assert sim_cluster.ssh("node2", ["systemctl", "is-active", "old-vllm2.service"]).out.strip() != "active"
    assert up_json(deployed["inv"])[1]["changes"] == 0


def test_fault_ssh_cut_mid_step_leaves_current_release(deployed, sim_cluster, monkeypatch):
    """The connection to the worker drops while the new release's files are being written."""
    inv2 = variant(deployed["inv"], deployed["tmp"], "cut", 2.5)
    real_put = None
    cut = {"done": False}

    cluster = D.Context(I.load(inv2), D.Options(ready_timeout=float(READY), log=print))
    orig_write = releases.write

    def write_then_cut(conn, lay, number, files, meta):
        if conn.name == "node2" and not cut["done"]:
            nonlocal real_put
            real_put = conn.put

            def put_and_cut(path, data, **kw):
                real_put(path, data, **kw)
                cut["done"] = True
                conn.client.get_transport().close()  # the SSH connection really goes away

            conn.put = put_and_cut
        return orig_write(conn, lay, number, files, meta)

    monkeypatch.setattr(releases, "write", write_then_cut)
    try:
        res = D.up(cluster)
    finally:
        cluster.close()
    assert cut["done"] and not res.healthy
    assert "release" in res.message and "node2" in res.message
    # nothing switched, nothing restarted; the half-written release is incomplete and never run
    assert current(sim_cluster, "node1") == current(sim_cluster, "node2") == "releases/0001"
    assert sim_cluster.ssh("node2", ["test", "-e", f"{releases.rdir(layout.PLAIN, 2)}/{layout.RELEASE_META}"]).rc != 0
    assert health_json(deployed["inv"])[0] == 0
    monkeypatch.undo()
    # its dry run lists the exact commands, writes and links of the re-run, the restart's included (issue 15)
    rc, out, err = cli("up", "-i", str(inv2), "--dry-run", "--json", *UP_FLAGS)
    dry = json.loads(out)
    assert rc == 0 and dry["new_release"] and "release 2 would be started" in dry["message"], dry["message"]
    restart_effects = [e for o in dry["outcomes"] if o["step"] == "start" for e in o["effects"]]
    for n in ("node1", "node2"):  # (the sim's model is in the image: no page cache to evict)
        assert f"{n}: link {layout.PLAIN.current_link} -> releases/0002" in restart_effects
        assert f"{n}: run systemctl start {layout.PLAIN.unit}" in restart_effects
        assert f"{n}: run systemctl stop {layout.PLAIN.unit}" in restart_effects
        assert all(e in err for e in restart_effects)  # printed, not only in the JSON
    assert restart_effects.index(f"node2: run systemctl start {layout.PLAIN.unit}") < \
        restart_effects.index(f"node1: run systemctl start {layout.PLAIN.unit}")  # workers first
    assert current(sim_cluster, "node1") == "releases/0001"  # the dry run switched nothing
    # a re-run converges: release 2 written completely everywhere, switched, gated; exactly as the dry run said
    rc, res2, err = up_json(inv2)
    assert rc == 0 and res2["healthy"] and res2["release"] == 2 and res2["new_release"], res2["message"]
    assert comparable(res2) == comparable(dry)
    deployed["inv"] = inv2
    assert health_json(inv2)[0] == 0


def test_fault_disk_full_while_writing_a_file(deployed, sim_cluster):
    inv3 = variant(deployed["inv"], deployed["tmp"], "full", 3.0)
    # A tmpfs holding exactly what /etc/sparkdeploy/releases holds now, plus almost nothing.
    setup = ("set -e; d=/etc/sparkdeploy/releases; cp -a $d /tmp/rel-copy; "
             "kb=$(du -sk /tmp/rel-copy | cut -f1); mount -t tmpfs -o size=$((kb + 24))k tmpfs $d; "
             "cp -a /tmp/rel-copy/. $d/; rm -rf /tmp/rel-copy; "
             "head -c 64M /dev/zero > $d/.filler 2>/dev/null || true")
    sim_cluster.ssh("node1", ["sh", "-c", setup], check=True)
    try:
        rc, res, err = up_json(inv3)
        assert rc == 1 and not res["healthy"]
        assert "No space left" in res["message"] or "failed" in res["message"], res["message"]
        assert current(sim_cluster, "node1") == current(sim_cluster, "node2") == "releases/0002"
        assert health_json(deployed["inv"])[0] == 0  # still serving the last good release
    finally:
        # lazily: a plain umount refuses while anything (a watchdog tick reading through `current`) has a file
        # open there, and a tmpfs left behind would hide the real releases from every later test
        sim_cluster.ssh("node1", ["umount", "-l", "/etc/sparkdeploy/releases"], check=True)
    for node in ("node1", "node2"):  # the releases the user had are all still there, complete
        held = sim_cluster.ssh(node, ["sh", "-c", f"ls {layout.PLAIN.releases_dir}/*/{layout.RELEASE_META}"]).out
        assert f"0001/{layout.RELEASE_META}" in held and f"0002/{layout.RELEASE_META}" in held, (node, held)
    # re-run with the unchanged inventory: nothing to do
    rc, res, err = up_json(deployed["inv"])
    assert rc == 0 and res["changes"] == 0, res["outcomes"]


def test_fault_health_gate_timeout_rolls_back(deployed, sim_cluster):
    # The failed release also moves the API port and the served name: the rollback must judge release 2 by
    # the plan it recorded (its port and name), not by this inventory, or it reports a good rollback failed.
    inv4 = variant_of(deployed["inv"], deployed["tmp"], "gate", memory={"reserve_gib": 3.5},
                      ports={"api": 8010, "master": 29500}, served_name="renamed")
    rc, out, err = cli("up", "-i", str(inv4), "--json", "--ready-timeout", "3", "--watchdog-grace", "180",
                       "--watchdog-backoff", "10", "--watchdog-cap", "2")
    res = json.loads(out)
    assert rc == 1 and not res["healthy"]
    assert res["rolled_back_to"] == 2 and "ROLLED BACK to release 2" in res["message"], res["message"]
    assert "healthy again" in res["message"], res["message"]
    assert current(sim_cluster, "node1") == current(sim_cluster, "node2") == "releases/0002"
    assert health_json(deployed["inv"])[0] == 0
    # the failed release stays on disk (unhealthy), and is not what `rollback` picks
    listing = sim_cluster.ssh("node1", ["ls", layout.PLAIN.releases_dir]).out.split()
    assert "0003" in listing and "0002" in listing


def effects(outcomes, step: str | None = None) -> list[str]:
    """Every command and write the outcomes name (of one step, or all), sorted: a dry run's against a real run's."""
    return sorted(e for o in outcomes if step in (None, o.step) for e in o.effects)


def test_rollback_command(deployed, sim_cluster):
    """`rollback --dry-run` names the switch and restart the real rollback then makes, and changes nothing."""
    serving = current(sim_cluster, "node1")
    opts = D.Options(ready_timeout=float(READY), watchdog_grace=180, watchdog_backoff_s=10, watchdog_cap=2)
    with D.load_context(str(deployed["inv"]), dataclasses.replace(opts, dry_run=True)) as c:
        dry = D.rollback(c, 1)
    assert dry.release == 1 and dry.message.startswith("dry run: would roll back from release"), dry.message
    assert current(sim_cluster, "node1") == current(sim_cluster, "node2") == serving
    rc, out, err = cli("rollback", "-i", str(deployed["inv"]), "1", "--dry-run")  # the CLI prints them (unit tests)
    assert rc == 0 and current(sim_cluster, "node1") == current(sim_cluster, "node2") == serving, err[-2000:]
    with D.load_context(str(deployed["inv"]), opts) as c:  # names the node lacking the release and what it holds
        real = D.rollback(c, 1)
    assert real.healthy, real.message
    assert effects(dry.outcomes, "start") and effects(dry.outcomes, "start") == effects(real.outcomes, "start")
    assert set(effects(dry.outcomes)) <= set(effects(real.outcomes)), \
        set(effects(dry.outcomes)) - set(effects(real.outcomes))  # a dry run names nothing the real run skips
    assert current(sim_cluster, "node1") == current(sim_cluster, "node2") == "releases/0001"
    assert health_json(deployed["inv"])[0] == 0
    # and up brings the inventory's release back (it exists: switch + restart, no rewrite needed), with the speed
    # sentinel on: a probe per category after the gate, kept with the release on the head (issue 17)
    rc, res, err = up_json(deployed["inv"], sentinel=True)
    assert rc == 0 and res["healthy"], res["message"]
    assert current(sim_cluster, "node1") == current(sim_cluster, "node2") == f"releases/{res['release']:04d}"
    assert res["sentinel"]["against"] is None and "first record" in res["sentinel"]["text"], res["sentinel"]
    record = json.loads(sim_cluster.ssh("node1", ["cat", f"{releases.rdir(layout.PLAIN, res['release'])}/{layout.SENTINEL_RECORD}"]).out)
    assert record["release"]["number"] == res["release"] and record["verdict"] == res["sentinel"]
    assert set(record["categories"]) == {"code", "prose_en", "prose_zh_hant", "prose_zh_hans", "reasoning"}
    assert all(len(c["acceptance_length"]) >= 2 for c in record["categories"].values())  # repeats: noise measurable
    rc, rep = health_json(deployed["inv"])
    assert rc == 0 and any(c["name"] == "speed" and "first record" in c["reason"] for c in rep["checks"]["service"])
    rc, out, err = cli("bench", "sentinel", "-i", str(deployed["inv"]))
    assert rc == 2 and "no older healthy release with a speed record" in err, err[-1500:]


def test_a_launch_the_new_image_refuses_never_stops_the_old_release(deployed, sim_cluster):
    """A value only the pin's config classes can judge (CompilationConfig's mode, an enum: the offline catalogue
    knows the key, not its values) is refused by the new image's vLLM on the nodes, before anything stops: the
    old release answers every request throughout, and `up` exits non-zero naming the profile key."""
    import requests

    bad = variant_of(deployed["inv"], deployed["tmp"], "bad-launch", engine_args={"compilation-config": {"mode": 7}})
    key = I.load(deployed["inv"]).auth.api_key()
    serving = current(sim_cluster, "node1")
    started = {n.name: sim_cluster.ssh(n, ["docker", "inspect", "-f", "{{.State.StartedAt}}",
                                           "sparkdeploy-engine"]).out for n in sim_cluster.nodes}
    answered, failed, stop = [0], [], threading.Event()

    def client():
        while not stop.is_set():
            try:
                r = requests.post(f"http://{sim_cluster.head.ip}:8000/v1/completions", timeout=60,
                                  headers={"Authorization": f"Bearer {key}"},
                                  json={"model": "tiny", "prompt": "hello", "max_tokens": 2})
                (answered.__setitem__(0, answered[0] + 1) if r.status_code == 200 else failed.append(r.status_code))
            except requests.RequestException as err:
                failed.append(type(err).__name__)
            time.sleep(0.5)

    t = threading.Thread(target=client, daemon=True)
    t.start()
    try:
        rc, res, err = up_json(bad)
    finally:
        stop.set()
        t.join(90)
    print(f"\nduring the refused up: {answered[0]} requests answered, {len(failed)} failed")
    assert rc != 0 and not res["healthy"] and not res["restarted"], res["message"]
    assert "engine_args.compilation-config" in res["message"] and "old release still serves" in res["message"], \
        res["message"]
    assert answered[0] > 0 and not failed, failed
    assert current(sim_cluster, "node1") == current(sim_cluster, "node2") == serving
    assert started == {n.name: sim_cluster.ssh(n, ["docker", "inspect", "-f", "{{.State.StartedAt}}",
                                                   "sparkdeploy-engine"]).out for n in sim_cluster.nodes}


def test_the_key_is_current_state_through_up_and_rollback(deployed, sim_cluster):
    """Issue 33: a kept release always starts, and serves with the key the inventory names today. Key removed
    then `rollback` to the keyed release: it starts (before, docker could not find its --env-file: exit 125) and
    serves without a key; key rotated then `rollback` to the release gated without a key: today's key is
    required (the old one gets 401, none gets 401)."""
    keyed = int(current(sim_cluster, "node1").rsplit("/", 1)[1])
    old_key = I.load(deployed["inv"]).auth.api_key()
    open_inv = variant_of(deployed["inv"], deployed["tmp"], "no-key", auth=None)
    rc, res, err = up_json(open_inv)
    assert rc == 0 and res["healthy"] and res["new_release"], res["message"]
    unkeyed = res["release"]
    assert api_status(sim_cluster) == 200
    rc, out, err = cli("rollback", "-i", str(open_inv), str(keyed), "--ready-timeout", READY, "--no-sentinel")
    assert rc == 0, err[-2000:]
    assert current(sim_cluster, "node1") == current(sim_cluster, "node2") == f"releases/{keyed:04d}"
    assert api_status(sim_cluster) == 200  # the key the inventory no longer lists is not brought back
    for node in sim_cluster.nodes:
        assert sim_cluster.ssh(node, ["stat", "-c", "%a %U %s", "/etc/sparkdeploy/secrets.env"]).out.split() == \
            ["600", "root", "0"]
    rotated = deployed["tmp"] / "rotated.key"
    rotated.write_text("sk-rotated-" + "5e1f" * 8 + "\n")
    rotated.chmod(0o600)
    rot_inv = variant_of(deployed["inv"], deployed["tmp"], "rotated", auth={"api_key_file": str(rotated)})
    rc, out, err = cli("rollback", "-i", str(rot_inv), str(unkeyed), "--ready-timeout", READY, "--no-sentinel")
    assert rc == 0, err[-2000:]
    assert current(sim_cluster, "node1") == f"releases/{unkeyed:04d}"
    new_key = I.load(rot_inv).auth.api_key()
    assert (api_status(sim_cluster), api_status(sim_cluster, key=old_key), api_status(sim_cluster, key=new_key)) \
        == (401, 401, 200)
    assert health_json(rot_inv)[0] == 0


def test_fault_node_rebooted_during_up(deployed, sim_cluster):
    inv5 = variant(deployed["inv"], deployed["tmp"], "reboot-during", 4.0)
    proc = subprocess.Popen([sys.executable, "-m", "sparkdeploy", "up", "-i", str(inv5), "--json", *UP_FLAGS],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    started = threading.Event()

    def read_err():
        for line in proc.stderr:
            lines.append(line)
            if "node2: started" in line:
                started.set()

    t = threading.Thread(target=read_err, daemon=True)
    t.start()
    assert started.wait(600), "".join(lines[-20:])
    sim_cluster.cluster.reboot(["node2"])
    out = proc.stdout.read()
    proc.wait(1200)
    t.join(10)
    assert out.strip(), f"`up` printed no result (exit {proc.returncode}):\n" + "".join(lines[-60:])
    res = json.loads(out)
    # either the gate passed after all, or it rolled back to the last good release: never half-applied
    assert res["healthy"] or res["rolled_back_to"] is not None, res["message"]
    a, b = current(sim_cluster, "node1"), current(sim_cluster, "node2")
    assert a == b
    # a re-run converges on the new release
    rc, res2, err = up_json(inv5)
    assert rc == 0 and res2["healthy"], res2["message"]
    deployed["inv"] = inv5
    wait_healthy(inv5, 300)


@pytest.mark.parametrize("which", [["node2"], ["node1"], ["node1", "node2"]], ids=["worker", "head", "both"])
def test_reboot_recovers_without_operator(deployed, sim_cluster, which):
    first = complete(deployed["inv"])
    assert first["usage"]["completion_tokens"] == 24 and first["choices"][0]["text"]
    assert first["system_fingerprint"].startswith("vllm-0.32.0")
    sim_cluster.cluster.reboot(which)
    if which == ["node1"]:
        # Every unit is active, but the rebooted head waits for a worker that will never rejoin it: `up` must
        # see that the pair serves nothing and restart it, not call the release healthy (it once did).
        rc, res, err = up_json(deployed["inv"], "--dry-run")
        assert rc == 0 and res["message"].endswith(f"release {res['release']} would be started"), res["message"]
    t = wait_healthy(deployed["inv"], 420)
    TIMES[f"healthy after reboot of {'+'.join(which)}"] = t
    # greedy output across the ranks' restart: the same text and the same usage (from test_sim_engine.py)
    again = complete(deployed["inv"])
    assert (again["choices"][0]["text"], again["usage"]) == (first["choices"][0]["text"], first["usage"])
    print(f"\nreboot {which}: healthy again {t:.0f} s after the nodes were back")


def test_worker_crash_loop_stops_with_reason_then_rerun_converges(deployed, sim_cluster):
    # A short watchdog grace and one allowed restart for this test only (each failed start costs a grace and
    # a tick or two): the knobs live outside the release (no restart).
    rc, out, err = cli("up", "-i", str(deployed["inv"]), "--json", "--no-sentinel", "--ready-timeout", READY,
                       "--watchdog-grace", "20",
                       "--watchdog-backoff", "10", "--watchdog-cap", "1")
    res = json.loads(out)
    assert rc == 0 and not res["restarted"] and res["changes"] == 1, res["outcomes"]
    dropin = "/etc/systemd/system/sparkdeploy-engine.service.d"
    sim_cluster.ssh("node2", ["sh", "-c", f"mkdir -p {dropin} && printf '[Service]\\nExecStartPre=/bin/sh -c \"exit 3\"\\n'"
                              f" > {dropin}/crash.conf && systemctl daemon-reload && systemctl restart sparkdeploy-engine.service"
                              " || true"])
    t0 = time.monotonic()
    reason = None
    while time.monotonic() - t0 < 900:
        rc, rep = health_json(deployed["inv"])
        reason = next((f for f in rep.get("failed", []) if "supervisor stopped" in f), None)
        if reason:
            break
        time.sleep(10)
    TIMES["crash loop -> watchdog gives up"] = time.monotonic() - t0
    assert reason and "retry cap 1" in reason, rep
    # the head is stopped (not looping) and says why
    assert sim_cluster.ssh("node1", ["systemctl", "is-active", "sparkdeploy-engine.service"]).out.strip() != "active"
    sim_cluster.ssh("node2", ["sh", "-c", f"rm -rf {dropin} && systemctl daemon-reload"])
    rc, res, err = up_json(deployed["inv"])
    assert rc == 0 and res["healthy"] and res["restarted"], res["message"]
    assert health_json(deployed["inv"])[0] == 0


def test_up_one_node(deployed, sim_cluster):
    rc, res, err = up_json(deployed["inv"], "--nodes", "1")
    assert rc == 0 and res["healthy"], res["message"]
    retire = [o for o in res["outcomes"] if o["step"] == "retire"]
    assert retire and retire[0]["node"] == "node2" and retire[0]["status"] == "changed"
    assert sim_cluster.ssh("node2", ["systemctl", "is-enabled", "sparkdeploy-engine.service"]).out.strip() != "enabled"


def test_down_dry_run_names_what_down_then_does(deployed, sim_cluster):
    """`down --dry-run` stops nothing and names exactly the commands the real `down` then runs."""
    with D.load_context(str(deployed["inv"]), D.Options(dry_run=True)) as c:
        dry = D.down(c)
    assert sim_cluster.ssh("node1", ["systemctl", "is-active", "sparkdeploy-engine.service"]).out.strip() == "active"
    rc, out, err = cli("down", "-i", str(deployed["inv"]), "--dry-run")
    assert rc == 0, err[-2000:]
    assert sim_cluster.ssh("node1", ["systemctl", "is-active", "sparkdeploy-engine.service"]).out.strip() == "active"
    with D.load_context(str(deployed["inv"]), D.Options()) as c:
        real = D.down(c)
    assert effects(dry) and effects(dry) == effects(real)
    assert sim_cluster.ssh("node1", ["systemctl", "is-active", "sparkdeploy-engine.service"]).out.strip() != "active"


def test_print_timings():
    for k, v in TIMES.items():
        print(f"{k}: {v:.1f} s")
