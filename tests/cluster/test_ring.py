"""Three simulated Sparks cabled as a ring, as NVIDIA Sync's Cluster Assistant does without a switch (issue 35):
a docker network per cable, each its own /24, two cables per node; SSH stays on the management network.

`sim up --ring` finds each cable's netdev inside the node by its address and writes `links:` per node. The
deployment does not use that file: `sparkdeploy init` reads the three nodes over SSH, as a user would run it
against their boxes, and its inventory (a ring, service s1 on node1 + node2, node3 in none) is deployed
unchanged: the tiny model runs at TP=2 on node1 + node2 over the cable those two share, so NCCL and Gloo name
that cable's netdev on each node, and the ranks' traffic goes over it; doctor checks all three cables of the
ring, node3's too, naming both ports of each. The module has a cluster of its own, downed at the end.
"""

from __future__ import annotations

import ipaddress
import json
import os
from pathlib import Path

import pytest
import yaml

from tests.cluster.test_deploy import cli, up_json

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def ring(sim_node_image, sim_engine_image, tmp_path_factory):
    from sparkdeploy.sim.cluster import SimCluster
    from tests.cluster.conftest import build_serving_image, up_holding_serving_images

    name = os.environ.get("SPARKDEPLOY_SIM_TEST_NAME", "pytest") + "-ring"
    tmp = tmp_path_factory.mktemp("ring")
    cluster = SimCluster(name, state_dir=tmp)
    cluster.down()
    try:
        state = up_holding_serving_images(cluster, 3, tmp / "inventory.sim.yaml", ring_links=True)
        inv = tmp / "inventory.yaml"
        rc, _, err = cli("init", *(n.ip for n in state.nodes), "--user", state.user, "--key", state.key,
                         "--known-hosts", state.known_hosts, "--cluster", f"sim-{name}", "--out", str(inv))
        assert rc == 0 and "ring, head node1, 3 node(s)" in err, err
        cluster.preload(build_serving_image(inv, "s1"), ["node1", "node2"])  # init's name for the same image: a tag
        yield {"cluster": cluster, "state": state, "inv": inv, "data": yaml.safe_load(inv.read_text()),
               "sim": yaml.safe_load(Path(state.inventory).read_text()), "name": name}
    finally:
        if os.environ.get("SPARKDEPLOY_SIM_KEEP") != "1":
            cluster.down()


def link_to(data: dict, node: str, peer: str) -> dict:
    spec = next(n for n in data["nodes"] if n["name"] == node)
    return next(link for link in spec["links"] if link["peer"] == peer)


def link_table(inventory: dict) -> dict:
    """{node: its links as (peer, netdev, ip, prefix), sorted}: init and the sim write them in other orders."""
    return {n["name"]: sorted((link["peer"], link["netdev"], link["ip"], link["prefix"]) for link in n["links"])
            for n in inventory["nodes"]}


def test_each_cable_is_a_network_of_its_own_and_each_link_names_the_netdev_holding_its_address(ring):
    data, cluster = ring["sim"], ring["cluster"]
    subnets = set()
    for spec in data["nodes"]:
        assert len(spec["links"]) == 2, spec
        for link in spec["links"]:
            subnets.add(ipaddress.ip_interface(f"{link['ip']}/{link['prefix']}").network)
            shown = cluster.run_on(spec["name"], ["ip", "-o", "-4", "addr", "show", "dev", link["netdev"]],
                                   check=True).out
            assert f" {link['ip']}/" in shown, (spec["name"], link, shown)
    assert len(subnets) == 3 and ipaddress.ip_network(ring["state"].subnet) not in subnets, subnets
    # init, reading the nodes, finds the links the sim cabled (the management network, SSH's, is no link)
    assert link_table(ring["data"]) == link_table(data), ring["inv"].read_text()
    assert [s["nodes"] for s in ring["data"]["services"]] == [["node1", "node2"]]


def test_tp2_on_two_nodes_of_the_ring_talks_over_their_own_cable_and_doctor_checks_all_three(ring):
    data, cluster, inv = ring["data"], ring["cluster"], ring["inv"]
    rc, res, err = up_json(inv)
    assert rc == 0 and res["healthy"], f"{json.dumps(res)[-3000:]}\n{err[-3000:]}"  # one service: the plain shape
    one_two, two_one = link_to(data, "node1", "node2"), link_to(data, "node2", "node1")
    for node, link in (("node1", one_two), ("node2", two_one)):
        env = cluster.run_on(node, ["docker", "inspect", "-f", "{{range .Config.Env}}{{println .}}{{end}}",
                                    "sparkdeploy-engine-s1"], check=True).out.split()
        assert f"NCCL_SOCKET_IFNAME={link['netdev']}" in env and f"GLOO_SOCKET_IFNAME={link['netdev']}" in env, \
            (node, link, [e for e in env if "IFNAME" in e or "HOST_IP" in e])
    talk = cluster.run_on("node2", ["ss", "-tn", "dst", one_two["ip"]], check=True).out.strip().splitlines()
    assert len(talk) > 1, talk  # rank 1 holds connections to rank 0's address on the cable (a header line first)
    rc, out, err = cli("doctor", "-i", str(inv), "--service", "s1", "--json")
    results = {(r["node"], r["check"]): r for r in json.loads(out)["results"]}
    assert results[("cluster", "data-plane-reach")]["status"] == "ok", results[("cluster", "data-plane-reach")]
    measured = results[("cluster", "data-plane-bandwidth")]["reason"]
    for a, b in (("node1", "node2"), ("node1", "node3"), ("node2", "node3")):
        assert f"{a} {link_to(data, a, b)['netdev']} -> {b} {link_to(data, b, a)['netdev']}" in measured, measured
    cli("down", "-i", str(inv))
