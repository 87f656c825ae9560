"""Inputs a node would not accept are refused whole at load (exit 2 naming the field and what is allowed), and
the outputs that touch this machine or a node do not follow what they find there (issue 14)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from sparkdeploy import health, inventory, paths, plan, render
from sparkdeploy.cli import main
from sparkdeploy.errors import InputError, InventoryError

FIXTURES = Path(__file__).parent / "fixtures"
DIGEST = "sha256:" + "ab" * 32


def write_case(tmp_path: Path, inv: dict | None = None, prof: dict | None = None) -> Path:
    """The sim fixture inventory with its profile copied beside it; `inv`/`prof` are dotted-path overrides."""
    data = yaml.safe_load((FIXTURES / "inventory.sim.yaml").read_text())
    data["vocab"] = str(FIXTURES / "vocab-1k.txt")
    profile = yaml.safe_load((paths.profiles_dir() / "sim-tiny.yaml").read_text())
    for doc, changes in ((data, inv or {}), (profile, prof or {})):
        for dotted, value in changes.items():
            *parents, last = dotted.split(".")
            target = doc
            for key in parents:
                target = target[int(key)] if key.isdigit() else target.setdefault(key, {})
            target[int(last) if last.isdigit() else last] = value
    (tmp_path / "prof.yaml").write_text(yaml.safe_dump(profile))
    data["profile"] = "prof.yaml"
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("inv,prof,field,allowed", [
    ({}, {"env": {"GOOD": "1", "BAD\n": "x"}}, "env", "environment variable name"),
    ({}, {"env": {"X": "a\nEVIL=1"}}, "env.X", "control characters"),
    ({}, {"env": {"X": "a\x85EVIL=1"}}, "env.X", "control characters"),  # NEL ends a line for splitlines
    ({}, {"env": {"X": "a\u2028b"}}, "env.X", "control characters"),
    ({"nodes.0.hca": ["mlx5_0\n"]}, {}, "nodes[0].hca[0]", "RoCE device name"),
    ({"nodes.0.name": "node1\n"}, {}, "nodes[0].name", "control characters"),
    ({}, {"image.vllm_version": "0.32.0+cpu"}, "image.vllm_version", "no '+'"),
    ({}, {"image.vllm_version": "0.32.0\n"}, "image.vllm_version", "control characters"),
    ({"nodes.0.data_ip": "0.0.0.0"}, {}, "nodes[0].data_ip", "not 0.0.0.0, loopback"),
    ({"nodes.1.data_ip": "127.0.0.2"}, {}, "nodes[1].data_ip", "data network"),
    ({"nodes.0.data_ip": "255.255.255.255"}, {}, "nodes[0].data_ip", "broadcast"),
    ({}, {"model.host_dir": "/"}, "model.host_dir", "system directory"),
    ({}, {"model.host_dir": "//etc/"}, "model.host_dir", "system directory"),
    ({}, {"model.path": "/opt/sparkdeploy/vocab"}, "model.path", "/opt/sparkdeploy/vocab"),
    ({}, {"model.path": "/opt/sparkdeploy"}, "model.path", "draft vocabulary"),
    ({}, {"model.path": "/opt/sparkdeploy/vocab/m"}, "model.path", "draft vocabulary"),
    ({"nodes.1.name": "plan.json"}, {}, "nodes[1].name", "reserved"),
    ({"nodes.1.name": "image"}, {}, "nodes[1].name", "reserved"),
    ({}, {"image.base": "repo:tag@" + DIGEST + "\n", "image.local": False}, "image.base", "control characters"),
    ({}, {"image.base": "repo:tag", "image.local": False}, "image.base", "not pinned"),
])
def test_field_a_node_would_not_accept_exits_2_naming_it(tmp_path, capsys, inv, prof, field, allowed):
    path = write_case(tmp_path, inv, prof)
    with pytest.raises(InventoryError) as err:
        inventory.load(path)
    assert err.value.field == field and allowed in err.value.reason, str(err.value)
    assert main(["plan", "--inventory", str(path)]) == 2
    out = capsys.readouterr().err
    assert field in out and "Traceback" not in out


def test_a_profile_name_over_255_characters_exits_2(tmp_path, capsys):
    path = write_case(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["profile"] = "p" * 300
    path.write_text(yaml.safe_dump(data))
    assert main(["plan", "--inventory", str(path)]) == 2
    assert "profile: too long" in capsys.readouterr().err


@pytest.mark.parametrize("base", ["registry.example:5000/vllm/vllm-openai:v0.33.0@" + DIGEST,
                                  "vllm/vllm-openai@" + DIGEST, DIGEST])
def test_pinned_references_are_accepted_with_or_without_a_tag(tmp_path, base):
    inv = inventory.load(write_case(tmp_path, prof={"image.base": base, "image.local": False}))
    assert inv.image.base == base


def test_a_long_value_is_quoted_short(tmp_path):
    with pytest.raises(InventoryError) as err:
        inventory.load(write_case(tmp_path, {"nodes.0.netdev": "x" * 100_000}))
    assert len(str(err.value)) < 400


def test_health_on_a_node_with_nothing_deployed_says_so():
    rep = health.Report()
    exp = health.NodeExpect("node1", "head", "sparkdeploy-engine.service", "sparkdeploy-engine", None, 0, None,
                            (8000, 29500), ())
    snap = {"extra": {}, "docker": "27.0", "unit_enabled": "", "unit_active": "inactive", "container": "",
            "mem": "8000000000", "current": ""}
    health.check_node(rep, exp, snap, [])
    assert any(c.name == "container" and not c.ok and "does not exist" in c.reason for c in rep.checks)


def test_render_out_follows_no_link_already_in_the_directory(tmp_path):
    inv = inventory.load(write_case(tmp_path))
    p = plan.plan(inv)
    out = tmp_path / "out"
    (out / "node1" / "release").mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    victim.chmod(0o600)
    (out / "node1" / "release" / "launch.sh").symlink_to(victim)
    with pytest.raises(InputError, match="symbolic link"):
        render.write(p, out)
    assert victim.read_text() == "keep me\n" and (victim.stat().st_mode & 0o777) == 0o600
    assert not (out / "plan.json").exists()  # refused before anything was written
    (out / "node1" / "release" / "launch.sh").unlink()
    (out / "node2").symlink_to(tmp_path)  # a linked directory is refused too
    with pytest.raises(InputError, match="symbolic link"):
        render.write(p, out)
    (out / "node2").unlink()
    written = render.write(p, out)
    assert all(not w.is_symlink() and w.is_file() for w in written)
    assert os.access(out / "node1" / "release" / "launch.sh", os.X_OK)
