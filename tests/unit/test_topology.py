"""Per-link addressing: the three networks NVIDIA Sync's Cluster Assistant builds (direct cable, 3-node ring,
switch), the NCCL/Gloo env each node gets from the link its group actually uses, and the groups NCCL cannot run
refused with exit 2, naming the nodes and their links."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkdeploy import paths
from sparkdeploy.cli import main
from sparkdeploy.errors import InventoryError, PlanError
from sparkdeploy.model import inventory
from sparkdeploy.plan import plan

VOCAB = str(paths.repo_root() / "vocabs" / "qwen3.5-multi-64k.txt")
IMAGE = {"base": "nvcr.io/nvidia/vllm@sha256:" + "3f" * 32, "vllm_version": "0.34.0"}


def _node(name: str, last: int, links: list[dict]) -> dict:
    return {"name": name, "ssh": {"host": f"10.0.0.{last}", "user": "nvidia"}, "gpu": "gb10", "links": links}


def _link(netdev: str, subnet: int, last: int, hca: str, peer: str | None = None) -> dict:
    out = {"netdev": netdev, "ip": f"192.168.{subnet}.{last}", "hca": [hca]}
    return {**out, "peer": peer} if peer else out


def _ring() -> list[dict]:
    """Three Sparks, each port cabled to one peer: spark1-spark2 on .10, spark2-spark3 on .11, spark3-spark1 on .12
    (the shape of the Cluster Assistant's 3-node ring)."""
    return [
        _node("spark1", 11, [_link("enp1s0f0np0", 10, 1, "rocep1s0f0", "spark2"),
                             _link("enp1s0f1np1", 12, 1, "rocep1s0f1", "spark3")]),
        _node("spark2", 12, [_link("enp1s0f0np0", 11, 2, "rocep1s0f0", "spark3"),
                             _link("enp1s0f1np1", 10, 2, "rocep1s0f1", "spark1")]),
        _node("spark3", 13, [_link("enp1s0f0np0", 12, 3, "rocep1s0f0", "spark1"),
                             _link("enp1s0f1np1", 11, 3, "rocep1s0f1", "spark2")]),
    ]


def _services(nodes: list[dict], groups: dict[str, list[str]], profile: str = "qwen3.8-flash-next-nvfp4") -> dict:
    return {"cluster": "ring", "nodes": nodes, "image": IMAGE,
            "services": [{"name": name, "profile": profile, "nodes": members, "vocab": VOCAB,
                          "ports": {"api": 8000 + i, "master": 29501 + i, "metrics": 9466 + i}}
                         for i, (name, members) in enumerate(groups.items())]}


def _write(tmp_path: Path, data: dict, name: str = "inventory.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _profile(tmp_path: Path, tp: int) -> str:
    """A TP=`tp` copy of a shipped profile, so a group of that size is a layout the profile asks for."""
    raw = yaml.safe_load((paths.profiles_dir() / "qwen3.8-flash-next-nvfp4.yaml").read_text())
    raw["parallel"]["tp"] = tp
    (tmp_path / f"tp{tp}.yaml").write_text(yaml.safe_dump(raw))
    return f"./tp{tp}.yaml"


def test_ring_pairs_talk_over_their_own_cable_and_each_node_gets_that_links_env(tmp_path):
    path = _write(tmp_path, _services(_ring(), {"left": ["spark1", "spark2"], "right": ["spark2", "spark3"]}))
    left, right = (plan(inventory.load(path, s)) for s in ("left", "right"))

    # left: spark1-spark2 over the .10 cable; spark2 uses its second port there
    assert [(n.name, n.data_ip, n.netdev, n.hca) for n in left.nodes] == [
        ("spark1", "192.168.10.1", "enp1s0f0np0", ("rocep1s0f0",)),
        ("spark2", "192.168.10.2", "enp1s0f1np1", ("rocep1s0f1",))]
    worker = left.node("spark2")
    assert worker.env["NCCL_SOCKET_IFNAME"] == worker.env["GLOO_SOCKET_IFNAME"] == "enp1s0f1np1"
    assert worker.env["NCCL_IB_HCA"] == "rocep1s0f1" and worker.env["VLLM_HOST_IP"] == "192.168.10.2"
    argv = worker.serve_argv
    assert argv[argv.index("--master-addr") + 1] == "192.168.10.1"
    # right: the same spark2 is the head there, over its other port and the .11 cable
    head = right.node("spark2")
    assert (head.data_ip, head.env["NCCL_SOCKET_IFNAME"], head.env["NCCL_IB_HCA"]) == \
        ("192.168.11.2", "enp1s0f0np0", "rocep1s0f0")
    assert right.node("spark3").env["NCCL_SOCKET_IFNAME"] == "enp1s0f1np1"


def test_a_group_of_three_on_a_ring_is_refused_naming_nodes_and_links(tmp_path, capsys):
    data = _services(_ring(), {"all": ["spark1", "spark2", "spark3"]}, profile=_profile(tmp_path, tp=3))
    path = _write(tmp_path, data)
    with pytest.raises(InventoryError) as err:
        inventory.load(path)
    message = str(err.value)
    assert "services[0].nodes" in message and "ring" in message and "switch" in message
    for text in ("spark1 has enp1s0f0np0 192.168.10.1/24, enp1s0f1np1 192.168.12.1/24", "spark3 has"):
        assert text in message
    assert main(["plan", "--inventory", str(path)]) == 2
    assert "no subnet reaches all 3" in capsys.readouterr().err


def test_a_pair_without_a_shared_subnet_is_refused_naming_the_pair(tmp_path):
    ring = _ring()
    ring[2]["links"] = [_link("enp1s0f0np0", 13, 3, "rocep1s0f0")]  # spark3 cabled to nobody in the group
    path = _write(tmp_path, _services(ring, {"apart": ["spark1", "spark3"]}))
    with pytest.raises(InventoryError, match=r"spark1-spark3 share no subnet .*spark3 has enp1s0f0np0 "
                                             r"192\.168\.13\.3/24"):
        inventory.load(path)


def test_a_switch_subnet_carries_a_group_of_four_beside_the_direct_cables(tmp_path):
    # spark1-spark2 and spark3-spark4 also have a direct cable each (.10, .11); every second port is on one switch
    nodes = [_node(f"spark{i}", 10 + i, [_link("enp1s0f0np0", 10 + (i - 1) // 2, i, "rocep1s0f0"),
                                         _link("enp1s0f1np1", 20, i, "rocep1s0f1")]) for i in range(1, 5)]
    data = _services(nodes, {"all": [n["name"] for n in nodes]}, profile=_profile(tmp_path, tp=4))
    p = plan(inventory.load(_write(tmp_path, data)))
    assert {n.name: (n.data_ip, n.env["NCCL_SOCKET_IFNAME"], n.env["NCCL_IB_HCA"]) for n in p.nodes} == {
        f"spark{i}": (f"192.168.20.{i}", "enp1s0f1np1", "rocep1s0f1") for i in range(1, 5)}
    # a pair of them keeps its own cable: the head's first shared link wins
    pair = plan(inventory.load(_write(tmp_path, _services(nodes, {"pair": ["spark1", "spark2"]}), "pair.yaml")))
    assert [n.data_ip for n in pair.nodes] == ["192.168.10.1", "192.168.10.2"]


def test_one_link_in_links_form_plans_exactly_as_the_shorthand(tmp_path):
    shorthand = yaml.safe_load(paths.default_inventory().read_text())
    shorthand["vocab"] = VOCAB
    links = copy.deepcopy(shorthand)
    for node in links["nodes"]:
        node["links"] = [{"netdev": node.pop("netdev"), "ip": node.pop("data_ip"), "prefix": 24,
                          "hca": node.pop("hca")}]
    a = plan(inventory.load(_write(tmp_path, shorthand, "a.yaml")))
    b = plan(inventory.load(_write(tmp_path, links, "b.yaml")))
    assert a.to_dict() == b.to_dict()


@pytest.mark.parametrize("mutate, field, text", [
    (lambda n: n.update(data_ip="192.168.10.1"), "nodes[0].data_ip", "not both"),
    (lambda n: n.update(links=[]), "nodes[0].links", "at least one"),
    (lambda n: n["links"][1].update(netdev="enp1s0f0np0"), "nodes[0].links[1].netdev", "one entry per port"),
    (lambda n: n["links"][1].update(ip="192.168.10.9"), "nodes[0].links[1].ip", "its own subnet"),
    (lambda n: n["links"][0].update(peer="spark9"), "nodes[0].links[0].peer", "no node named 'spark9'"),
    (lambda n: n["links"][0].update(peer="spark1"), "nodes[0].links[0].peer", "is this node"),
    (lambda n: n["links"][0].update(prefix=33), "nodes[0].links[0].prefix", "8..31"),
    (lambda n: n["links"][0].update(ip="192.168.10.2"), "nodes[1].links[1].ip", "duplicate of nodes[0].links[0].ip"),
    (lambda n: n["links"][0].update(speed=200), "nodes[0].links[0].speed", "unknown key"),
    (lambda n: n.pop("links"), "nodes[0].data_ip", "or its links as links:"),
])
def test_malformed_links_exit_2_naming_the_field(tmp_path, capsys, mutate, field, text):
    data = _services(_ring(), {"left": ["spark1", "spark2"]})
    mutate(data["nodes"][0])
    path = _write(tmp_path, data)
    with pytest.raises(InventoryError) as err:
        inventory.load(path)
    assert err.value.field == field and text in str(err.value)
    assert main(["plan", "--inventory", str(path)]) == 2


def test_facts_must_show_every_link_of_a_node(tmp_path):
    from sparkdeploy.model.facts_file import load_facts_file

    path = _write(tmp_path, _services(_ring(), {"left": ["spark1", "spark2"]}))
    facts = {"nodes": {"spark1": {"mem_total_gib": 119.7, "gpu_name": "NVIDIA GB10",
                                  "netdevs": {"enp1s0f0np0": {"ipv4": ["192.168.10.1/24"]}}}}}
    facts_path = _write(tmp_path, facts, "facts.yaml")
    with pytest.raises(PlanError, match=r"nodes\[0\]\.links\[1\]\.netdev: node spark1 has no interface "
                                        r"'enp1s0f1np1'"):
        plan(inventory.load(path, "left"), load_facts_file(facts_path))


def test_the_shipped_ring_example_plans_its_pair_over_their_cable():
    p = plan(inventory.load(paths.repo_root() / "examples" / "inventory.3ring.yaml"))
    assert [(n.name, n.env["NCCL_SOCKET_IFNAME"], n.env["VLLM_HOST_IP"]) for n in p.nodes] == [
        ("spark1", "enp1s0f0np0", "192.168.10.1"), ("spark2", "enp1s0f1np1", "192.168.10.2")]


def test_the_router_reaches_each_head_over_a_cable_it_shares_with_it(tmp_path):
    """On a ring the router's node may not be on a service's subnet: it takes the head's port on their own cable."""
    from sparkdeploy.plan.router import plan_router

    data = _services(_ring(), {"left": ["spark1", "spark2"], "right": ["spark2", "spark3"]})
    data["router"] = {"node": "spark3", "port": 8080}
    key = tmp_path / "api.key"
    key.write_text("k" * 32 + "\n")
    key.chmod(0o600)
    data["auth"] = {"api_key_file": str(key)}
    for i, service in enumerate(data["services"]):
        service["served_name"] = f"m{i}"
    rp = plan_router(inventory.load_services(_write(tmp_path, data)))
    # left's head spark1 serves on .10 (spark3 is not on it): the router uses spark1's .12 port, their cable;
    # right's head spark2 serves on .11, a subnet spark3 shares
    assert [w.url for w in rp.workers] == ["http://192.168.12.1:8000", "http://192.168.11.2:8001"]


_IPS = ["192.168.10.1", "192.168.10.2", "192.168.11.2", "192.168.10.1/24", "10.0.0.11", "0.0.0.0", "::1", "x"]
_NETDEVS = st.one_of(st.sampled_from(["enp1s0f0np0", "enp1s0f1np1"]), st.text(max_size=17))
_LINK = st.fixed_dictionaries({"netdev": _NETDEVS, "ip": st.one_of(st.sampled_from(_IPS), st.text(max_size=16))},
                              optional={"prefix": st.one_of(st.integers(-1, 40), st.text(max_size=3)),
                                        "hca": st.lists(st.one_of(st.sampled_from(["rocep1s0f0", "rocep1s0f1"]),
                                                                  st.text(max_size=8)), max_size=3),
                                        "peer": st.one_of(st.sampled_from(["spark1", "spark2", "spark3", "nope"]),
                                                          st.text(max_size=6)),
                                        "extra": st.integers()})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(links=st.lists(st.one_of(_LINK, st.integers(), st.text(max_size=4)), max_size=4))
def test_any_links_plan_or_exit_2_naming_the_field(tmp_path, links):
    """Whatever a node's links: it plans, or the refusal (InventoryError, PlanError) names the inventory and field."""
    data = _services(_ring(), {"left": ["spark1", "spark2"]})
    data["nodes"][0]["links"] = links
    path = _write(tmp_path, data)
    try:
        plan(inventory.load(path, "left"))
    except InventoryError as err:
        assert err.field and str(path) in str(err)
    except PlanError as err:
        assert "spark1" in str(err) or "nodes[" in str(err)
