"""`services:` in the inventory: several services on one cluster, each its own `Inventory` (its nodes, the first
its head; its profile, ports, list), placement checked across them; `--service` on every command; `plan` and
`render` without it show every service. An inventory without `services:` is one service, as before."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from sparkdeploy import paths
from sparkdeploy import plan as plan_mod
from sparkdeploy.cli import main
from sparkdeploy.errors import InventoryError
from sparkdeploy.model import inventory
from sparkdeploy.plan.router import plan_router

FIXTURES = Path(__file__).parent / "fixtures"
EXAMPLE = paths.repo_root() / "examples" / "inventory.4node.yaml"


def _sim_services() -> dict:
    """Four simulated nodes: `a` (tiny TP=2) on node1 + node2, `b` (tiny TP=2) on node3 + node4."""
    data = yaml.safe_load((FIXTURES / "inventory.sim.yaml").read_text())
    nodes = []
    for i in range(1, 5):
        node = copy.deepcopy(data["nodes"][0])
        node.pop("role")
        node.update(name=f"node{i}", data_ip=f"172.30.97.1{i}", ssh=dict(node["ssh"], host=f"172.30.97.1{i}"))
        nodes.append(node)
    vocab = str(FIXTURES / "vocab-1k.txt")
    service = {k: data[k] for k in ("profile", "patches", "ports", "memory")}
    return {"cluster": "sim4", "nodes": nodes, "image": data["image"], "services": [
        dict(copy.deepcopy(service), name="a", nodes=["node1", "node2"], vocab=vocab),
        dict(copy.deepcopy(service), name="b", nodes=["node3", "node4"], vocab=vocab,
             ports={"api": 8001, "master": 29501})]}


def _write(tmp_path: Path, data: dict) -> Path:
    key = tmp_path / "api_key"  # `auth: {api_key_file: api_key}` names it, relative to the inventory
    key.write_text("sk-test-0123456789\n")
    key.chmod(0o600)
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_each_service_is_its_own_inventory_with_its_first_node_as_head(tmp_path):
    a, b = inventory.load_services(_write(tmp_path, _sim_services()))
    assert (a.service, b.service) == ("a", "b")
    assert [(n.name, n.role) for n in a.nodes] == [("node1", "head"), ("node2", "worker")]
    assert [(n.name, n.role) for n in b.nodes] == [("node3", "head"), ("node4", "worker")]
    assert (a.cluster, b.cluster) == ("sim4.a", "sim4.b")
    assert (a.ports.api, b.ports.api) == (8000, 8001)
    pa, pb = (plan_mod.plan(inv, None, None, git_commit="0" * 40) for inv in (a, b))
    assert pa.service == "a" and pa.api_url == "http://172.30.97.11:8000"
    assert pb.service == "b" and pb.api_url == "http://172.30.97.13:8001"
    assert "--master-addr 172.30.97.13" in pb.head.serve_command
    assert {n.name for n in pa.nodes}.isdisjoint({n.name for n in pb.nodes})
    # the nodes a service's `up` looks at to retire its units, should the service have moved off them
    assert ([n.name for n in a.elsewhere], [n.name for n in b.elsewhere]) == (["node3", "node4"], ["node1", "node2"])


def test_an_inventory_without_services_is_one_service_named_after_its_cluster():
    (only,) = inventory.load_services(FIXTURES / "inventory.sim.yaml")
    assert only.service is None and only.cluster == "sim" and only.elsewhere == ()
    assert inventory.load(FIXTURES / "inventory.sim.yaml", "sim") == only
    with pytest.raises(InventoryError, match="one service, named after its cluster"):
        inventory.load(FIXTURES / "inventory.sim.yaml", "chat")


def test_several_services_need_service_named(tmp_path):
    path = _write(tmp_path, _sim_services())
    with pytest.raises(InventoryError, match=r"2 services \(a, b\): choose one with --service NAME") as err:
        inventory.load(path)
    assert err.value.field == "services"
    assert inventory.load(path, "b").head.name == "node3"


def _mutated(change):
    data = _sim_services()
    change(data)
    return data


CASES = [
    ("missing-node", lambda d: d["services"][1]["nodes"].__setitem__(0, "node9"), "services[1].nodes[0]",
     "no node named 'node9'"),
    ("heads-share-a-node-and-a-port", lambda d: d["services"][1].update(nodes=["node1", "node2"], ports={
        "api": 8001, "master": 29500}), "services[1].ports.master", "already service a's ports.master on node node1"),
    ("node-twice", lambda d: d["services"][0]["nodes"].__setitem__(1, "node1"), "services[0].nodes[1]",
     "twice in this service"),
    ("wrong-node-count", lambda d: d["services"][0]["nodes"].append("node3"), "services[0].nodes",
     "needs tp x pp x dp"),
    ("duplicate-name", lambda d: d["services"][1].__setitem__("name", "a"), "services[1].name", "names two services"),
    ("role-with-services", lambda d: d["nodes"][0].__setitem__("role", "head"), "nodes[0].role", "first node is its head"),
    ("top-level-profile", lambda d: d.__setitem__("profile", "sim-tiny"), "profile", "belongs to each service"),
    ("service-port-clash", lambda d: d["services"][1]["ports"].__setitem__("master", 8001), "services[1].ports.master",
     "must differ"),
    ("service-unknown-key", lambda d: d["services"][0].__setitem__("replica", 2), "services[0].replica",
     "unknown key"),
    ("service-bad-profile", lambda d: d["services"][1].__setitem__("profile", "nope"), "services[1].profile",
     "no profile 'nope'"),
    ("service-image-unpinned", lambda d: d["services"][1].__setitem__("image", {"base": "not a reference"}),
     "services[1].image.base", "is not pinned"),
    ("router-missing-node", lambda d: d.update(router={"node": "node9"}, auth={"api_key_file": "api_key"}),
     "router.node", "no node named 'node9'"),
    ("router-port-clash", lambda d: d.update(router={"node": "node1", "port": 8000}, auth={"api_key_file": "api_key"}),
     "router.port", "already service a's port on node1"),
    ("router-without-key", lambda d: d.update(router={"node": "node1"}), "router", "needs auth.api_key_file"),
    ("service-bad-backend", lambda d: d["services"][1].__setitem__("backend", "mpi"), "services[1].backend",
     "not one of mp, ray"),
    ("service-named-router", lambda d: d["services"][1].__setitem__("name", "router"), "services[1].name",
     "names the router"),
    ("gpu-service-on-sim-nodes", lambda d: d["services"][1].update(
        profile="nemotron-3-super-120b-nvfp4", image={"base": "nvcr.io/nvidia/vllm@sha256:" + "a" * 64,
                                                      "vllm_version": "0.33.0"}),
     "nodes[2].gpu", "is for GPU nodes but node node3 has gpu: none"),
]


@pytest.mark.parametrize("name,change,field,words", CASES, ids=[c[0] for c in CASES])
def test_bad_placement_exits_2_naming_the_service_and_field(tmp_path, capsys, name, change, field, words):
    path = _write(tmp_path, _mutated(change))
    assert main(["plan", "--inventory", str(path)]) == 2
    err = capsys.readouterr().err
    assert field in err and words in err, err


@pytest.mark.parametrize("command", [["down"], ["rollback"], ["logs"], ["vocab", "rollout", "--dry-run", str(FIXTURES / "vocab-1k.txt")]])
def test_a_command_on_one_service_with_several_and_none_chosen_exits_2_before_connecting(tmp_path, capsys, command):
    path = _write(tmp_path, _sim_services())  # its nodes do not exist: any connection attempt would fail with 1
    assert main([*command, "--inventory", str(path)]) == 2
    assert "choose one with --service NAME" in capsys.readouterr().err


def test_example_four_nodes_plans_and_renders_both_services(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # the example reads its API key from ~/.config/sparkdeploy/api_key
    (tmp_path / ".config" / "sparkdeploy").mkdir(parents=True)
    (tmp_path / ".config" / "sparkdeploy" / "api_key").write_text("sk-example-0123456789\n")
    (tmp_path / ".config" / "sparkdeploy" / "api_key").chmod(0o600)
    assert main(["plan", "--inventory", str(EXAMPLE), "--json"]) == 0
    plans = json.loads(capsys.readouterr().out)["services"]
    assert sorted(plans) == ["chat", "super"]
    assert [n["name"] for n in plans["chat"]["nodes"]] == ["spark1", "spark2"]
    assert [n["name"] for n in plans["super"]["nodes"]] == ["spark3", "spark4"]
    assert plans["super"]["api_port"] == 8001 and plans["super"]["nodes"][0]["role"] == "head"
    assert (plans["chat"]["backend"], plans["super"]["backend"]) == ("mp", "ray")
    assert plans["super"]["nodes"][1]["serve_argv"][:4] == ["ray", "start", "--address", "192.168.177.13:29502"]
    assert main(["plan", "--inventory", str(EXAMPLE), "--service", "super", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["service"] == "super"
    assert main(["render", "--inventory", str(EXAMPLE), "--out", str(tmp_path / "out")]) == 0
    for service, head in (("chat", "spark1"), ("super", "spark3")):
        unit = (tmp_path / "out" / service / head / "unit" / f"sparkdeploy-engine-{service}.service").read_text()
        assert f"spark-quad.{service} node {head}, rank 0 of 2 (head)" in unit
    assert (tmp_path / "out" / "router" / "sparkdeploy-router.service").is_file()
    assert main(["plan", "--inventory", str(EXAMPLE)]) == 0
    assert "model chat                 -> service chat at http://192.168.177.11:8000" in capsys.readouterr().out
    rp = plan_router(inventory.load_services(EXAMPLE))
    assert (rp.url, rp.models) == ("http://10.0.0.11:8080", ("chat", "super"))
    assert [w.url for w in rp.workers] == ["http://192.168.177.11:8000", "http://192.168.177.13:8001"]


def test_services_sharing_nodes_get_their_own_names_and_split_the_memory(tmp_path):
    """`a` and `b` both on node1 + node2 (b's head node2): each its own unit, container, release and vocab paths
    and watchdog; each an equal part of what the reserve leaves; the ports may repeat where the heads differ."""
    data = _sim_services()
    data["services"][1].update(nodes=["node2", "node1"], ports={"api": 8000, "master": 29500, "metrics": 9466})
    alone = plan_mod.plan(inventory.load_services(_write(tmp_path, _sim_services()))[0], None, None)
    a, b = inventory.load_services(_write(tmp_path, data))
    assert (a.shared_by("node1"), a.shared_by("node2"), a.shared_by("node3")) == (2, 2, 1)
    pa, pb = (plan_mod.plan(v, None, None) for v in (a, b))
    assert (pa.head.unit_name, pb.head.unit_name) == ("sparkdeploy-engine-a.service", "sparkdeploy-engine-b.service")
    assert "--name sparkdeploy-engine-b " in pb.node("node1").docker_command
    assert "/etc/sparkdeploy/services/b/current/engine.env" in pb.node("node1").docker_command
    assert "/var/lib/sparkdeploy/services/b/vocab:/opt/sparkdeploy/vocab:ro" in pb.node("node1").docker_command
    assert pb.layout.watchdog_timer == "sparkdeploy-watchdog-b.timer"
    reserve, total = alone.head.memory.reserve_gib, alone.head.memory.mem_total_gib
    for p in (pa, pb):
        mem = p.node("node1").memory
        assert mem.base_gib == pytest.approx(reserve + (total - reserve) / 2, abs=1e-3)
        assert mem.base == "MemTotal share (node shared by 2 services)"


def test_a_service_that_does_not_fit_its_share_of_a_node_exits_2_naming_it(tmp_path, capsys):
    """Alone, each fits its nodes with a 15 GiB reserve (the nominal sim node: 20 GiB available of 24, 4.5 for
    the engine); sharing node1 and node2, half of the 9 GiB the reserve leaves of MemTotal is too little."""
    data = _sim_services()
    for service in data["services"]:
        service["memory"] = {"reserve_gib": 15.0}
    assert main(["plan", "--inventory", str(_write(tmp_path, data))]) == 0
    data["services"][1].update(nodes=["node2", "node1"], ports={"api": 8001, "master": 29501})
    capsys.readouterr()
    assert main(["plan", "--inventory", str(_write(tmp_path, data))]) == 2
    err = capsys.readouterr().err
    assert "service a (services[0]): node node1: memory.reserve_gib" in err, err
    assert "shared by 2 services" in err, err
