"""Dry run by construction: `down --dry-run` and `rollback --dry-run` against two loopback nodes (this machine's
shell through LocalConn, the kit's paths moved under tmp_path, `systemctl` a stand-in that logs its calls) print
the exact commands and change nothing; `down`'s dry run lists what the real `down` then runs; a file write in a
dry run shows its diff against the node's file; no effect code asks `dry()`."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from sparkdeploy import paths
from sparkdeploy.cli import main
from sparkdeploy.cli.deploy import _print_outcomes
from sparkdeploy.model import inventory as I
from sparkdeploy.node import facts as F
from sparkdeploy.node.layout import ServiceLayout
from sparkdeploy.ops import releases
from sparkdeploy.remote.connection import Target, dry_session, recording
from sparkdeploy.remote.ssh import LocalConn
from sparkdeploy.steps import deploy as D
from sparkdeploy.steps.base import Outcome
from sparkdeploy.steps.deploy import Context, Options

FIXTURES = paths.repo_root() / "tests/unit/fixtures"


@pytest.fixture
def nodes(tmp_path, monkeypatch):
    """An inventory of two loopback nodes (node1 at 127.0.0.1, node2 at 127.0.0.2: both this machine), and
    `systemctl`, `apt-get` and `netplan` on PATH that append each call to tmp_path/calls.log."""
    text = (FIXTURES / "inventory.sim.yaml").read_text()
    text = re.sub(r"host: 172\.30\.97\.1(\d)", lambda m: f"host: 127.0.0.{int(m.group(1)) + 1}", text)
    (tmp_path / "inventory.yaml").write_text(text)
    (tmp_path / "vocab-1k.txt").write_bytes((FIXTURES / "vocab-1k.txt").read_bytes())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("systemctl", "apt-get", "netplan"):
        (bin_dir / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> {tmp_path}/calls.log\n')
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return tmp_path


def _changes(tmp_path: Path) -> list[str]:
    """The calls of the stand-ins that change the node (reads such as `systemctl is-active` run in a dry run
    too)."""
    log = tmp_path / "calls.log"
    calls = log.read_text().splitlines() if log.exists() else []
    reads = ("is-active", "is-enabled", "show", "status", "cat")
    return [c for c in calls if not (c.startswith("systemctl ") and c.split()[1] in reads)]


def _tree(root: Path) -> dict[str, str]:
    """Every file and link under root with its content or target: the node's state to compare."""
    return {str(p.relative_to(root)): (f"-> {os.readlink(p)}" if p.is_symlink() else p.read_text())
            for p in sorted(root.rglob("*")) if p.is_symlink() or p.is_file()}


def test_down_dry_run_prints_the_commands_of_the_real_down_and_runs_none(nodes, capsys):
    inventory = str(nodes / "inventory.yaml")
    assert main(["down", "--dry-run", "--inventory", inventory]) == 0
    printed = capsys.readouterr().err
    assert _changes(nodes) == []  # nothing was stopped or disabled
    dry = D.down(Context(I.load(inventory), Options(dry_run=True)))
    effects = [e for o in dry for e in o.effects]
    assert "node1: run systemctl stop sparkdeploy-engine.service" in effects
    assert "node2: run systemctl disable sparkdeploy-engine.service" in effects
    assert all(e in printed for e in effects)
    real = D.down(Context(I.load(inventory), Options()))
    assert [(o.node, o.status) for o in real if o.step == "down"] == [("node1", "changed"), ("node2", "changed")]
    assert sorted(e for o in real for e in o.effects) == sorted(effects)
    assert sorted("node: run " + c for c in _changes(nodes)) == sorted(
        re.sub(r"^node\d", "node", e) for e in effects)  # what the dry run listed is what ran


def _two_releases(cx: Context, root: Path) -> None:
    """Releases 1 (passed its gate) and 2 (current), under root, of a one-node deployment on node1 (the loopback
    nodes share this machine's files: each node's release.json records its own facts)."""
    cx.lay = ServiceLayout(etc_root=str(root / "etc"), state_root=str(root / "state"))
    conn = LocalConn(Target("node1", "localhost", local=True))
    for num in (1, 2):
        meta = {"image": f"sparkdeploy/serving-sim:v{num}", "facts": F.nominal(cx.inv.head).to_dict(),
                "served_as": None}
        releases.write(conn, cx.lay, num, {"launch.sh": (b"#!/bin/sh\n", 0o755)}, meta)
    releases.mark_healthy(conn, cx.lay, 1, {"probe": "ok"})
    releases.switch(conn, cx.lay, 2)


def test_rollback_dry_run_lists_the_switch_and_restart_and_changes_nothing(nodes):
    cx = Context(I.load(str(nodes / "inventory.yaml")), Options(nodes=1, dry_run=True))
    _two_releases(cx, nodes / "node")
    before = _tree(nodes / "node")
    res = D.rollback(cx, None)
    assert res.release == 1 and res.message.startswith("dry run: would roll back from release 2 to 1"), res.message
    start, = [o for o in res.outcomes if o.step == "start"]
    assert start.status == "would change" and start.actions == ["restart on release 1"]
    assert {"node1: run systemctl stop sparkdeploy-engine.service",
            "node1: run systemctl start sparkdeploy-engine.service",
            f"node1: link {cx.lay.current_link} -> releases/0001"} <= set(start.effects)
    assert _tree(nodes / "node") == before and _changes(nodes) == []


def test_rollback_dry_run_from_the_cli_prints_the_commands_and_exits_0(nodes, capsys, monkeypatch):
    def moved(cx: Context, to):  # the one-node deployment of the test above, its paths under tmp_path
        cx.opts.nodes, cx.names = 1, cx.names[:1]
        _two_releases(cx, nodes / "node")
        return rollback(cx, to)

    rollback = D.rollback
    monkeypatch.setattr(D, "rollback", moved)
    assert main(["rollback", "--dry-run", "--inventory", str(nodes / "inventory.yaml")]) == 0
    err = capsys.readouterr().err
    assert "node1: run systemctl start sparkdeploy-engine.service" in err and "releases/0001" in err
    assert "dry run: would roll back from release 2 to 1" in err
    assert _changes(nodes) == [], err


@pytest.mark.parametrize("path", ["restart", "live"])
def test_vocab_rollout_dry_run_lists_the_store_release_and_switch_and_changes_nothing(nodes, path):
    """Either path stores the list, writes the new release and moves both pointers; only the restart path
    stops and starts the engine."""
    import numpy as np

    from sparkdeploy.steps import vocab_rollout as rollout

    cx = Context(I.load(str(nodes / "inventory.yaml")), Options(nodes=1))
    _two_releases(cx, nodes / "node")
    old_sha = "a" * 64
    conn = cx.conn("node1")
    conn.put(f"{releases.rdir(cx.lay, 2)}/engine.env", f"SHORTLIST={old_sha}\n".encode())
    cx.scan()
    cx.plan = cx.release_plan(2)
    data = b"0\n1\n"
    cand = rollout.Candidate("l.txt", data, np.arange(2), releases.sha(data), "sha256:t", None)
    cx.opts.dry_run = True
    r = rollout.Rollout(cx, cand, rollout.RolloutOptions())
    r.prev, r.old_sha, r.new_num = 2, old_sha, 3  # what reading the nodes found (Rollout._prepare), with the plan
    before = _tree(nodes / "node")
    res = r._dry(rollout.RolloutResult(path=path))
    assert res.status == "would change" and res.ok and res.new_release is None, res.message
    vocab_dir, new_dir = cx.lay.vocab_host_dir, releases.rdir(cx.lay, 3)
    assert f"node1: link {vocab_dir}/current.txt -> {cand.sha256}.txt" in res.effects
    assert f"node1: link {cx.lay.current_link} -> releases/0003" in res.effects
    restarts = [e for e in res.effects if e.startswith("node1: run systemctl ") and "sparkdeploy-engine" in e]
    assert bool(restarts) == (path == "restart"), restarts
    env, = [e for e in res.effects if e.startswith(f"node1: write {new_dir}/engine.env ")]
    assert f"-SHORTLIST={old_sha}" not in env.diff and f"+SHORTLIST={cand.sha256}" in env.diff  # a new file
    assert _tree(nodes / "node") == before and _changes(nodes) == []
    assert json.loads(json.dumps(res.to_dict()))["effects"] == res.effects


@pytest.mark.skipif(not os.path.exists("/etc/ssh/ssh_host_ed25519_key.pub"), reason="no sshd host key to pin")
def test_weights_sync_dry_run_lists_the_copy_and_changes_nothing(tmp_path, monkeypatch):
    from sparkdeploy.ops import weights as w

    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # where the one-time key would be authorized
    head_dir, node_dir = tmp_path / "head-ckpt", tmp_path / "ckpt"
    for d, names in ((head_dir, ("config.json", "model.safetensors")), (node_dir, ("config.json",))):
        d.mkdir()
        for name in names:
            (d / name).write_text(f"{name}\n")
    head, node = (LocalConn(Target(n, "localhost", local=True)) for n in ("node1", "node2"))
    before = _tree(node_dir)
    # the head's listing of its checkpoint (read from head_dir: both nodes here are this machine)
    res, = w.sync(w.Endpoint(head, "node1", "127.0.0.1"), [w.Endpoint(node, "node2", "127.0.0.2")], str(node_dir),
                  dry_run=True, head_manifest=w.manifest(head, str(head_dir)), streams=2)
    assert (res.status, res.files, res.streams) == ("would change", 1, 1)
    assert res.effects[0] == f"node2: run mkdir -p {node_dir}"
    rsync, = [e for e in res.effects if e.startswith("node1: run rsync ")]
    assert "<directory mktemp makes on node1>/key" in rsync and rsync.endswith(
        f"{node_dir}/ root@127.0.0.2:{node_dir}/ <1 files, 18 bytes listed on stdin>")
    assert any(e.startswith("node2: run python3 -c ") and " authorize " in e for e in res.effects)
    assert "node1: run rm -rf '<directory mktemp makes on node1>'" in res.effects
    assert _tree(node_dir) == before  # nothing copied; no key authorized (the hash cache may be written: a read's)
    assert not (tmp_path / "home/.ssh").exists()


def test_host_setup_dry_run_prints_the_commands_and_writes_and_changes_nothing(nodes, capsys, monkeypatch):
    from sparkdeploy.ops import hostsetup as hs

    etc = nodes / "etc"  # the host files moved under tmp_path; earlyoom's default file is there, stale
    monkeypatch.setattr(hs, "EARLYOOM_DEFAULT", str(etc / "default/earlyoom"))
    monkeypatch.setattr(hs, "NETPLAN_FILE", str(etc / "netplan/40-cx7.yaml"))
    monkeypatch.setattr(hs, "dropin_path", lambda unit: str(etc / f"systemd/{unit}.service.d/oom.conf"))
    (etc / "default").mkdir(parents=True)
    (etc / "default/earlyoom").write_text('EARLYOOM_ARGS="-r 3600"\n')
    before = _tree(etc)
    assert main(["host", "setup", "--dry-run", "--json", "--inventory", str(nodes / "inventory.yaml")]) == 0
    out = capsys.readouterr()
    effects = json.loads(out.out)["effects"]
    for node in ("node1", "node2"):
        assert f"{node}: run mkdir -p {etc}/default" in effects[node]
        assert any(e.startswith(f"{node}: write {etc}/default/earlyoom mode 0644 ") for e in effects[node])
        assert f"{node}: run systemctl restart earlyoom" in effects[node]
        assert all(e in out.err for e in effects[node])
    assert _tree(etc) == before and _changes(nodes) == []


def test_host_setup_reports_each_item_in_the_one_result_vocabulary(nodes, capsys, monkeypatch):
    """A dry run says `would change` where the real run then says `changed` (the JSON `--json` prints), and a
    failing item leaves the items after it on that node `skipped`, with why."""
    from sparkdeploy.ops import hostsetup as hs

    etc = nodes / "etc"
    monkeypatch.setattr(hs, "EARLYOOM_DEFAULT", str(etc / "default/earlyoom"))
    monkeypatch.setattr(hs, "NETPLAN_FILE", str(etc / "netplan/40-cx7.yaml"))
    monkeypatch.setattr(hs, "dropin_path", lambda unit: str(etc / f"systemd/{unit}.service.d/oom.conf"))
    argv = ["host", "setup", "--json", "--inventory", str(nodes / "inventory.yaml")]

    def statuses(out: str) -> dict:
        return {n: {i["item"]: i["status"] for i in its} for n, its in json.loads(out)["nodes"].items()}

    assert main([*argv, "--dry-run"]) == 0
    dry = statuses(capsys.readouterr().out)
    assert dry["node1"]["earlyoom-config"] == "would change" and dry["node1"]["netplan"] == "skipped", dry
    (nodes / "bin/apt-get").write_text("#!/bin/sh\necho 'E: no network' >&2\nexit 100\n")  # packages fail
    assert main(argv) == 1
    real = statuses(capsys.readouterr().out)
    for node in ("node1", "node2"):
        assert real[node]["packages"] == "failed" and real[node]["netplan"] == "skipped", real
        assert {real[node][i] for i, s in dry[node].items() if s == "would change" and i != "packages"} == \
            {"skipped"}, real  # not run: the packages came first and failed
    assert set().union(*(set(s.values()) for s in real.values())) <= {"ok", "changed", "failed", "skipped"}


def test_host_setup_covers_a_node_that_serves_no_service(nodes, capsys, monkeypatch):
    """A ring's third box is in no service, yet needs earlyoom, the sshd drop-in and its netplan like the rest;
    `--service s1` keeps to that service's nodes."""
    import yaml

    data = yaml.safe_load((nodes / "inventory.yaml").read_text())
    data["services"] = [{"name": "s1", "nodes": ["node1"],
                         **{k: data.pop(k) for k in ("profile", "vocab", "patches", "ports", "memory")}}]
    for node in data["nodes"]:
        node.pop("role")
    (nodes / "services.yaml").write_text(yaml.safe_dump(data))
    argv = ["host", "setup", "--dry-run", "--json", "--inventory", str(nodes / "services.yaml")]
    assert main(argv) == 0
    assert set(json.loads(capsys.readouterr().out)["nodes"]) == {"node1", "node2"}
    assert main([*argv, "--service", "s1"]) == 0
    assert set(json.loads(capsys.readouterr().out)["nodes"]) == {"node1"}
    assert _changes(nodes) == []


def test_a_dry_write_shows_its_diff_against_the_nodes_file(tmp_path, capsys):
    c = LocalConn(Target("n1", "localhost", local=True))
    conf, new, key = tmp_path / "app.conf", tmp_path / "new.conf", tmp_path / "key.pem"
    conf.write_text("a = 1\nb = 2\n")
    conf_new = b"a = 1\nb = 3\n"
    key.write_text("secret-1\n")
    with dry_session(), recording(dry=True) as made:
        c.put(str(conf), conf_new)
        c.put(str(new), b"x\n")
        c.put(str(key), b"secret-2\n", mode=0o600)
        c.put(str(tmp_path / "blob"), b"\0" * 10)
    changed, created, secret, binary = made
    assert changed.diff.splitlines() == [f"--- n1:{conf} (on the node)", f"+++ n1:{conf} (this run)", "@@ -1,2 +1,2 @@",
                                         " a = 1", "-b = 2", "+b = 3"]
    assert created.diff.splitlines()[0] == "--- /dev/null" and created.diff.splitlines()[-1] == "+x"
    assert secret.diff == "" and "secret" not in secret  # only its size and hash: a key is never printed
    assert binary.diff == "" and binary.endswith("10 bytes sha256:" + releases.sha(b"\0" * 10)[:12])
    assert conf.read_text() == "a = 1\nb = 2\n" and not new.exists() and key.read_text() == "secret-1\n"
    assert changed == f"n1: write {conf} mode 0644 12 bytes sha256:{releases.sha(conf_new)[:12]}"
    assert json.loads(json.dumps(made)) == list(made)  # effect lines stay plain strings (equal to the real run's)
    shown = Outcome("release", "n1", "would change", "", ["write"], 0.0, list(made))
    assert shown.to_dict()["diffs"] == {changed: changed.diff, created: created.diff}
    _print_outcomes([shown])
    printed = [line.strip() for line in capsys.readouterr().err.splitlines()]
    assert {"-b = 2", "+b = 3", "+x", f"+++ n1:{new} (this run)"} <= set(printed)


def test_the_recorder_answers_what_steers_later_effects_with_named_placeholders(tmp_path):
    from sparkdeploy.steps import image, supervise

    c = LocalConn(Target("n1", "localhost", local=True))
    with recording(dry=True) as made:
        built = image.build(c, "serving:test", {"Dockerfile": b"FROM scratch\n"})
        assert image.image_id(c, "serving:test", made_as=built) == built
    assert built == "<image id of serving:test built on n1>"
    assert made[0].startswith("n1: run flock /run/lock/sparkdeploy-build-serving_test.lock docker build -q -t "
                              "serving:test -f Dockerfile - <build context")
    lay = ServiceLayout(etc_root=str(tmp_path / "etc"), state_root=str(tmp_path / "state"))
    with recording(dry=True) as made:
        pub = supervise.ensure_key(c, lay)
    assert pub == f"ssh-ed25519 <public key ssh-keygen makes on n1> {lay.watchdog_key_comment}"
    assert [m.split()[2] for m in made] == ["mkdir", "ssh-keygen"] and not (tmp_path / "etc").exists()


def test_no_effect_code_asks_whether_it_runs_dry():
    """Effects go through the recorder, which answers a dry run's outputs; only `remote/connection.py`
    holds the switch."""
    src = paths.repo_root() / "src/sparkdeploy"
    asking = [f"{p.relative_to(src)}:{i}" for p in sorted(src.rglob("*.py")) if p != src / "remote" / "connection.py"
              for i, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"\bdry\(\)", line)]
    assert asking == []
    assert "def dry()" in (src / "remote" / "connection.py").read_text()
