"""Inputs a node would not accept are refused whole at load (exit 2 naming the field and what is allowed), and
the outputs that touch this machine or a node do not follow what they find there (issue 14)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from sparkdeploy import paths, plan
from sparkdeploy.cli import main
from sparkdeploy.errors import InputError, InventoryError
from sparkdeploy.model import inventory
from sparkdeploy.ops import health
from sparkdeploy.plan import render

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


# ------------------------------------------------ hostile inputs of the verify report, section 3.4 (issue 33)
def _plan_exit(capsys, *args: str) -> tuple[int, str]:
    rc = main(["plan", *args])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err


@pytest.mark.parametrize("key", ["VLLM_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "OPENAI_API_KEY",
                                 "MY_SECRET_SAUCE", "db_password", "aws_secret_access_key"])
def test_a_secret_in_the_profile_env_exits_2_pointing_at_auth(tmp_path, capsys, key):
    path = write_case(tmp_path, prof={f"env.{key}": "sk-verify-not-a-real-key"})
    rc, err = _plan_exit(capsys, "--inventory", str(path))
    assert rc == 2 and f"env.{key}" in err and "auth.api_key_file" in err and "auth.hf_token_file" in err
    assert "sk-verify" not in err  # the message never repeats the value


def test_env_names_that_only_look_near_a_secret_still_plan(tmp_path):
    inv = inventory.load(write_case(tmp_path, prof={"env.VLLM_KEYS_DIR": "/x", "env.TOKENIZERS_PARALLELISM": "0"}))
    assert ("TOKENIZERS_PARALLELISM", "0") in inv.profile.env


@pytest.mark.parametrize("host_dir", ["/etc/ssh", "/var/lib", "/etc/sparkdeploy", "/usr/local", "/proc/self",
                                      "/boot/efi", "/root/.ssh", "/home/nvidia/.ssh/keys", "/var/lib/docker",
                                      "/var/lib/sparkdeploy", "/var/lib/sparkdeploy/models", "/srv/../etc/x"])
def test_a_host_dir_under_a_system_directory_is_refused(tmp_path, host_dir):
    with pytest.raises(InventoryError, match="system directory") as err:
        inventory.load(write_case(tmp_path, prof={"model.host_dir": host_dir}))
    assert err.value.field == "model.host_dir"


@pytest.mark.parametrize("host_dir", ["/var/lib/sparkdeploy/models/qwen", "/srv/models/qwen", "/home/nvidia/models",
                                      "/mnt/nvme/ckpt", "/opt/models/x"])
def test_a_host_dir_of_its_own_is_accepted(tmp_path, host_dir):
    assert inventory.load(write_case(tmp_path, prof={"model.host_dir": host_dir})).profile.host_dir == host_dir


@pytest.mark.parametrize("ref", ["~/prof.yaml", "$HOME/prof.yaml", "${HOME}/prof.yaml"])
def test_profile_and_vocab_expand_home_like_every_path(tmp_path, monkeypatch, ref):
    monkeypatch.setenv("HOME", str(tmp_path))
    path = write_case(tmp_path)
    data = yaml.safe_load(path.read_text())
    (tmp_path / "vocab.txt").write_bytes((FIXTURES / "vocab-1k.txt").read_bytes())
    data["profile"], data["vocab"] = ref, ref.replace("prof.yaml", "vocab.txt")
    path.write_text(yaml.safe_dump(data))
    inv = inventory.load(path)
    assert inv.profile.file == str(tmp_path / "prof.yaml") and inv.vocab.path == tmp_path / "vocab.txt"


@pytest.mark.timeout(20)
def test_a_huge_hca_list_is_refused_at_once(tmp_path, capsys):
    path = write_case(tmp_path, {"nodes.0.hca": [f"mlx5_{i}" for i in range(50_000)]})
    rc, err = _plan_exit(capsys, "--inventory", str(path))
    assert rc == 2 and "nodes[0].hca: 50000 entries" in err and "at most 16" in err


def test_nan_in_the_speculative_config_is_refused_not_written_as_json(tmp_path, capsys):
    path = write_case(tmp_path, prof={"speculative.x": float("nan")})
    rc, err = _plan_exit(capsys, "--inventory", str(path), "--json")
    assert rc == 2 and "speculative.x" in err and "nan" in err


@pytest.mark.timeout(20)  # a plain open() of a FIFO waits for a writer forever
@pytest.mark.parametrize("which, special", [(w, s) for w in ("inventory", "profile", "facts", "vocab")
                                            for s in ("fifo", "/dev/zero")])
def test_a_fifo_or_a_device_is_refused_without_blocking(tmp_path, capsys, which, special):
    path = write_case(tmp_path)
    if special == "fifo":
        special = str(tmp_path / "special.yaml")
        os.mkfifo(special)
    args = ["--inventory", special if which == "inventory" else str(path)]
    if which == "facts":
        args += ["--facts", special]
    elif which in ("profile", "vocab"):
        data = yaml.safe_load(path.read_text())
        data[which] = special
        path.write_text(yaml.safe_dump(data))
    rc, err = _plan_exit(capsys, *args)
    assert rc == 2 and f"{special}: " in err and "not a regular file" in err, err


@pytest.mark.timeout(20)
def test_vocab_validate_refuses_a_fifo_tokenizer_and_a_long_name(tmp_path, capsys):
    fifo = tmp_path / "tok.json"
    os.mkfifo(fifo)
    assert main(["vocab", "validate", str(FIXTURES / "vocab-1k.txt"), "-t", str(fifo)]) == 2
    assert main(["vocab", "validate", str(tmp_path / ("n" * 5000 + ".txt")), "-t", "qwen3.5"]) == 2
    err = capsys.readouterr().err
    assert "File name too long" in err and "Traceback" not in err


def _facts(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "facts.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


_NODE2 = "spark2: {mem_total_gib: 119.7, gpu_name: NVIDIA GB10}"


@pytest.mark.parametrize("facts, field, expect", [
    (f"nodes: {{spark1: {{mem_total_gib: .nan}}, {_NODE2}}}", "nodes.spark1.mem_total_gib", "at most"),
    (f"nodes: {{spark1: {{mem_total_gib: .inf}}, {_NODE2}}}", "nodes.spark1.mem_total_gib", "at most"),
    (f"nodes: {{spark1: {{mem_total_gib: 1e300}}, {_NODE2}}}", "nodes.spark1.mem_total_gib", "at most"),
    (f"nodes: {{spark1: {{mem_total_gib: 100, netdevs: [a]}}, {_NODE2}}}", "nodes.spark1.netdevs", "a mapping"),
    (f"nodes: {{spark1: {{mem_total_gib: 100, roce: {{r: {{port: x}}}}}}, {_NODE2}}}", "nodes.spark1.roce.r.port",
     "an integer"),
    (f"nodes: {{spark1: {{mem_total_gib: 100, units: [{{a: 1}}]}}, {_NODE2}}}", "nodes.spark1.units", "unit names"),
    (f"nodes: {{spark1: {{mem_total_gib: 100, has_gpu: 'no'}}, {_NODE2}}}", "nodes.spark1.has_gpu", "true or false"),
    ("nodes:\n  spark1: {mem_total_gib: 119.7, mem_available_gib: 116.0, gpu_name: NVIDIA GB10, "
     "mem_available_gib: 100.0}\n  " + _NODE2 + "\n", None, "'mem_available_gib' given twice"),
    (b"nodes: {spark1: {gpu_name: \xff}}\n", None, "not UTF-8"),
    ("a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n" for p, c in zip("abcdefgh", "bcdefghi"))
     + "nodes: {spark1: {mem_total_gib: 100, units: *i}}\n", None, "expands to more than"),
])
def test_a_bad_facts_file_exits_2_naming_the_field(tmp_path, capsys, facts, field, expect):
    path = write_case(tmp_path)
    rc, err = _plan_exit(capsys, "--inventory", str(path), "--facts", str(_facts(tmp_path, facts)))
    assert rc == 2 and expect in err, err
    assert field is None or f"facts.yaml: {field}" in err


def test_render_out_on_a_file_or_a_device_exits_2(tmp_path, capsys):
    path = write_case(tmp_path)
    a_file = tmp_path / "a-file"
    a_file.write_text("keep\n")
    for out in ("/dev/null", str(a_file), str(a_file / "sub"), str(tmp_path / ("n" * 5000))):
        assert main(["render", "--inventory", str(path), "--out", out]) == 2, out
        err = capsys.readouterr().err
        assert "Traceback" not in err and "--out" in err
    assert a_file.read_text() == "keep\n"


def test_an_empty_inventory_option_exits_2_instead_of_planning_the_default(capsys):
    assert main(["plan", "--nodes", "2", "-i", ""]) == 2
    assert "empty; name the inventory file" in capsys.readouterr().err
