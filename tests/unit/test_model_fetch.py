"""`weights fetch` without a hub: the repo id / revision / host_dir checks, the container argv (the token never in
it), the helper's answers mapped to errors, the node-side placing on a hand-built HF cache, and `up`'s refusal
when model.host_dir holds no checkpoint on the head."""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sparkdeploy import paths
from sparkdeploy.errors import InputError, InventoryError, RemoteError
from sparkdeploy.model import inventory as I
from sparkdeploy.ops import model_fetch as mf
from sparkdeploy.remote.connection import Target
from sparkdeploy.remote.ssh import LocalConn
from sparkdeploy.steps import deploy as D
from sparkdeploy.steps.deploy import Context, Options
from tests.support import hf_cache

FIXTURE = paths.repo_root() / "tests/unit/fixtures/inventory.sim.yaml"
REPO = "org-x/tiny-model"


def _inventory(tmp: Path, **model) -> I.Inventory:
    """The sim fixture inventory with its profile's model block changed (e.g. id, host_dir)."""
    profile = yaml.safe_load((paths.profiles_dir() / "sim-tiny.yaml").read_text())
    profile["model"].update(model)
    (tmp / "profile.yaml").write_text(yaml.safe_dump(profile))
    inv = yaml.safe_load(FIXTURE.read_text())
    inv.update(profile="profile.yaml", vocab=str(FIXTURE.parent / inv["vocab"]))
    (tmp / "inventory.yaml").write_text(yaml.safe_dump(inv))
    return I.load(tmp / "inventory.yaml")


def _spec(tmp: Path, token: str | None = None, offline: bool = False) -> mf.FetchSpec:
    return mf.FetchSpec(REPO, "main", str(tmp / "models"), "img@sha256:" + "0" * 64, "/opt/venv/bin/python", offline,
                        str(tmp / "hf"), str(tmp / "profile.yaml"), token)


@pytest.mark.parametrize("model, field", [
    ({"id": "not a repo"}, "model.id"),
    ({"id": "org/name/extra"}, "model.id"),
    ({"id": REPO}, "model.host_dir"),  # the sim profile bakes the model into the image
])
def test_spec_refuses_what_cannot_be_fetched_naming_the_field(tmp_path, model, field):
    inv = _inventory(tmp_path, **model)
    with pytest.raises(InventoryError) as exc:
        mf.spec_of(inv, revision="main", offline=False)
    assert exc.value.field == field and exc.value.file.endswith("profile.yaml")


def test_a_token_file_others_can_read_exits_2_naming_auth_hf_token_file(tmp_path):
    _inventory(tmp_path, id=REPO, host_dir="/srv/models/tiny")
    token = tmp_path / "hf-token"
    token.write_text("hf_abc\n")
    token.chmod(0o644)
    raw = yaml.safe_load((tmp_path / "inventory.yaml").read_text())
    (tmp_path / "inventory.yaml").write_text(yaml.safe_dump({**raw, "auth": {"hf_token_file": str(token)}}))
    with pytest.raises(InventoryError) as exc:
        mf.spec_of(I.load(tmp_path / "inventory.yaml"), revision="main", offline=False)
    assert exc.value.field == "auth.hf_token_file" and "chmod 600" in str(exc.value)


@pytest.mark.parametrize("revision", ["../main", "-rf", "a b", ""])
def test_spec_refuses_a_revision_that_is_no_ref_name(tmp_path, revision):
    inv = _inventory(tmp_path, id=REPO, host_dir="/srv/models/tiny")
    with pytest.raises(InputError, match="--revision"):
        mf.spec_of(inv, revision=revision, offline=False)


def test_offline_from_the_flag_or_the_callers_environment():
    assert mf.is_offline(True, {})
    assert mf.is_offline(False, {"HF_HUB_OFFLINE": "1"}) and mf.is_offline(False, {"HF_HUB_OFFLINE": "True"})
    assert not mf.is_offline(False, {}) and not mf.is_offline(False, {"HF_HUB_OFFLINE": "0"})


def test_the_token_reaches_the_container_only_through_an_env_file(tmp_path):
    spec = _spec(tmp_path, token="hf_secret_value")
    argv = mf.container_argv(spec, "/var/lib/sparkdeploy/fetch/t.env")
    assert not any("hf_secret_value" in a for a in argv) and "hf_secret_value" not in repr(spec)
    assert argv[argv.index("--env-file") + 1] == "/var/lib/sparkdeploy/fetch/t.env"
    assert f"{spec.hf_home}:{mf.CONTAINER_HF_HOME}" in argv and "HF_HUB_OFFLINE=0" in argv
    assert argv[argv.index("--entrypoint") + 1: argv.index("--entrypoint") + 3] == ["/opt/venv/bin/python", spec.image]
    assert argv[-5:] == ["download", f"{mf.CONTAINER_HF_HOME}/hub", REPO, "main", "0"]
    assert "--env-file" not in mf.container_argv(_spec(tmp_path), None)


def test_helper_lines_and_errors():
    assert mf.parse_line('{"commit": "abc"}') == {"commit": "abc"}
    assert mf.parse_line("Unable to find image 'x' locally") is None and mf.parse_line("{broken") is None
    spec = _spec(Path("/t"), offline=True)
    not_cached = mf.download_error(spec, {"error": "not_cached", "message": "m"}, "spark1")
    assert isinstance(not_cached, InventoryError) and not_cached.field == "model.id" and "spark1" in str(not_cached)
    assert mf.download_error(spec, {"error": "gated", "message": "m"}, "spark1").field == "model.id"
    assert isinstance(mf.download_error(spec, {"error": "revision", "message": "m"}, "spark1"), InputError)
    assert isinstance(mf.download_error(spec, {"error": "other", "message": "m"}, "spark1"), RemoteError)


def _place(snapshot: Path, dest: Path, dry_run: bool = False) -> dict:
    done = subprocess.run([sys.executable, "-c", mf.HELPER_SOURCE, "place", str(snapshot), str(dest),
                           str(int(dry_run))], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def test_place_links_the_snapshot_then_has_nothing_to_do(tmp_path):
    files = hf_cache.tiny_model_files()
    commit = hf_cache.build(tmp_path / "hf" / "hub", REPO, files)
    snapshot = Path(_spec(tmp_path).snapshot_dir(commit))  # where huggingface_hub keeps it, as the kit reads it
    dest = tmp_path / "models"
    assert _place(snapshot, dest, dry_run=True)["linked"] == 3 and not dest.exists()
    first = _place(snapshot, dest)
    assert (first["files"], first["linked"], first["present"]) == (3, 3, 0)
    assert first["bytes"] == sum(len(v) for v in files.values())
    for rel, data in files.items():
        assert (dest / rel).read_bytes() == data and not (dest / rel).is_symlink()
        assert os.path.samefile(dest / rel, (snapshot / rel).resolve())
    again = _place(snapshot, dest)
    assert (again["linked"], again["copied"], again["present"]) == (0, 0, 3)
    assert sorted(p.name for p in dest.rglob("*") if p.is_file()) == sorted(Path(r).name for r in files)


def _head_as_this_machine(c: Context) -> None:
    c.pool.conns[c.head] = LocalConn(Target(c.head, "localhost", user=getpass.getuser(), local=True))


def test_up_refuses_a_host_dir_without_a_checkpoint_on_the_head(tmp_path):
    host_dir = tmp_path / "ckpt"
    host_dir.mkdir()
    c = Context(_inventory(tmp_path, id=REPO, host_dir=str(host_dir)), Options(nodes=2))
    _head_as_this_machine(c)
    with pytest.raises(InventoryError) as exc:
        c.head_checkpoint()
    assert exc.value.field == "model.host_dir" and exc.value.file.endswith("profile.yaml")
    assert "weights fetch" in str(exc.value) and "weights sync" in str(exc.value) and str(host_dir) in str(exc.value)
    (host_dir / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    assert c.head_checkpoint().format == "bf16"


def test_up_lets_bad_input_through_to_the_cli(tmp_path, monkeypatch):
    """An InputError before anything changed leaves `up` as itself (exit 2 naming the field), not as a failed step."""
    c = Context(_inventory(tmp_path, id=REPO, host_dir=str(tmp_path / "none")), Options(nodes=2))
    for step in ("connect", "scan"):
        monkeypatch.setattr(c, step, lambda *a, **k: None)

    def refuse(out):
        c.head_checkpoint()

    _head_as_this_machine(c)
    monkeypatch.setattr(c, "make_plan", refuse)
    with pytest.raises(InventoryError, match="model.host_dir"):
        D.up(c)


def test_an_endpoint_is_passed_to_the_container_and_checked(tmp_path):
    inv = _inventory(tmp_path, id=REPO, host_dir="/srv/models/tiny")
    spec = mf.spec_of(inv, revision="main", offline=False, endpoint="https://hf-mirror.example/x")
    assert "HF_ENDPOINT=https://hf-mirror.example/x" in mf.container_argv(spec, None)
    with pytest.raises(InputError, match="HF_ENDPOINT"):
        mf.spec_of(inv, revision="main", offline=False, endpoint="file:///etc $(x)")
    with pytest.raises(InputError, match="--hf-home"):
        mf.spec_of(inv, revision="main", offline=False, hf_home="/srv/hf:/etc")
