"""weights: manifest diff, rsync argv, progress parsing, the node helper run locally, the memory guard."""

from __future__ import annotations

import json
import os
import shlex
import subprocess

import pytest

from sparkdeploy.node.facts import NodeFacts
from sparkdeploy.ops import weights as w
from sparkdeploy.plan import memory
from sparkdeploy.remote.connection import Target
from sparkdeploy.remote.ssh import LocalConn
from sparkdeploy.verdict import Status

GIB = 1 << 30


def test_diff_manifests():
    src = w.Manifest({"a": (1, "x"), "b": (2, "y"), "c": (3, "z")})
    dst = w.Manifest({"a": (1, "x"), "b": (2, "DIFFERENT"), "old": (9, "q")})
    assert w.diff_manifests(src, dst) == (["b", "c"], ["old"])
    assert w.diff_manifests(src, src) == ([], [])


def test_rsync_argv_is_quoted_and_pushes_to_the_data_ip():
    ssh = w.ssh_command("/tmp/sparkdeploy-sync-x/key", "/tmp/sparkdeploy-sync-x/known_hosts")
    argv = w.rsync_argv("/srv/models/q wen", "nvidia", "192.168.177.12", "/srv/models/q wen", ssh)
    assert argv[-1] == "nvidia@192.168.177.12:/srv/models/q wen/" and argv[-2] == "/srv/models/q wen/"
    e = shlex.split(argv[argv.index("-e") + 1])
    assert "StrictHostKeyChecking=yes" in e and w.SSH_CIPHER in e and "--whole-file" in argv
    assert "--files-from=-" in argv and "--from0" in argv


def test_split_streams_balances_bytes():
    groups = w.split_streams({"a": 10, "b": 9, "c": 2, "d": 1}, 2)
    assert sorted(groups) == [["a", "d"], ["b", "c"]]
    assert w.split_streams({"a": 1}, 4) == [["a"]]
    assert w.split_streams({"a": 1, "b": 1}, 1) == [["a", "b"]]


def test_parse_progress():
    text = "\r     32,768   0%    0.00kB/s    0:00:00\r 104,857,600  35%  210.00MB/s    0:00:01\r"
    assert w.parse_progress(text) == (104857600, 35, "210.00MB/s")
    assert w.parse_progress("sending incremental file list\n") is None


@pytest.fixture
def local():
    return LocalConn(Target("here", "localhost", local=True))


def test_helper_manifest_cache_seed_and_evict(tmp_path, local, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    d = tmp_path / "ckpt"
    (d / "sub").mkdir(parents=True)
    (d / "model-00001.safetensors").write_bytes(os.urandom(3 << 20))
    (d / "sub" / "config.json").write_text("{}")
    (d / ".model-00002.safetensors.a1B2c3").write_bytes(b"in flight")  # rsync temp: not part of the checkpoint
    m1 = w.manifest(local, str(d))
    assert set(m1.files) == {"model-00001.safetensors", "sub/config.json"} and m1.hashed == m1.bytes
    m2 = w.manifest(local, str(d))
    assert m2.hashed == 0 and m2.files == m1.files  # cached by size/mtime/inode
    # a file changed in place (same size, new mtime) is hashed again
    (d / "sub" / "config.json").write_text("[]")
    m3 = w.manifest(local, str(d))
    assert m3.hashed == 2 and m3.files["sub/config.json"] != m1.files["sub/config.json"]
    ev = w.evict(local, str(d))
    assert ev["files"] == 2 and ev["bytes"] == m3.bytes and ev["mem_available_after"] > 0
    if ev["cached_after"] is not None:
        assert ev["cached_after"] <= 8192
    # seed: record given hashes for files whose size matches; next manifest reads nothing
    other = tmp_path / "copy"
    other.mkdir()
    (other / "f").write_bytes(b"12345")
    assert w.helper(local, "seed", str(other), input=json.dumps({"f": [5, "feed"], "g": [1, "x"]}).encode()) == {"seeded": 1}
    m4 = w.manifest(local, str(other))
    assert m4.files == {"f": (5, "feed")} and m4.hashed == 0
    assert w.manifest(local, str(tmp_path / "nope")).exists is False


def test_evict_and_guard_over_local_connections(tmp_path, monkeypatch):
    from pathlib import Path

    from sparkdeploy import plan as plan_mod
    from sparkdeploy.model import inventory
    from sparkdeploy.remote.ssh import Pool

    monkeypatch.setenv("HOME", str(tmp_path))
    inv = inventory.load(Path(__file__).parent / "fixtures" / "inventory.sim.yaml")
    pl = plan_mod.plan(inv)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "w.bin").write_bytes(b"x" * 10000)
    with Pool([Target(n.name, "localhost", local=True) for n in inv.nodes]) as pool:
        pool.open()
        out, guards = w.evict_and_guard(pool, pl, str(tmp_path / "ckpt"))
        assert out["node1"]["files"] == 1 and out["node2"]["mem_free_after"] > 0
        assert [g.node for g in guards] == ["node1", "node2"] and all(g.check == "memory-guard" for g in guards)
        out, _ = w.evict_and_guard(pool, pl, None)
        assert out["node1"]["files"] == 0 and out["node1"]["mem_available_after"] > 0


def test_helper_unauthorize(tmp_path, local, monkeypatch):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    ak = home / ".ssh" / "authorized_keys"
    ak.write_text("ssh-ed25519 AAAA user@laptop\nfrom=\"10.0.0.1\",restrict ssh-ed25519 BBBB sparkdeploy-weights-abc\n")
    ak.chmod(0o600)
    monkeypatch.setenv("HOME", str(home))
    assert w.helper(local, "unauthorize", "sparkdeploy-weights-abc") == {"removed": 1}
    assert ak.read_text() == "ssh-ed25519 AAAA user@laptop\n" and (ak.stat().st_mode & 0o777) == 0o600


def test_helper_authorize_then_unauthorize_round_trip(tmp_path, local, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    private, public = w.one_time_key("sparkdeploy-weights-xyz")
    line = f'from="10.0.0.1",restrict {public}\n'
    ckpt = tmp_path / "ckpt"
    got = w.helper(local, "authorize", str(ckpt), input=line.encode())
    assert got["files"] == {} and ckpt.is_dir()  # created and listed in the same round trip
    ak = home / ".ssh" / "authorized_keys"
    assert ak.read_text() == line and (ak.stat().st_mode & 0o777) == 0o600
    assert ((home / ".ssh").stat().st_mode & 0o077) == 0
    # the private half is a key OpenSSH reads, and its public half is the line we authorized
    keyfile = tmp_path / "key"
    keyfile.write_bytes(private)
    keyfile.chmod(0o600)
    derived = subprocess.run(["ssh-keygen", "-y", "-f", str(keyfile)], capture_output=True, text=True, check=True)
    assert derived.stdout.split()[:2] == public.split()[:2] and public.startswith("ssh-ed25519 ")
    assert w.helper(local, "unauthorize", "sparkdeploy-weights-xyz") == {"removed": 1}
    assert ak.read_text() == ""


def test_guard_uses_the_plan_budget():
    facts = NodeFacts("spark1", int(119.7 * GIB), int(116 * GIB), True, "NVIDIA GB10", "580.95.05")
    b = memory.budget(facts, reserve_gib=28, weights_gib=30, activation_gib=4, kv_bytes_per_token=50000)
    ok = w.guard("spark1", 116 * GIB, b)
    assert ok.status in (Status.OK, Status.WARN)
    # 40 GiB of page cache from the rsync still resident: MemAvailable did not drop, but if other memory is held...
    low = w.guard("spark1", int((b.engine_gib + b.reserve_gib - 1) * GIB), b)
    assert low.status is Status.FAILED and "reserve 28.0" in low.reason
    # MemAvailable fine but MemFree short (other page cache): CUDA on GB10 would see too little
    cached = w.guard("spark1", 116 * GIB, b, mem_free=int(b.engine_gib * GIB) - GIB)
    assert cached.status is Status.WARN and "drop_caches" in cached.fix
    with pytest.raises(w.MemoryGuardError, match="refusing to start: spark1"):
        w.enforce([ok, low])
    w.enforce([ok])


def test_auto_streams_one_per_four_cores_capped():
    assert [w.auto_streams(c) for c in (1, 2, 4, 7, 8, 16, 20, 128)] == [1, 1, 1, 1, 2, 4, 4, 4]
