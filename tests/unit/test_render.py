"""render(): golden artifacts, deterministic bytes, per-node isolation, and quoting that no value can escape.

Regenerate the golden files after an intended change with:
    SPARKDEPLOY_UPDATE_GOLDEN=1 python3 -m pytest tests/unit/test_render.py -k golden
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkdeploy import paths, plan
from sparkdeploy.cli import main
from sparkdeploy.errors import InventoryError
from sparkdeploy.model import inventory
from sparkdeploy.model.facts_file import load_facts_file
from sparkdeploy.plan import render

HERE = Path(__file__).parent
FIXTURES = HERE / "fixtures"
GOLDEN = HERE / "golden"
COMMIT = "0" * 40


def _plan(inv_path: Path, nodes=None, facts_path: Path | None = None) -> plan.Plan:
    given_facts = load_facts_file(facts_path) if facts_path else None
    return plan.plan(inventory.load(inv_path), given_facts, nodes, git_commit=COMMIT, overlays_digest="test")


GOLDEN_CASES = {
    "pair": lambda: _plan(paths.default_inventory(), 2, FIXTURES / "facts.pair.yaml"),
    "single": lambda: _plan(paths.default_inventory(), 1),
    "sim": lambda: _plan(FIXTURES / "inventory.sim.yaml"),
}


def _normalized(files: dict[str, bytes]) -> dict[str, bytes]:
    root = str(paths.repo_root()).encode()
    return {rel: data.replace(root, b"$ROOT") for rel, data in files.items()}


@pytest.mark.parametrize("case", sorted(GOLDEN_CASES))
def test_golden(case):
    files = _normalized(render.render(GOLDEN_CASES[case]()))
    base = GOLDEN / case
    if os.environ.get("SPARKDEPLOY_UPDATE_GOLDEN"):
        for rel, data in files.items():
            (base / rel).parent.mkdir(parents=True, exist_ok=True)
            (base / rel).write_bytes(data)
    on_disk = {p.relative_to(base).as_posix(): p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()}
    assert sorted(on_disk) == sorted(files), "file set changed (SPARKDEPLOY_UPDATE_GOLDEN=1 to accept)"
    for rel, data in files.items():
        assert data == on_disk[rel], f"{case}/{rel} differs (SPARKDEPLOY_UPDATE_GOLDEN=1 to accept)"


def test_render_writes_every_artifact_for_both_nodes(tmp_path):
    assert main(["render", "--out", str(tmp_path)]) == 0
    for node in ("spark1", "spark2"):
        for rel in ("release/engine.env", "release/launch.sh", "release/node-plan.json", "unit/sparkdeploy-engine.service"):
            assert (tmp_path / node / rel).is_file()
        assert os.access(tmp_path / node / "release/launch.sh", os.X_OK)
        subprocess.run(["bash", "-n", str(tmp_path / node / "release/launch.sh")], check=True)
    assert (tmp_path / "image/Dockerfile").read_text().startswith("# Rendered by sparkdeploy")


def test_render_is_deterministic():
    p = GOLDEN_CASES["pair"]()
    assert render.render(p) == render.render(GOLDEN_CASES["pair"]())


def test_dockerfile_has_provenance_and_the_overlay_check():
    text = render.render(GOLDEN_CASES["pair"]())["image/Dockerfile"].decode()
    assert text.splitlines()[3].startswith("FROM nvcr.io/nvidia/vllm@sha256:")
    assert "--no-deps --no-index" in text and "-m spark_overlays check" in text
    assert "vocab/current.txt" not in text and "vocab-sha256" not in text  # the list is runtime data
    for label in ("org.opencontainers.image.revision=\"" + COMMIT, "io.sparkdeploy.vllm-version=\"0.34.0\"",
                  "io.sparkdeploy.patches=", "org.opencontainers.image.base.digest="):
        assert label in text


def test_unit_is_supervised_foreground_with_backoff_and_start_limit():
    files = render.render(GOLDEN_CASES["pair"]())
    unit = files["spark1/unit/sparkdeploy-engine.service"].decode()
    for line in ("After=docker.service network-online.target", "Requires=docker.service", "Restart=always",
                 "ExecStart=/etc/sparkdeploy/current/launch.sh", "StartLimitBurst=5", "RestartMaxDelaySec=300"):
        assert line in unit.splitlines()
    launch = files["spark1/release/launch.sh"].decode()
    run = launch[launch.index("exec docker run"):]
    assert " -d " not in run and "--rm" not in run and "--restart" not in run
    assert "--init" in run and "--stop-timeout 30" in run


def test_headless_rank_is_killed_after_a_short_grace_and_that_counts_as_a_stop():
    files = render.render(GOLDEN_CASES["pair"]())
    head = files["spark1/unit/sparkdeploy-engine.service"].decode().splitlines()
    worker = files["spark2/unit/sparkdeploy-engine.service"].decode().splitlines()
    assert "ExecStop=/usr/bin/docker stop --time 30 sparkdeploy-engine" in head and "SuccessExitStatus=137" not in head
    assert "ExecStop=/usr/bin/docker stop --time 2 sparkdeploy-engine" in worker and "SuccessExitStatus=137" in worker
    launch = files["spark2/release/launch.sh"].decode()
    assert "--stop-timeout 2" in launch[launch.index("exec docker run"):]


# ----------------------------------------------------------------------------------- per-node isolation
def _env_file(data: bytes) -> dict[str, str]:
    """As docker's --env-file reads it: lines end at "\n" only (str.splitlines would also split a value at
    U+0085 or U+2028, which docker keeps in the value)."""
    out = {}
    for line in data.decode().split("\n"):
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key] = value
    return out


def test_per_node_values_reach_only_their_node():
    p = GOLDEN_CASES["pair"]()
    files = render.render(p)
    env1, env2 = (_env_file(files[f"{n}/release/engine.env"]) for n in ("spark1", "spark2"))
    assert env1["NCCL_IB_GID_INDEX"] == "3" and env2["NCCL_IB_GID_INDEX"] == "5"
    assert env1["VLLM_HOST_IP"] == "192.168.177.11" and env2["VLLM_HOST_IP"] == "192.168.177.12"
    for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "UCX_NET_DEVICES"):
        assert env1[var] == "enp1s0f1np1" and env2[var] == "enP2p1s0f1np1"
    assert env1["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1" and env2["NCCL_IB_HCA"] == "roceP2p1s0f1,rocep1s0f1"
    text1 = b"".join(data for rel, data in files.items() if rel.startswith("spark1/") and rel.endswith((".env", ".sh")))
    text2 = b"".join(data for rel, data in files.items() if rel.startswith("spark2/") and rel.endswith((".env", ".sh")))
    assert b"enP2p1s0f1np1" not in text1 and b"192.168.177.12" not in text1
    assert b"=enp1s0f1np1" not in text2 and b"VLLM_HOST_IP=192.168.177.11" not in text2


def test_gid_index_left_unset_when_unknown_or_ambiguous(tmp_path):
    nominal = GOLDEN_CASES["single"]()
    assert all("NCCL_IB_GID_INDEX" not in n.env for n in nominal.nodes)
    raw = yaml.safe_load((FIXTURES / "facts.pair.yaml").read_text())
    raw["nodes"]["spark2"]["roce"]["rocep1s0f1"]["gid_index"] = 7  # twins disagree
    path = tmp_path / "facts.yaml"
    path.write_text(yaml.safe_dump(raw))
    p = _plan(paths.default_inventory(), 2, path)
    assert "NCCL_IB_GID_INDEX" not in p.node("spark2").env and p.node("spark1").env["NCCL_IB_GID_INDEX"] == "3"
    assert any("GID index differs" in note for note in p.notes)


# -------------------------------------------------------------------------------------------- quoting
_NASTY = st.sampled_from([
    "; touch PWNED", "$(touch PWNED)", "`touch PWNED`", "a'b", 'a"b', "a\nb", "a\\", "%n%%", "${HOME}", "a b",
    "&& touch PWNED", "| touch PWNED", "'$(touch PWNED)'", "\"; touch PWNED; \"", "*", "~", "-x", "#c", "\t", "é漢",
])
_TEXT = st.one_of(_NASTY, st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=24),
                  st.builds(lambda a, b: a + b, _NASTY, _NASTY))


def _write_case(tmp: Path, field: str, value: str) -> Path:
    profile = yaml.safe_load((paths.profiles_dir() / "sim-tiny.yaml").read_text())
    inv = yaml.safe_load((FIXTURES / "inventory.sim.yaml").read_text())
    inv["vocab"] = str(FIXTURES / "vocab-1k.txt")
    inv["profile"] = str(tmp / "profile.yaml")
    profile["speculative"]["method"] = "mtp"  # so the shortlist branch of launch.sh is rendered too
    if field == "model.path":
        profile["model"]["path"] = "/" + value
    elif field == "model.host_dir":
        profile["model"]["host_dir"] = "/" + value
    elif field == "model.served_name":
        profile["model"]["served_name"] = value
    elif field == "env":
        profile["env"]["SPARK_FUZZ"] = value
    elif field == "node.name":
        inv["nodes"][1]["name"] = value
    elif field == "node.netdev":
        inv["nodes"][1]["netdev"] = value
    elif field == "cluster":
        inv["cluster"] = value
    elif field == "ssh.key":
        inv["nodes"][1]["ssh"]["key"] = value
    (tmp / "profile.yaml").write_text(yaml.safe_dump(profile))
    (tmp / "inventory.yaml").write_text(yaml.safe_dump(inv))
    return tmp / "inventory.yaml"


_FAKE = """#!/bin/bash
shopt -s nullglob
calls=("$REC"/*)
printf '%s\\0' "${0##*/}" "$@" > "$REC/${#calls[@]}"
"""


def _run_launch(tmp: Path, script: bytes) -> list[list[str]]:
    """Run launch.sh with fake docker/python3 as the only external commands; return every invocation."""
    bin_dir, rec = tmp / "bin", tmp / "rec"
    bin_dir.mkdir(exist_ok=True)
    rec.mkdir(exist_ok=True)
    for name in ("docker", "python3"):
        (bin_dir / name).write_text(_FAKE)
        (bin_dir / name).chmod(0o755)
    launch = tmp / "launch.sh"
    launch.write_bytes(script.replace(b"/var/lib/sparkdeploy/vocab/current.txt", str(FIXTURES / "vocab-1k.txt").encode()))
    subprocess.run(["bash", "-n", str(launch)], check=True)
    env = {"PATH": str(bin_dir), "REC": str(rec), "HOME": str(tmp)}
    done = subprocess.run(["/bin/bash", str(launch)], cwd=tmp, env=env, capture_output=True, timeout=20)
    assert done.returncode == 0, done.stderr
    assert not (tmp / "PWNED").exists()
    calls = [(rec / name).read_bytes().split(b"\0")[:-1] for name in sorted(os.listdir(rec), key=int)]
    return [[c.decode() for c in call] for call in calls]


_UNIT_LINE = re.compile(r"^(#.*|\[(Unit|Service|Install)\]|[A-Za-z]+=.*|)$")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(["model.path", "model.host_dir", "model.served_name", "env", "node.name",
                              "node.netdev", "cluster", "ssh.key"]), value=_TEXT)
def test_no_value_becomes_a_command(tmp_path_factory, field, value):
    tmp = tmp_path_factory.mktemp("fuzz")
    inv_path = _write_case(tmp, field, value)
    try:
        inv = inventory.load(inv_path)
    except InventoryError as err:  # rejected: fine, as long as it names the field it rejected
        assert err.field and err.field.split(".")[-1].split("[")[0] in {
            "path", "host_dir", "served_name", "env", "SPARK_FUZZ", "name", "netdev", "cluster", "key"}, err
        return
    p = plan.plan(inv)
    files = render.render(p)
    worker = p.nodes[1]
    # launch.sh: only docker (rm, run) and python3 (page cache) run, with exactly the planned argv
    calls = _run_launch(tmp, files[f"{worker.name}/release/launch.sh"])
    assert calls[-1] == ["docker", *worker.docker_argv[1:]]
    assert [c[0] for c in calls] in (["docker", "docker"], ["docker", "python3", "docker"])
    if p.model_host_dir:
        assert ["python3", "-", p.model_host_dir] in calls
    # env file: literal KEY=VALUE lines, parsed back to exactly the planned env
    assert _env_file(files[f"{worker.name}/release/engine.env"]) == worker.env
    # unit: every line is a comment, a section or one Key=Value; the description parses back
    unit = files[f"{worker.name}/unit/sparkdeploy-engine.service"].decode()
    assert all(_UNIT_LINE.match(line) for line in unit.splitlines()), unit
    (description,) = [line[len("Description="):] for line in unit.splitlines() if line.startswith("Description=")]
    assert worker.name in description.replace("%%", "%")


@pytest.mark.parametrize("field,value", [
    ("model.host_dir", "srv/a'b $(touch PWNED); `touch PWNED` \"x\" \\"),
    ("model.path", "models/it's here && touch PWNED"),
    ("env", "'; touch PWNED; echo '"),
])
def test_nasty_but_valid_values_stay_data(tmp_path, field, value):
    inv = inventory.load(_write_case(tmp_path, field, value))  # accepted: these are legal paths / env values
    p = plan.plan(inv)
    files = render.render(p)
    calls = _run_launch(tmp_path, files["node2/release/launch.sh"])
    assert calls[-1] == ["docker", *p.nodes[1].docker_argv[1:]]
    assert _env_file(files["node2/release/engine.env"]) == p.nodes[1].env


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(_NASTY, st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)))),
                min_size=1, max_size=6))
def test_shell_words_parse_back(argv):
    """bash itself reads the continued lines back into exactly argv."""
    script = "printf '%s\\0' " + render._shargs(argv, 1) + "\n"
    done = subprocess.run(["/bin/bash", "-c", script], capture_output=True, env={"PATH": "/nonexistent"}, check=True)
    assert done.stdout.split(b"\0")[:-1] == [a.encode() for a in argv]


@settings(max_examples=200, deadline=None)
@given(st.text(st.characters(blacklist_characters="\n\r\x00", blacklist_categories=("Cs",))))
def test_systemd_escape_round_trips(text):
    escaped = render.systemd_escape(text)
    assert re.sub(r"%%|\\\\", lambda m: m.group(0)[0], escaped) == text  # systemd's unescaping gives it back
    assert "%" not in escaped.replace("%%", "")  # no lone specifier


def test_systemd_escape_rejects_line_breaks():
    with pytest.raises(ValueError):
        render.systemd_escape("a\nExecStart=/bin/sh")


def test_the_exporter_unit_is_the_heads_and_ports_metrics_0_renders_none(tmp_path):
    base = _plan(FIXTURES / "inventory.sim.yaml")
    files = render.render(base)
    exporters = [k for k in files if k.endswith("/monitoring/sparkdeploy-exporter.service")]
    assert exporters == [f"{base.head.name}/monitoring/sparkdeploy-exporter.service"]
    unit = files[exporters[0]].decode()
    start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    assert f" {base.image.tag} " in start and "--listen 0.0.0.0:9466" in start and "--user 65534:65534" in start
    assert f"--engine http://127.0.0.1:{base.api_port}" in start
    raw = yaml.safe_load((FIXTURES / "inventory.sim.yaml").read_text())
    raw["ports"]["metrics"] = 0
    raw["vocab"] = str(FIXTURES / raw["vocab"])  # relative to the inventory's directory
    (tmp_path / "inv.yaml").write_text(yaml.safe_dump(raw))
    off = _plan(tmp_path / "inv.yaml")
    assert off.release_id == base.release_id  # the exporter is not part of a release
    assert not [k for k in render.render(off) if "/monitoring/" in k]
