"""`vocab rollout --live`: the path choice from the running release, the swap's checks and swap-back, the
release record after a good swap, and health's "served list" check.

Nodes are reached through the real LocalConn on one local state directory each; each node's engine is the
stand-in of test_vocab_live_swap (it does what the plugin does at a drafter call and logs its report line).
"""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from sparkdeploy import plan
from sparkdeploy.node import probes
from sparkdeploy.node.layout import NODE_PLAN_FILE, ServiceLayout
from sparkdeploy.ops import health, releases, vocab_live
from sparkdeploy.plan import render
from sparkdeploy.remote.connection import Target
from sparkdeploy.remote.ssh import LocalConn
from sparkdeploy.steps.vocab_rollout import live as rollout_live
from sparkdeploy.steps.vocab_rollout.checks import RolloutError
from tests.unit.test_dry_run import nodes as loopback  # noqa: F401 - a fixture: two loopback nodes, PATH stand-ins
from tests.unit.test_plan import _mtp_with_shortlist
from tests.unit.test_vocab_live_swap import LINE, Engine

OLD, NEW = b"0\n1\n2\n", b"0\n5\n"
OLD_SHA, NEW_SHA = (hashlib.sha256(x).hexdigest() for x in (OLD, NEW))
FIG = {"acceptance_length": 2.0}


def _node_plan(tmp_path, shortlist: dict | None, sha: str) -> bytes:
    """node1's node-plan.json as `up` renders it for the sim MTP profile with `shortlist:` settings, naming `sha`."""
    inv = _mtp_with_shortlist(tmp_path, shortlist)
    data = render.render(plan.plan(inv))["node1/release/node-plan.json"]
    return data.replace(inv.vocab.sha256.encode(), sha.encode())


def test_the_path_is_live_only_where_the_running_release_swaps_and_the_list_fits(tmp_path):
    live = rollout_live.shortlist_settings(_node_plan(tmp_path, {"capacity": 3000, "live_check_every": 64}, OLD_SHA))
    off = rollout_live.shortlist_settings(_node_plan(tmp_path, None, OLD_SHA))
    assert live["capacity"] == 3000 and live["sha256"] == OLD_SHA and "live_check_every" not in off

    def choose(settings, size, restart=False):
        return rollout_live.choose_path(settings, size, 1000, restart=restart, release=4)

    path, why = choose(live, 3000)
    assert path == "live" and "capacity 3,000 rows, list 3,000 ids" in why
    # a list beyond the release's own capacity: a restart would start the same head, which refuses it
    for restart in (False, True):
        with pytest.raises(RolloutError, match="3,001 ids exceed the draft head capacity of release 4 "
                                               r"\(3,000 rows.*raise shortlist.capacity to at least 3,001"):
            choose(live, 3001, restart=restart)
    path, why = choose(off, 900)
    assert path == "restart" and "release 4 starts the engine without a live list swap" in why
    assert choose(live, 900, restart=True) == ("restart", "--restart asked for a restart rollout")
    # no capacity in the release: the head was sized by the list it started with
    path, why = choose({"live_check_every": 8}, 1001)
    assert path == "restart" and "1,001 ids exceed the running draft head's 1,000 rows (the list it started" in why
    assert choose({"live_check_every": 8}, 1000)[0] == "live"


def test_an_acceptance_drop_beyond_noise_is_named_and_one_within_noise_is_not():
    before = {"code": {"acceptance_length": 2.4}, "chat": {"acceptance_length": 2.0}, "zh": None}
    assert rollout_live.acceptance_drop(before, {"code": {"acceptance_length": 2.35}, "chat": {"acceptance_length": 2.0},
                                                 "zh": {"acceptance_length": 1.0}}) is None
    why = rollout_live.acceptance_drop(before, {"code": {"acceptance_length": 1.2}, "chat": {"acceptance_length": 1.1}})
    assert why.startswith("mean acceptance length fell 2.200 -> 1.150") and "code 2.400->1.200" in why
    assert rollout_live.acceptance_drop({}, {"code": FIG}) is None  # nothing measured before: nothing to compare


@pytest.fixture
def cluster(tmp_path):
    """Two nodes sharing one local state directory (so pointers and releases move as on a node): both lists
    stored, release 1 current naming OLD (rendered with the live swap on), release 2 as the rollout writes it
    naming NEW; one engine rank per node serving OLD."""
    lay = ServiceLayout(etc_root=str(tmp_path / "etc"), state_root=str(tmp_path))
    settings = {"capacity": 3000, "live_check_every": 64}
    out = []
    for rank, name in enumerate(("node1", "node2")):
        conn = LocalConn(Target(name, "127.0.0.1", local=True))
        for data, sha in ((OLD, OLD_SHA), (NEW, NEW_SHA)):
            vocab_live.store(conn, lay, data, sha, {"source": "x.txt"})
        vocab_live.point(conn, lay, OLD_SHA)
        for number, sha in ((1, OLD_SHA), (2, NEW_SHA)):
            releases.write(conn, lay, number, {NODE_PLAN_FILE: (_node_plan(tmp_path, settings, sha), 0o644)}, {})
        releases.switch(conn, lay, 1)
        out.append((conn, lay, Engine(conn, lay, OLD_SHA, ranks=(rank,))))
    return out


def _swap(cluster, verify):
    engines = {conn.name: engine for conn, _, engine in cluster}
    return rollout_live.swap_and_check([c for c, _, _ in cluster], cluster[0][1], NEW_SHA, OLD_SHA, verify=verify,
                                       logs=lambda conn, lay: engines[conn.name].logs(conn, lay), timeout=5)


def test_a_good_swap_then_its_release_made_current_matches_what_a_restart_would_load(cluster):
    checked = []

    def verify():  # runs once every rank serves the new list
        checked.append({c.name: e.sha for c, _, e in cluster})
        return None

    out = _swap(cluster, verify)
    assert out.ok and checked == [{"node1": NEW_SHA, "node2": NEW_SHA}]
    conns, lay = [c for c, _, _ in cluster], cluster[0][1]
    rollout_live.make_current(conns, lay, 2)
    for conn, lay, _ in cluster:
        state = vocab_live.read_state(conn, lay)
        assert releases.scan(conn, lay).current == 2
        assert (state.configured, state.content, state.problem()) == (NEW_SHA, NEW_SHA, None)


def test_an_acceptance_drop_swaps_the_old_list_back_live_on_every_rank(cluster):
    out = _swap(cluster, lambda: rollout_live.acceptance_drop({"code": FIG}, {"code": {"acceptance_length": 1.0}}))
    assert not out.ok and out.swapped_back is True and out.reason.startswith("mean acceptance length fell 2.000")
    for conn, lay, engine in cluster:
        assert engine.sha == OLD_SHA and vocab_live.read_state(conn, lay).content == OLD_SHA
        assert releases.scan(conn, lay).current == 1  # the release the rollout wrote never became current
    history = [(e["sha256"], e["result"]) for e in vocab_live.history(conn, lay)]  # one line per node and swap
    assert history == [(NEW_SHA, "live")] * 2 + [(OLD_SHA, "live")] * 2


def test_a_refused_swap_runs_no_check_and_names_the_rank(cluster):
    cluster[1][2].refuse = "list of 5000 ids exceeds the head's capacity 3000"
    out = _swap(cluster, lambda: pytest.fail("no check runs after a refused swap"))
    assert not out.ok and out.swapped_back is None
    assert out.reason == (f"live swap refused: node2 rank 1: keeps {OLD_SHA[:12]}: list of 5000 ids exceeds the "
                          "head's capacity 3000")
    assert all(vocab_live.read_state(c, lay).content == OLD_SHA for c, lay, _ in cluster)


def test_a_rank_that_reports_another_list_after_the_swap_fails_it_and_the_list_goes_back(cluster):
    engine = cluster[0][2]
    swapped_log = engine.logs

    def logs(conn, lay):  # node1's rank swaps, then reports the old list again (a later "keeps" line)
        text = swapped_log(conn, lay)
        if engine.sha == NEW_SHA:
            engine.log = text + LINE.format(event="keeps", sha=OLD_SHA, rank=0, why=" reason=bad rows")
            engine.sha = OLD_SHA
        return engine.log

    engine.logs = logs
    out = _swap(cluster, lambda: pytest.fail("the golden check runs only when every rank serves the list"))
    assert not out.ok and out.reason == f"node1 rank 0: serves {OLD_SHA[:12]}"


# ------------------------------------------------------------------------------------- health: served list
def _report_lines(*events) -> list[str]:
    return [LINE.format(event=ev, sha=sha, rank=rank, why=why).strip() for ev, sha, rank, why in events]


def test_health_passes_when_every_rank_serves_the_release_list_and_names_the_rank_that_does_not():
    snap = {"current": "releases/0004", "vocab_pointer": f"{NEW_SHA}.txt", "vocab_content": NEW_SHA,
            "vocab_configured": NEW_SHA}
    rep = health.Report()
    vocab_live.check(rep, "node1", dict(snap, vocab_reports=_report_lines(
        ("serves", OLD_SHA, 0, ""), ("serves", OLD_SHA, 1, ""), ("swapped; serves", NEW_SHA, 0, ""),
        ("swapped; serves", NEW_SHA, 1, ""))))
    vocab_live.check(rep, "node2", dict(snap, vocab_reports=_report_lines(
        ("serves", OLD_SHA, 2, ""), ("keeps", OLD_SHA, 2, " reason=rows unreadable"))))
    by = {c.node: c for c in rep.checks if c.name == "served list"}
    assert by["node1"].ok and by["node1"].reason == f"every rank (0, 1) serves {NEW_SHA[:12]}, the list release 4 names"
    assert not by["node2"].ok and by["node2"].reason.startswith(
        f"rank 2 serves {OLD_SHA[:12]} (kept it: rows unreadable), not {NEW_SHA[:12]}, the list release 4 names")
    rep = health.Report()
    vocab_live.check(rep, "node1", snap)  # an engine still loading has reported nothing: no verdict
    assert "served list" not in [c.name for c in rep.checks]


def test_the_node_snapshot_reads_the_reports_in_its_one_round_trip(tmp_path, monkeypatch):
    """The health script's docker call, answered by a `docker` on PATH that prints a recorded engine log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "engine.log"
    log.write_text("INFO loading\n" + "\n".join(_report_lines(("serves", OLD_SHA, 0, ""),
                                                              ("swapped; serves", NEW_SHA, 0, ""))) + "\n")
    (bin_dir / "docker").write_text(f'#!/bin/sh\n[ "$1" = logs ] && cat {log}\nexit 0\n')
    (bin_dir / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    calls = []
    conn = LocalConn(Target("node1", "127.0.0.1", local=True))
    query = conn.query
    monkeypatch.setattr(conn, "query", lambda *a, **k: calls.append(a) or query(*a, **k))
    lay = ServiceLayout(etc_root=str(tmp_path / "etc"), state_root=str(tmp_path))
    argv = probes.named_probe_argv("health", health.NODE_SECTIONS, health.node_values(lay))
    snap = health.snapshot(probes.split_sections(conn.query(argv, check=False).stdout), lay.unit)
    assert len(calls) == 1
    assert [r.sha256 for r in vocab_live.reports("\n".join(snap["vocab_reports"]))] == [OLD_SHA, NEW_SHA]
    assert json.dumps(snap)  # the snapshot stays plain data (health --json)


# ------------------------------------------------------------------------- the rollout's live phase, end to end
@pytest.fixture
def live_rollout(loopback):
    """A Rollout at its live phase on test_dry_run's loopback node (release 2 current, naming OLD; release 3
    written, naming NEW), golden outputs taken; its API a FakeVllm, its engine a `docker` on PATH whose `logs`
    does what a rank does at a drafter call: take the list the pointer names and log the report line."""
    import numpy as np

    from sparkdeploy.model import inventory as I
    from sparkdeploy.steps import vocab_rollout as rollout
    from sparkdeploy.steps.deploy import Context, Options
    from tests.unit.bench.fake_vllm import FakeVllm
    from tests.unit.test_dry_run import _two_releases

    nodes = loopback
    cx = Context(I.load(str(nodes / "inventory.yaml")), Options(nodes=1))
    _two_releases(cx, nodes / "node")
    conn = cx.conn("node1")
    for data, sha in ((OLD, OLD_SHA), (NEW, NEW_SHA)):
        vocab_live.store(conn, cx.lay, data, sha, {"source": "x.txt"})
    vocab_live.point(conn, cx.lay, OLD_SHA)
    releases.write(conn, cx.lay, 3, {"launch.sh": (b"#!/bin/sh\n", 0o755)}, {})
    log = nodes / "engine.log"
    log.write_text(LINE.format(event="serves", sha=OLD_SHA, rank=0, why=""))
    (nodes / "bin" / "docker").write_text(f"""#!/bin/sh
[ "$1" = logs ] || exit 0
pointed=$(readlink {cx.lay.vocab_host_dir}/current.txt | cut -c1-64)
tail -n1 {log} | grep -q "sha256=$pointed " || \\
  echo "spark_overlays: shortlist swapped; serves sha256=$pointed rows=2 capacity=3000 tp_rank=0 pid=7" >> {log}
cat {log}
""")
    (nodes / "bin" / "docker").chmod(0o755)
    with FakeVllm() as fake:
        r = rollout.Rollout(cx, rollout.Candidate("new.txt", NEW, np.array([0, 5]), NEW_SHA, "sha256:t", None),
                            rollout.RolloutOptions(categories=["code"], swap_timeout=5))
        r.c.names = ["node1"]
        r.prev, r.old_sha, r.new_num = 2, OLD_SHA, 3  # what _prepare read; _distribute wrote release 3
        r.exp = health.ServiceExpect(fake.url, "fake", [])
        res = rollout.RolloutResult(path="live", from_version=OLD_SHA[:12])
        r._capture_before(res)
        yield r, res, fake, conn
    cx.close()


def test_a_live_rollout_swaps_checks_and_makes_its_release_current_without_a_restart(live_rollout, loopback):
    r, res, fake, conn = live_rollout
    assert r._live(res) and res.golden_identical and res.acceptance_after["code"]
    assert releases.scan(conn, r.c.lay).current == 3
    assert vocab_live.read_state(conn, r.c.lay).content == NEW_SHA
    calls = (loopback / "calls.log").read_text() if (loopback / "calls.log").exists() else ""
    assert "systemctl stop" not in calls and "systemctl start" not in calls  # no restart


def test_a_live_rollout_whose_acceptance_falls_swaps_the_old_list_back_and_fails(live_rollout):
    r, res, fake, conn = live_rollout
    fake.accept_per_pos = (0.0, 0.0)  # the new list drafts nothing the model accepts
    assert not r._live(res)
    assert res.status == "failed" and res.rolled_back_to == r.prev == 2 and not res.ok
    assert "mean acceptance length fell" in res.reason
    assert res.message.startswith(f"live swap to {NEW_SHA[:12]} FAILED") and "SWAPPED BACK" in res.message
    assert vocab_live.read_state(conn, r.c.lay).content == OLD_SHA
    assert vocab_live.served(conn, r.c.lay)[0].sha256 == OLD_SHA
    assert releases.scan(conn, r.c.lay).current == 2  # still the release that names the old list
    assert conn.exists(f"{releases.rdir(r.c.lay, 3)}/FAILED")


def test_a_fall_allowed_by_the_operator_keeps_the_new_list_and_says_so(live_rollout):
    """`--allow-lower-acceptance`: a list meant for other traffic may draft worse on the golden prompts; the swap
    is kept and the fall reported, nothing else is waived (outputs and ranks are still checked)."""
    r, res, fake, conn = live_rollout
    r.opts.allow_lower_acceptance = True
    fake.accept_per_pos = (0.0, 0.0)
    assert r._live(res) and res.golden_identical, (res.message, res.reason, res.notes)
    assert any(n.startswith("kept with --allow-lower-acceptance: mean acceptance length fell") for n in res.notes), \
        (res.acceptance_before, res.acceptance_after, res.notes)
    assert vocab_live.read_state(conn, r.c.lay).content == NEW_SHA and releases.scan(conn, r.c.lay).current == 3
