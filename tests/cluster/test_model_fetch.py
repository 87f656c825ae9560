"""`weights fetch` for real: huggingface_hub's snapshot_download in a container of the sim engine image (the
profile's pinned base), offline against a hand-built HF cache, and online against a stand-in hub on loopback
(tests/support/fake_hub.py, HF_ENDPOINT): the files land at model.host_dir as hard links. No test reaches a hub.

The head is this machine (root, LocalConn): the same docker, the same node-side helpers as on a Spark, without
spending a sim cluster. ~35-50 s with the engine image cached (each fetch starts one container).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from sparkdeploy import paths
from sparkdeploy.cli import main
from sparkdeploy.model import inventory as inventory_mod
from sparkdeploy.ops import model_fetch as mf
from sparkdeploy.remote.connection import Target
from sparkdeploy.remote.ssh import LocalConn
from tests.support import hf_cache
from tests.support.fake_hub import FakeHub

REPO = "sparkdeploy-test/tiny-fetch"


def _inventory(tmp: Path, repo_id: str, host_dir: Path, token_file: Path | None = None) -> Path:
    profile = yaml.safe_load((paths.profiles_dir() / "sim-tiny.yaml").read_text())
    profile["model"].update(id=repo_id, host_dir=str(host_dir))
    profile["parallel"]["tp"] = 1
    (tmp / "profile.yaml").write_text(yaml.safe_dump(profile))
    inv = {"cluster": "fetch", "profile": "profile.yaml",
           "nodes": [{"name": "head", "role": "head", "ssh": {"host": "localhost", "user": "root"},
                      "data_ip": "10.99.0.1", "netdev": "eth0", "hca": [], "gpu": "none"}],
           "image": {"repository": "sparkdeploy/serving-sim"},
           "patches": {"shortlist": False, "skinny_gemm": False, "fp8_gdn": False, "prefix_align": False},
           "ports": {"api": 8000, "master": 29500}, "memory": {"reserve_gib": 4}}
    if token_file:
        inv["auth"] = {"hf_token_file": str(token_file)}
    path = tmp / f"inventory-{repo_id.split('/')[1]}.yaml"
    path.write_text(yaml.safe_dump(inv))
    return path


def _fetch(inventory: Path, hf_home: Path, capsys, *extra: str) -> tuple[int, dict | None, str]:
    rc = main(["weights", "fetch", "--inventory", str(inventory), "--offline", "--hf-home", str(hf_home), "--json",
               *extra])
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if rc == 0 else None), err


def test_fetch_offline_from_the_cache_then_noop_and_missing_repo_exits_2(sim_engine_image, tmp_path, capsys,
                                                                        monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # as --offline: nothing is looked up anywhere
    hf_home, host_dir = tmp_path / "hf", tmp_path / "models" / "tiny"
    files = hf_cache.tiny_model_files()
    commit = hf_cache.build(hf_home / "hub", REPO, files)
    inventory = _inventory(tmp_path, REPO, host_dir)

    rc, planned, err = _fetch(inventory, hf_home, capsys, "--dry-run")
    assert rc == 0, err
    assert (planned["commit"], planned["linked"]) == (commit, 3) and not host_dir.exists()

    rc, first, err = _fetch(inventory, hf_home, capsys)
    assert rc == 0, err
    assert (first["commit"], first["files"], first["linked"], first["present"]) == (commit, 3, 3, 0)
    blobs = hf_home / "hub" / f"models--{REPO.replace('/', '--')}" / "blobs"
    for rel, data in files.items():
        placed = host_dir / rel
        assert placed.is_file() and not placed.is_symlink() and placed.read_bytes() == data
        assert os.path.samefile(placed, next(b for b in blobs.iterdir() if b.read_bytes() == data))

    token = tmp_path / "hf-token"
    token.write_text("hf_FETCHTESTSECRET\n")
    token.chmod(0o600)
    with_token = _inventory(tmp_path, REPO, host_dir, token_file=token)
    rc, second, err = _fetch(with_token, hf_home, capsys)
    assert rc == 0, err
    assert second["token_used"] is True and not first["token_used"]  # the container got it, through its env file
    assert "FETCHTESTSECRET" not in err + json.dumps(second)
    assert not list(Path(mf.TOKEN_DIR).glob("hf-token-*.env"))  # removed once the container exited
    assert (second["already_there"], second["linked"], second["copied"], second["present"]) == (True, 0, 0, 3)
    assert "already there" in err

    (host_dir / "model.safetensors").unlink()  # a different file in its place (not written through the link)
    (host_dir / "model.safetensors").write_bytes(b"torn")
    rc, third, err = _fetch(inventory, hf_home, capsys)
    assert rc == 0, err
    assert (third["linked"], third["present"]) == (1, 2)
    assert (host_dir / "model.safetensors").read_bytes() == files["model.safetensors"]

    missing = _inventory(tmp_path, "sparkdeploy-test/not-cached", tmp_path / "models" / "other")
    rc, planned, err = _fetch(missing, hf_home, capsys, "--dry-run")
    assert rc == 0 and planned["commit"] is None and "a fetch would download it" in err, err
    rc, _, err = _fetch(missing, hf_home, capsys)
    assert rc == 2, err
    assert "model.id" in err and "sparkdeploy-test/not-cached@main is not in" in err and "profile.yaml" in err
    assert not (tmp_path / "models" / "other").exists()


def test_fetch_online_keeps_what_an_interrupted_run_fetched_with_progress_and_the_token(sim_engine_image, tmp_path,
                                                                                        monkeypatch):
    files = {**hf_cache.tiny_model_files(), "model-00002.safetensors": os.urandom(3 << 20)}
    commit = "c" * 40
    hf_home, host_dir = tmp_path / "hf", tmp_path / "models" / "tiny"
    earlier = {"model.safetensors": files["model.safetensors"]}  # what an interrupted run had completed
    hf_cache.build(hf_home / "hub", REPO, earlier, commit=commit)
    token = tmp_path / "hf-token"
    token.write_text("hf_FETCHTESTSECRET\n")
    token.chmod(0o600)
    inv = inventory_mod.load(_inventory(tmp_path, REPO, host_dir, token_file=token))
    head = LocalConn(Target("head", "localhost", user="root", local=True))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with FakeHub(REPO, files, commit, token="hf_FETCHTESTSECRET") as hub:
        spec = mf.spec_of(inv, revision="main", offline=False, hf_home=str(hf_home), endpoint=hub.url)
        events = []
        res = mf.fetch(head, spec, progress=events.append)
        assert sorted(hub.served) == sorted(set(files) - set(earlier))  # the completed file is not fetched again
        assert all(auth for method, path, auth in hub.requests if "/resolve/" in path)
        again = mf.fetch(head, spec)
        assert again.already_there and sorted(hub.served) == sorted(set(files) - set(earlier))
        assert sum(hub.served.values()) == sum(len(d) for f, d in files.items() if f not in earlier)
    assert (res.commit, res.files, res.linked, res.token_used) == (commit, 4, 4, True)
    for rel, data in files.items():
        assert (host_dir / rel).read_bytes() == data
    done = [e for e in events if e.get("unit") == "B" and e["total"] and e["n"] == e["total"]]
    assert done and max(e["total"] for e in done) >= len(files["model-00002.safetensors"]), events
