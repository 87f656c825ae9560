"""One GID rule and one meminfo parser for the planner (gather) and doctor (probes)."""

from types import SimpleNamespace

from sparkdeploy.checks import preflight
from sparkdeploy.node import probes
from sparkdeploy.ops import gather

TWINS = """@@@ meminfo
MemTotal:       125000000 kB
MemAvailable:   121000000 kB
@@@ rc=0
@@@ ip
[{"ifname":"enp1s0f1np1","mtu":9000,"operstate":"UP","addr_info":[{"family":"inet","local":"192.168.177.11","prefixlen":24}]},
 {"ifname":"enP2p1s0f1np1","mtu":9000,"operstate":"UP","addr_info":[{"family":"inet","local":"192.168.178.11","prefixlen":24}]}]
@@@ rc=0
@@@ roce
gid rocep1s0f1 2 0000:0000:0000:0000:0000:ffff:c0a8:b10b IB/RoCE v1
gid rocep1s0f1 3 0000:0000:0000:0000:0000:ffff:c0a8:b10b RoCE v2
ndev rocep1s0f1 enp1s0f1np1
gid roceP2p1s0f1 2 0000:0000:0000:0000:0000:ffff:c0a8:b20b IB/RoCE v1
gid roceP2p1s0f1 3 0000:0000:0000:0000:0000:ffff:c0a8:b20b RoCE v2
ndev roceP2p1s0f1 enP2p1s0f1np1
@@@ rc=0
"""


def test_one_parser_and_one_rule():
    assert gather.probes is probes and preflight.parse_meminfo is probes.parse_meminfo
    assert preflight.port_gid_index.__module__ == "sparkdeploy.node.probes"


def test_second_twin_gid_maps_its_own_address():
    """Host setup gives each CX-7 twin its own /24. The planner used to match every twin's GID against the
    data_ip, so the second twin had none and the plan left NCCL_IB_GID_INDEX unset while doctor said ok."""
    node = SimpleNamespace(name="spark1", data_ip="192.168.177.11", netdev="enp1s0f1np1",
                           hca=("rocep1s0f1", "roceP2p1s0f1"))
    f = gather.parse_gather(node, TWINS)
    assert [(r.name, r.gid_index) for r in f.roce] == [("rocep1s0f1", 3), ("roceP2p1s0f1", 3)]


def test_rule_accepts_a_set_of_addresses_and_falls_back_to_the_data_ip():
    gids = {1: "fe80::1", 3: "::ffff:192.168.178.11"}
    types = {1: "RoCE v2", 3: "RoCE v2"}
    assert probes.roce_v2_ipv4_gid_index(gids, types, ["192.168.178.11", "10.0.0.1"]) == 3
    assert probes.roce_v2_ipv4_gid_index(gids, types, "192.168.177.11") is None
    assert probes.twin_addresses("x", {"x": ["192.168.178.11/24"]}, "192.168.177.11") == ("192.168.178.11",)
    assert probes.twin_addresses(None, {}, "192.168.177.11") == ("192.168.177.11",)
