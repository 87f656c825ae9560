"""vocab rollout: local validation (refused before any connection), list diff, version picking, the on-node
state script, and the health checks for the live list."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from sparkdeploy import cli
from sparkdeploy.errors import VocabError
from sparkdeploy.model import served_tokenizer
from sparkdeploy.node.layout import ServiceLayout
from sparkdeploy.ops import health, vocab_live
from sparkdeploy.steps import vocab_rollout as rollout

FIXTURES = Path(__file__).parent / "fixtures"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A model dir whose tokenizer is a 400-token ByteLevel BPE with the sim models' specials (0 = EOS)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tk.train_from_iterator(["the quick brown fox jumps over the lazy dog " * 50, "def f(x):\n    return x\n" * 50],
                           trainer)
    d = tmp_path_factory.mktemp("model")
    tk.save(str(d / "tokenizer.json"))
    (d / "config.json").write_text(json.dumps({"eos_token_id": 0}))
    return d


@pytest.fixture(scope="module")
def tok(model_dir):
    from sparkdeploy.vocab import load_tokenizer

    return load_tokenizer(str(model_dir))


@pytest.fixture
def inventory(tmp_path, model_dir, monkeypatch):
    """The unit fixture inventory (unreachable sim IPs); its model's tokenizer is the test tokenizer."""
    for name in ("inventory.sim.yaml", "vocab-1k.txt"):
        shutil.copy(FIXTURES / name, tmp_path / name)
    monkeypatch.setattr(served_tokenizer, "table",
                        lambda root=None: {"sparkdeploy/tiny-qwen3": {"source": str(model_dir)}})
    return tmp_path / "inventory.sim.yaml"


@pytest.fixture
def no_connections(monkeypatch):
    """Any attempt to reach a node fails the test."""
    calls = []

    def refuse(*a, **k):
        calls.append(a)
        raise AssertionError("a node was contacted")

    import sparkdeploy.remote.ssh as remote

    monkeypatch.setattr(remote, "connect", refuse)
    monkeypatch.setattr(remote.SSHConn, "__init__", refuse)
    return calls


def good_ids(tok, n=200):
    return np.union1d(np.arange(n), tok.required_ids)


# ------------------------------------------------------------------------------------------- validation
def test_a_valid_list_passes(tmp_path, tok):
    p = rollout.write_list_with_manifest(tmp_path / "l.txt", good_ids(tok), tok)
    cand = rollout.check_candidate(str(p), tok)
    assert cand.size == 200 and cand.sha256 == __import__("hashlib").sha256(p.read_bytes()).hexdigest()
    assert cand.version == cand.sha256[:12] and cand.tokenizer_hash == tok.content_hash


@pytest.mark.parametrize("case, expect", [
    ("wrong_hash", "tokenizer hash mismatch"),
    ("out_of_range", "out of range"),
    ("missing_eos", "missing EOS"),
    ("empty", "empty"),
    ("not_a_list", "not a list"),
    ("json_object", "not a list"),
    ("unsorted", "not sorted"),
    ("duplicates", "duplicate"),
    ("no_manifest", "no manifest"),
])
def test_bad_lists_are_refused(tmp_path, tok, case, expect):
    p = tmp_path / "l.txt"
    rollout.write_list_with_manifest(p, good_ids(tok), tok)
    man = p.with_name("l.manifest.json")
    if case == "wrong_hash":
        m = json.loads(man.read_text())
        m["tokenizer"]["content_hash"] = "sha256:" + "0" * 64
        man.write_text(json.dumps(m))
    elif case == "out_of_range":
        p.write_text("".join(f"{i}\n" for i in [*range(10), tok.vocab_size + 5]))
        man.unlink()
    elif case == "missing_eos":
        p.write_text("".join(f"{i}\n" for i in range(3, 50)))
        man.unlink()
    elif case == "empty":
        p.write_text("")
        man.unlink()
    elif case == "not_a_list":
        p.write_text("hello: world\nids: [1, 2]\n")
        man.unlink()
    elif case == "json_object":
        p.write_text(json.dumps({"ids": [0, 1, 2]}))
        man.unlink()
    elif case == "unsorted":
        p.write_text("".join(f"{i}\n" for i in [0, 1, 2, 9, 5]))
        man.unlink()
    elif case == "duplicates":
        p.write_text("".join(f"{i}\n" for i in [0, 1, 2, 5, 5]))
        man.unlink()
    elif case == "no_manifest":
        man.unlink()
        with pytest.raises(VocabError, match=expect):
            rollout.check_candidate(str(p), tok)
        assert rollout.check_candidate(str(p), tok, allow_no_manifest=True).size == 200
        return
    with pytest.raises(VocabError, match=expect):
        rollout.check_candidate(str(p), tok, allow_no_manifest=True)


def test_json_array_lists_are_refused_as_the_engine_refuses_them(tmp_path, tok):
    # One format for every reader (spark_overlays.vocab_list.FORMAT): a JSON array shipped by a rollout would be
    # refused by the engine's reader at start, so the rollout refuses it before any node is touched.
    from spark_overlays import vocab_list

    p = tmp_path / "l.json"
    p.write_text(json.dumps(good_ids(tok, 50).tolist()))
    with pytest.raises(VocabError, match=r"l.json, line 1: not a list of token ids"):
        rollout.check_candidate(str(p), tok, allow_no_manifest=True)
    with pytest.raises(vocab_list.VocabListError, match=r"l.json, line 1: not a list of token ids"):
        vocab_list.read_ids(p)


@pytest.mark.parametrize("content", ["", "1\n2\nx\n", '{"a": 1}', "[0, 1, 2]\n", "0\n\u00b2\n", "0\n" + "9" * 5000 + "\n",
                                     "0\n99999999999999999999\n", "0\n+1\n", "0\n\u0663\n"])
def test_cli_refuses_with_exit_2_and_contacts_no_node(tmp_path, inventory, no_connections, content, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_text(content)
    for extra in ([], ["--dry-run"]):
        assert cli.main(["vocab", "rollout", str(bad), "-i", str(inventory), "--allow-no-manifest", *extra]) == 2
    assert no_connections == []
    assert "error:" in capsys.readouterr().err


def test_cli_refuses_wrong_tokenizer_before_connecting(tmp_path, inventory, no_connections, tok):
    p = rollout.write_list_with_manifest(tmp_path / "l.txt", good_ids(tok), tok)
    m = json.loads(p.with_name("l.manifest.json").read_text())
    m["tokenizer"]["content_hash"] = "sha256:" + "1" * 64
    p.with_name("l.manifest.json").write_text(json.dumps(m))
    assert cli.main(["vocab", "rollout", str(p), "-i", str(inventory)]) == 2
    assert no_connections == []


def test_served_tokenizer_must_match_the_recorded_hash(inventory, monkeypatch, model_dir):
    from sparkdeploy.model import inventory as I

    inv = I.load(inventory)
    monkeypatch.setattr(served_tokenizer, "table", lambda root=None: {
        "sparkdeploy/tiny-qwen3": {"source": str(model_dir), "content_hash": "sha256:" + "2" * 64}})
    with pytest.raises(VocabError, match="records"):
        served_tokenizer.resolve(inv)
    monkeypatch.setattr(served_tokenizer, "table", lambda root=None: {})
    with pytest.raises(VocabError, match="no tokenizer is recorded"):
        served_tokenizer.resolve(inv)


def test_shipped_table_names_the_profiles_models():
    t = served_tokenizer.table()
    assert t["sparkdeploy/tiny-qwen3-next-mtp"]["source"].startswith("image:")
    for entry in t.values():
        assert entry["content_hash"].startswith("sha256:")


# ------------------------------------------------------------------------------------------- diff, pick
def test_list_diff_and_coverage(tmp_path, tok):
    d = rollout.list_diff(np.arange(10), np.arange(5, 20))
    assert (d["added"], d["removed"], d["old_size"], d["new_size"]) == (10, 5, 10, 15)
    assert rollout.list_diff(None, np.arange(3))["added"] is None
    sample = tmp_path / "s.txt"
    sample.write_text("the quick brown fox")
    rows = rollout.coverage_change(np.arange(3), np.arange(tok.vocab_size), tok, [str(sample)])
    assert rows[0]["miss_new"] == 0.0 and rows[0]["miss_old"] > 0


def test_pick_version():
    a, b, c = "a" * 64, "b" * 64, "c" * 64
    hist = [{"action": "rollout", "sha256": b, "from": a}, {"action": "rollout", "sha256": c, "from": b},
            {"action": "auto-rollback", "sha256": c, "from": a}]
    assert rollout.pick_version(hist, [a, b, c], c, None) == b
    assert rollout.pick_version(hist, [a, b, c], c, "aaaaaa") == a
    with pytest.raises(VocabError, match="no stored version"):
        rollout.pick_version(hist, [a, b, c], c, "dddddd")
    with pytest.raises(VocabError, match="no stored version"):
        rollout.pick_version(hist, [a, b, c], c, "aa")  # too short to name a version
    with pytest.raises(VocabError, match="no earlier list"):
        rollout.pick_version([], [a], a, None)


def test_golden_prompts_are_fixed_and_cover_categories():
    p1, p2 = rollout.golden_prompts(), rollout.golden_prompts()
    assert p1 == p2 and len({c for c, _ in p1}) == len(p1) >= 4
    assert rollout.mismatches({"a": "x", "b": "y"}, {"a": "x", "b": "z"}) == ["b"]


# ----------------------------------------------------------------------------------- on-node state + health
def _rendered_node_plan(sha: str, tmp_path: Path) -> bytes:
    """node1's node-plan.json as `up` renders it for the MTP profile, naming list `sha`."""
    from sparkdeploy import plan as P
    from sparkdeploy.model import inventory as I
    from sparkdeploy.plan import render

    shutil.copy(FIXTURES / "vocab-1k.txt", tmp_path / "vocab-1k.txt")
    text = (FIXTURES / "inventory.sim.yaml").read_text().replace("profile: sim-tiny ", "profile: sim-tiny-next-mtp ")
    (tmp_path / "inv.yaml").write_text(text)
    inv = I.load(tmp_path / "inv.yaml")
    files = render.render(P.plan(inv))
    data = files["node1/release/node-plan.json"]
    assert inv.vocab.sha256.encode() in data
    return data.replace(inv.vocab.sha256.encode(), sha.encode())


def test_state_script_reads_pointer_content_and_the_release_hash(tmp_path):
    from sparkdeploy.remote.connection import Target
    from sparkdeploy.remote.ssh import LocalConn

    data = b"0\n1\n2\n"
    sha = __import__("hashlib").sha256(data).hexdigest()
    vdir, etc = tmp_path / "vocab", tmp_path / "etc"
    (etc / "releases" / "0003").mkdir(parents=True)
    (etc / "releases" / "0003" / "node-plan.json").write_bytes(_rendered_node_plan(sha, tmp_path))
    (etc / "current").symlink_to("releases/0003")
    conn = LocalConn(Target("n1", "127.0.0.1", local=True))
    lay = ServiceLayout(etc_root=str(etc), state_root=str(tmp_path))
    lv = vocab_live.read_state(conn, lay)
    assert lv.pointer is None and lv.content is None and lv.configured == sha and lv.release == 3
    assert "missing" in lv.problem()
    conn.run(["mkdir", "-p", str(vdir)])
    assert vocab_live.store(conn, lay, data, sha, {"source": "x.txt"}) is True
    assert vocab_live.store(conn, lay, data, sha, {"source": "x.txt"}) is False  # content-addressed: once
    vocab_live.point(conn, lay, sha)
    vocab_live.record(conn, lay, {"action": "rollout", "sha256": sha})
    assert [e["action"] for e in vocab_live.history(conn, lay)] == ["rollout"]
    with pytest.raises(Exception, match="not stored"):
        vocab_live.point(conn, lay, "f" * 64)
    lv = vocab_live.read_state(conn, lay)
    assert (lv.pointer, lv.content, lv.stored, lv.problem()) == (f"{sha}.txt", sha, [sha], None)
    (vdir / f"{sha}.txt").write_bytes(b"0\n1\n")  # altered in place
    assert "does not hash to its name" in vocab_live.read_state(conn, lay).problem()


def test_health_flags_a_node_whose_list_differs():
    a, b = "a" * 64, "b" * 64
    rep = health.Report()
    vocab_live.check(rep, "node1", {"current": "releases/0004", "vocab_pointer": f"{a}.txt", "vocab_content": a,
                                    "vocab_configured": a})
    vocab_live.check(rep, "node2", {"current": "releases/0004", "vocab_pointer": f"{b}.txt", "vocab_content": b,
                                    "vocab_configured": a})
    by = {(c.node, c.name): c for c in rep.checks}
    assert by[("node1", "draft vocab")].ok and "aaaaaaaaaaaa" in by[("node1", "draft vocab")].reason
    assert not by[("node2", "draft vocab")].ok and "differs" in by[("node2", "draft vocab")].reason
    assert not by[("node2", "vocab agreement")].ok and not rep.healthy


def test_health_is_quiet_without_a_shortlist():
    rep = health.Report()
    vocab_live.check(rep, "node1", {"current": "releases/0001"})
    assert rep.checks == []


def test_prune_keeps_live_and_protected(tmp_path):
    from sparkdeploy.remote.connection import Target
    from sparkdeploy.remote.ssh import LocalConn

    conn = LocalConn(Target("n1", "127.0.0.1", local=True))
    lay = ServiceLayout(state_root=str(tmp_path))
    shas = []
    for i in range(5):
        data = f"{i}\n".encode()
        sha = __import__("hashlib").sha256(data).hexdigest()
        vocab_live.store(conn, lay, data, sha, {})
        vocab_live.record(conn, lay, {"sha256": sha})
        shas.append(sha)
    state = vocab_live.LiveVocab("n1", content=shas[0], configured=shas[0], stored=sorted(shas))
    dropped = vocab_live.prune(conn, lay, state, {shas[1]}, keep=1)
    assert set(dropped) == {shas[2], shas[3]}
    assert sorted(p.name[:64] for p in (tmp_path / "vocab").glob("*.txt")) == sorted([shas[0], shas[1], shas[4]])


# ------------------------------------------------------------------------------- the derived release files
class _FakeConn:
    def __init__(self, name, files):
        self.name, self.files = name, files

    def get(self, path):
        return self.files.get(path.rsplit("/", 1)[-1])


class _FakeCluster:
    def __init__(self, conns, meta):
        from sparkdeploy.ops.releases import NodeReleases
        from sparkdeploy.steps.context import Options

        self.conns, self.opts = conns, Options()
        self.names = list(conns)
        self.head = self.names[0]
        self.lay = ServiceLayout()
        self.rel = {n: NodeReleases(complete={4: dict(meta)}, current=4) for n in conns}

    def conn(self, n):
        return self.conns[n]


def _derive(monkeypatch, files, edit=None):
    from sparkdeploy.ops import releases

    old, new = "a" * 64, "b" * 64
    monkeypatch.setattr(releases, "file_digests", lambda c, lay, num: {k: "x" for k in c.files})
    cl = _FakeCluster({"node1": _FakeConn("node1", files)}, {"number": 4, "files": {}, "fingerprint": "f00",
                                                            "image_id": "sha256:1", "facts": {"x": 1}})
    cand = rollout.Candidate("l.txt", b"0\n", np.arange(1), new, "sha256:t", None)
    r = rollout.Rollout(cl, cand, rollout.RolloutOptions(edit=edit))
    r.prev, r.old_sha = 4, old
    return r.new_release_files("node1")


def test_new_release_changes_only_the_list_hash(monkeypatch):
    a, b = "a" * 64, "b" * 64
    files = {"launch.sh": f"exec docker run img vllm serve --additional-config '{{\"sha256\":\"{a}\"}}'\n".encode(),
             "engine.env": b"X=1\n", "node-plan.json": f'{{"sha256": "{a}"}}'.encode()}
    out, meta = _derive(monkeypatch, files)
    assert out["engine.env"] == (b"X=1\n", 0o644)
    assert out["launch.sh"][0] == files["launch.sh"].replace(a.encode(), b.encode()) and out["launch.sh"][1] == 0o755
    assert b.encode() in out["node-plan.json"][0] and a.encode() not in out["node-plan.json"][0]
    assert meta["image_id"] == "sha256:1" and meta["facts"] == {"x": 1} and meta["derived_from"] == 4
    assert meta["vocab"]["sha256"] == b and "number" not in meta and meta["fingerprint"].startswith("f00+vocab-")


def test_a_release_that_never_names_the_list_is_refused(monkeypatch):
    with pytest.raises(rollout.RolloutError, match="never names"):
        _derive(monkeypatch, {"launch.sh": b"exec true\n"})


def test_edit_hook_sees_and_changes_the_files(monkeypatch):
    a = "a" * 64

    def edit(node, files):
        files["launch.sh"] += b"--extra\n"
        return files

    out, _ = _derive(monkeypatch, {"launch.sh": f"{a}\n".encode()}, edit)
    assert out["launch.sh"][0].endswith(b"--extra\n") and out["launch.sh"][1] == 0o755


def test_downtime_is_the_longest_gap_between_successes():
    import importlib.util

    spec = importlib.util.spec_from_file_location("rollout_downtime",
                                                  Path(__file__).parents[2] / "bench" / "rollout_downtime.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    log = [(0, 1, True), (1, 2, True), (2, 3, False), (3, 9, False), (9, 10, True), (10, 11, True)]
    gap, a, b = mod.downtime(log, 1.5, 10.5)
    assert (gap, a, b) == (8, 2, 10)


def test_follow_release_points_at_the_list_the_release_expects(tmp_path):
    from sparkdeploy.remote.connection import Target
    from sparkdeploy.remote.ssh import LocalConn

    conn = LocalConn(Target("n1", "127.0.0.1", local=True))
    a, b = b"0\n1\n", b"0\n1\n2\n"
    sa, sb = (hashlib.sha256(x).hexdigest() for x in (a, b))
    etc = tmp_path / "etc"
    (etc / "releases" / "0002").mkdir(parents=True)
    (etc / "releases" / "0002" / "node-plan.json").write_bytes(_rendered_node_plan(sa, tmp_path))
    (etc / "current").symlink_to("releases/0002")
    lay = ServiceLayout(etc_root=str(etc), state_root=str(tmp_path))
    vocab_live.store(conn, lay, a, sa, {})
    vocab_live.store(conn, lay, b, sb, {})
    vocab_live.point(conn, lay, sb)
    assert vocab_live.follow_release(conn, lay) == sa
    assert vocab_live.read_state(conn, lay).problem() is None
    assert vocab_live.follow_release(conn, lay) is None  # already following
