"""The step framework and the pure parts of `up`: diff -> actions, dry run, idempotence decision, build context."""

from __future__ import annotations

import io
import tarfile

import pytest

from sparkdeploy import paths
from sparkdeploy import plan as P
from sparkdeploy.errors import RemoteError
from sparkdeploy.model import inventory as I
from sparkdeploy.node import facts as F
from sparkdeploy.node import layout
from sparkdeploy.ops import releases
from sparkdeploy.plan import render
from sparkdeploy.remote.connection import Target
from sparkdeploy.remote.ssh import LocalConn
from sparkdeploy.steps import base, image, release, supervise
from sparkdeploy.steps.deploy import Context, Options

FIXTURE = paths.repo_root() / "tests/unit/fixtures/inventory.sim.yaml"


def test_step_reports_ok_changed_failed_and_dry_run(tmp_path):
    """Actions act through a Conn; a dry run runs them against the recorder: same effects listed, none made."""
    conn = LocalConn(Target("b", "localhost", local=True))
    target = tmp_path / "f"

    def fix():
        conn.run(["mkdir", "-p", str(tmp_path)])
        conn.put(str(target), b"x\n", mode=0o600)

    diffs = {"a": [], "b": [base.Action("fix b", fix)]}
    dry = base.run_step("s", ["a", "b"], lambda n: diffs[n], dry_run=True)
    assert [o.status for o in dry] == ["ok", "would change"] and not target.exists()
    out = base.run_step("s", ["a", "b"], lambda n: diffs[n])
    assert [(o.node, o.status, o.actions) for o in out] == [("a", "ok", []), ("b", "changed", ["fix b"])]
    assert target.read_bytes() == b"x\n" and oct(target.stat().st_mode & 0o777) == "0o600"
    assert out[1].effects == dry[1].effects == [
        f"b: run mkdir -p {tmp_path}", f"b: write {target} mode 0600 2 bytes sha256:{releases.sha(b'x' + bytes([10]))[:12]}"]

    def boom():
        raise RemoteError("disk full", node="b")

    with pytest.raises(base.StepFailed, match="step s failed: b: b: disk full") as err:
        base.run_step("s", ["a", "b"], lambda n: [base.Action("x", boom)] if n == "b" else [])
    assert [o.status for o in err.value.outcomes] == ["ok", "failed"]


def test_ordered_step_stops_at_first_failure():
    seen = []

    def diff(n):
        seen.append(n)
        if n == "w":
            raise RemoteError("down", node=n)
        return []

    with pytest.raises(base.StepFailed):
        base.run_step("start", ["w", "h"], diff, ordered=True)
    assert seen == ["w"]


def test_context_tar_is_deterministic():
    files = {"Dockerfile": b"FROM x\n", "overlays/a.py": b"print(1)\n"}
    t1, t2 = image.context_tar(files), image.context_tar(dict(reversed(list(files.items()))))
    assert t1 == t2
    names = tarfile.open(fileobj=io.BytesIO(t1)).getnames()
    assert names == ["Dockerfile", "overlays/a.py"]


@pytest.fixture
def cluster():
    c = Context(I.load(FIXTURE), Options(nodes=2))
    c.plan = P.plan(c.inv, None, 2)
    c.files = render.render(c.plan)
    c.image_id = "sha256:" + "1" * 64
    return c


def _rel_from(c, num=3, image_id=None, healthy=True):
    out = {}
    for n in c.names:
        files = {k: releases.sha(v) for k, (v, _) in release.release_files(c, n).items()}
        out[n] = releases.NodeReleases(complete={num: {"files": files, "image_id": image_id or c.image_id}},
                                       current=num, healthy={num} if healthy else set())
    return out


def test_nothing_differs_means_no_new_release(cluster):
    cluster.rel = _rel_from(cluster)
    assert release.current_matches(cluster) == (True, {})
    out = []
    assert release.step_release(cluster, out) == 3
    assert all(o.status == "ok" for o in out)


def test_changed_file_or_image_means_new_release(cluster):
    cluster.rel = _rel_from(cluster)
    cluster.rel["node2"].complete[3]["files"]["engine.env"] = "0" * 64
    same, why = release.current_matches(cluster)
    assert not same and "engine.env" in why["node2"] and "node1" not in why
    cluster.rel = _rel_from(cluster, image_id="sha256:" + "2" * 64)
    same, why = release.current_matches(cluster)
    assert not same and "image" in why["node1"]


def test_release_files_head_carries_watchdog_config(cluster):
    head = release.release_files(cluster, "node1")
    assert set(head) == {"engine.env", "launch.sh", "node-plan.json", supervise.CONFIG}
    assert head["launch.sh"][1] == 0o755
    assert set(release.release_files(cluster, "node2")) == {"engine.env", "launch.sh", "node-plan.json"}
    assert list(cluster.unit_files("node2")) == [layout.PLAIN.unit_path]


def test_image_context_has_dockerfile_and_overlays_but_no_list(cluster):
    ctx = image.context(cluster.plan, cluster.files)
    assert ctx["Dockerfile"].startswith(b"# Rendered") and not any(k.startswith("vocab/") for k in ctx)
    assert all(not k.startswith("overlays/tests/") and "__pycache__" not in k for k in ctx)


def test_failed_or_aborted_newest_release_number_is_reused(cluster):
    cluster.opts.dry_run = True
    cluster.facts = {n.name: F.nominal(n) for n in cluster.inv.nodes}  # a dry run renders release.json too
    for n in cluster.names:  # ...and runs the write against the recorder, which needs a connection object only
        cluster.pool.conns[n] = LocalConn(Target(n, "localhost", local=True))
    rel = _rel_from(cluster)
    rel["node2"].complete[3]["files"]["engine.env"] = "0" * 64  # something differs -> a new release
    rel["node1"].incomplete.append(4)  # an aborted attempt
    cluster.rel = rel
    out = []
    assert release.step_release(cluster, out) == 4
    rel["node1"].complete[4] = {}
    rel["node2"].complete[4] = {}
    rel["node1"].healthy.add(4)  # 4 once passed its gate: keep it, write 5
    assert release.step_release(cluster, []) == 5


def test_rank_watch_stops_the_wait_once_a_rank_is_gone():
    """The readiness wait (of `up`, `rollback` and `vocab rollout` alike) ends at once when a rank's unit stopped
    being active or was restarted (issue 14), or its node booted again since the switch; not on a node that
    merely did not answer the check. The nodes' answers are canned here: what is judged is the decision."""
    from types import SimpleNamespace

    import pytest

    from sparkdeploy.steps.engine import RankLost, rank_watch

    answers: list[dict] = []
    journal = SimpleNamespace(query=lambda *a, **k: SimpleNamespace(stdout="engine: out of memory\n"))
    cx = SimpleNamespace(plan=SimpleNamespace(nodes=[SimpleNamespace(name="node1", rank=0),
                                                     SimpleNamespace(name="node2", rank=1)]),
                         head="node1", lay=SimpleNamespace(unit="sparkdeploy-engine.service"),
                         map=lambda fn: answers.pop(0), conn=lambda n: journal,
                         reconnect=lambda names, wait=0: {n: OSError("no route") for n in names})

    def unit(state="active", inv="a1", status="0", sub="running", boot="b/1"):
        return {"ActiveState": state, "SubState": sub, "InvocationID": inv, "ExecMainStatus": status, "boot": boot}

    check = rank_watch(cx, release=7)
    for seen in ({"node1": unit(), "node2": unit(inv="b1")},
                 {"node1": unit(), "node2": OSError("ssh dropped")}):  # unreachable: judged next time
        answers.append(seen)
        check()
    answers.append({"node1": unit(), "node2": unit("activating", "b1", "137", "auto-restart")})
    with pytest.raises(RankLost, match=r"node2 \(worker, rank 1\) failed to start or stopped on release 7: its "
                                       r"engine unit is activating \(auto-restart; its process exited with status "
                                       r"137\).*engine: out of memory"):
        check()
    check = rank_watch(cx)
    answers += [{"node1": unit(), "node2": unit(inv="b1")}, {"node1": unit(inv="a2"), "node2": unit(inv="b1")}]
    check()
    with pytest.raises(RankLost, match=r"node1 \(head, rank 0\): its engine unit was restarted"):
        check()
    check = rank_watch(cx, boots={"node1": "b/1", "node2": "b/1"})  # read before the switch
    answers.append({"node1": unit(), "node2": unit(boot="b/2")})  # node2 came back on a new boot
    with pytest.raises(RankLost, match=r"node2 \(worker, rank 1\) rebooted while the release came up"):
        check()


def test_each_service_authorizes_its_own_watchdog_key_for_its_own_ranks_only(tmp_path, monkeypatch):
    """A node shared by services s1 and s2: each head's watchdog key gets its own authorized_keys line whose
    forced command is `rank-ctl <service>`; a second run changes nothing and keeps the other service's line; the
    plain-named watchdog's line (an inventory without `services:` ran here before) goes, the user's own stays; the
    script refuses a name that is not a service name and any other verb (before it touches systemd or docker)."""
    import os
    import subprocess

    monkeypatch.setattr(supervise, "AUTHORIZED_KEYS", str(tmp_path / "ssh" / "authorized_keys"))
    monkeypatch.setattr(supervise, "RANK_CTL", str(tmp_path / "lib" / "rank-ctl"))
    monkeypatch.setattr(supervise, "LIB_DIR", str(tmp_path / "lib"))
    conn = LocalConn(Target("n2", "localhost", local=True))
    keys = {"s1": "ssh-ed25519 AAAAone", "s2": "ssh-ed25519 AAAAtwo"}
    (tmp_path / "ssh").mkdir()
    (tmp_path / "ssh" / "authorized_keys").write_text(
        "ssh-ed25519 AAAAuser nvidia@laptop\n"
        f'restrict,command="{tmp_path}/lib/rank-ctl" ssh-ed25519 AAAAplain sparkdeploy-watchdog\n')
    for _ in range(2):
        for service, key in keys.items():
            for act in supervise.worker_actions(conn, layout.ServiceLayout(service), f"{key} made-on-head"):
                act.do()
    assert all(supervise.worker_actions(conn, layout.ServiceLayout(s), f"{k} x") == [] for s, k in keys.items())
    rank_ctl = tmp_path / "lib" / "rank-ctl"
    assert (tmp_path / "ssh" / "authorized_keys").read_text().splitlines() == [
        "ssh-ed25519 AAAAuser nvidia@laptop",
        f'restrict,command="{rank_ctl} s1" ssh-ed25519 AAAAone sparkdeploy-watchdog-s1',
        f'restrict,command="{rank_ctl} s2" ssh-ed25519 AAAAtwo sparkdeploy-watchdog-s2']
    for name, verb, words in (("s1;reboot", "status", "bad service name"), ("-x", "status", "bad service name"),
                              ("s1", "reboot", "verb not allowed")):
        res = subprocess.run(["sh", str(rank_ctl), name], capture_output=True, text=True,
                             env={**os.environ, "SSH_ORIGINAL_COMMAND": verb})
        assert res.returncode == 2 and words in res.stderr, (name, verb, res)


# ------------------------------------------------------------------------------------------ launch check
def test_a_refused_launch_names_the_profile_key_or_the_owning_field():
    from sparkdeploy.steps.launch_check import LaunchRefused, judge, source_of

    out = ('vllm logs go to stderr\n{"vllm_version": "0.32.0", "refused": {"flag": "--compilation-config", '
           '"error": "CompilationConfig mode Input should be 0, 1, 2 or 3"}}\n')
    with pytest.raises(LaunchRefused, match=r"node1: vLLM 0\.32\.0 .* mode Input should be .* fix "
                                            r"engine_args\.compilation-config; the old release still serves"):
        judge("node1", out, 1, "", "0.32")
    assert source_of("0.32", "--max-model-len") == "engine.max_model_len"  # a flag the kit owns: its field
    assert source_of("0.32", "--no-such-flag") == "engine_args.no-such-flag"
    assert source_of("0.32", None) == "the profile's engine_args or the inventory"
    judge("node1", '{"vllm_version": "0.32.0", "refused": null}\n', 0, "", "0.32")  # accepted: no error


def test_a_launch_check_that_could_not_run_is_a_node_error_not_a_refusal():
    from sparkdeploy.errors import RemoteError
    from sparkdeploy.steps.launch_check import judge

    with pytest.raises(RemoteError, match=r"did not run \(exit 125\): docker: Unable to find image"):
        judge("node2", "", 125, "docker: Unable to find image 'x:1' locally", "0.32")


def test_the_launch_check_sees_the_releases_mounts():
    from sparkdeploy.steps.launch_check import mounts

    argv = ["docker", "run", "--name", "e", "-v", "/var/lib/sparkdeploy/vocab:/opt/sparkdeploy/vocab:ro", "--env-file",
            "x", "-v", "/models/host:/models/m:ro", "image:tag"]
    assert mounts(argv) == ["-v", "/var/lib/sparkdeploy/vocab:/opt/sparkdeploy/vocab:ro", "-v",
                            "/models/host:/models/m:ro"]
