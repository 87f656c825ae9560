"""One GID rule and one meminfo parser for the planner (gather) and doctor (probes): one fact builder."""

from types import SimpleNamespace

from sparkdeploy.checks import preflight
from sparkdeploy.node import facts, probes
from sparkdeploy.node.probes import HostFacts
from sparkdeploy.ops import gather

TWINS = """@@@ meminfo
MemTotal:       125000000 kB
MemAvailable:   121000000 kB
@@@ rc=0
@@@ links
3: enp1s0f1np1: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 9000 qdisc mq state UP mode DEFAULT group default qlen 1000
4: enP2p1s0f1np1: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 9000 qdisc mq state UP mode DEFAULT group default qlen 1000
@@@ rc=0
@@@ addrs
3: enp1s0f1np1    inet 192.168.177.11/24 brd 192.168.177.255 scope global enp1s0f1np1
4: enP2p1s0f1np1    inet 192.168.178.11/24 brd 192.168.178.255 scope global enP2p1s0f1np1
@@@ rc=0
@@@ rdma
port rocep1s0f1 1 enp1s0f1np1 4: ACTIVE
gid rocep1s0f1 1 2 0000:0000:0000:0000:0000:ffff:c0a8:b10b enp1s0f1np1 IB/RoCE v1
gid rocep1s0f1 1 3 0000:0000:0000:0000:0000:ffff:c0a8:b10b enp1s0f1np1 RoCE v2
port roceP2p1s0f1 1 enP2p1s0f1np1 4: ACTIVE
gid roceP2p1s0f1 1 2 0000:0000:0000:0000:0000:ffff:c0a8:b20b enP2p1s0f1np1 IB/RoCE v1
gid roceP2p1s0f1 1 3 0000:0000:0000:0000:0000:ffff:c0a8:b20b enP2p1s0f1np1 RoCE v2
@@@ rc=0
"""


def test_one_parser_and_one_rule():
    assert gather.probes is probes and preflight.parse_meminfo is probes.parse_meminfo
    assert set(probes.GATHER_SECTIONS.items()) <= set(probes.SECTIONS.items())  # gather reads doctor's sections
    assert preflight.port_gid_index.__module__ == "sparkdeploy.node.probes"


def test_second_twin_gid_maps_its_own_address():
    """Host setup gives each CX-7 twin its own /24. The planner used to match every twin's GID against the
    data_ip, so the second twin had none and the plan left NCCL_IB_GID_INDEX unset while doctor said ok."""
    node = SimpleNamespace(name="spark1", data_ip="192.168.177.11", netdev="enp1s0f1np1",
                           hca=("rocep1s0f1", "roceP2p1s0f1"))
    f = facts.from_probe(node, HostFacts.from_output(node.name, TWINS))
    assert [(r.name, r.gid_index) for r in f.roce] == [("rocep1s0f1", 3), ("roceP2p1s0f1", 3)]


def test_rule_accepts_a_set_of_addresses_and_falls_back_to_the_data_ip():
    gids = {1: "fe80::1", 3: "::ffff:192.168.178.11"}
    types = {1: "RoCE v2", 3: "RoCE v2"}
    assert probes.roce_v2_ipv4_gid_index(gids, types, ["192.168.178.11", "10.0.0.1"]) == 3
    assert probes.roce_v2_ipv4_gid_index(gids, types, "192.168.177.11") is None
    assert probes.twin_addresses("x", {"x": ["192.168.178.11/24"]}, "192.168.177.11") == ("192.168.178.11",)
    assert probes.twin_addresses(None, {}, "192.168.177.11") == ("192.168.177.11",)
