"""A sim cluster cabled as NVIDIA Sync's Cluster Assistant cables a ring: one Docker network per link (node1-node2,
node2-node3, node3-node1), each its own /24, each node on its two link networks besides the management network
that carries SSH. Two nodes get one link (a direct cable). The pure parts (which links, which address, which netdev
holds an address) live here; `SimCluster` creates the networks and attaches the nodes."""

from __future__ import annotations

import ipaddress
from dataclasses import asdict, dataclass
from typing import Sequence

from sparkdeploy.errors import SimError
from sparkdeploy.node import probes

LINK_PREFIX = 24


@dataclass(frozen=True)
class SimLink:
    """One node's end of a link network: the address it has there, the netdev the node sees it on (known once the
    node runs), the node at the other end and the Docker network."""
    network: str
    ip: str
    peer: str
    netdev: str = ""
    prefix: int = LINK_PREFIX

    def to_dict(self) -> dict:
        return asdict(self)


def ring_pairs(names: Sequence[str]) -> list[tuple[str, str]]:
    """The cables of a ring over `names` in order: each node to the next, the last back to the first; two nodes
    share one cable. Fewer than two nodes have none."""
    if len(names) < 2:
        return []
    if len(names) == 2:
        return [(names[0], names[1])]
    return [(names[i], names[(i + 1) % len(names)]) for i in range(len(names))]


def link_network(prefix: str, a: str, b: str) -> str:
    """The Docker network of the cable between nodes `a` and `b` (`<cluster prefix>-link-a-b`)."""
    return f"{prefix}-link-{a}-{b}"


def ring_addresses(names: Sequence[str], subnets: Sequence[str], prefix: str) -> dict[str, list[SimLink]]:
    """{node: its links, in cable order} for the cables of `ring_pairs(names)` on `subnets` (one /24 each, same
    order). A node's address on every link ends in 11 + its index, as on the management network, so node2 is
    x.y.z.12 wherever it is cabled."""
    pairs = ring_pairs(names)
    if len(subnets) != len(pairs):
        raise SimError(f"a ring of {len(names)} nodes needs {len(pairs)} link subnets, got {len(subnets)}")
    index = {n: i for i, n in enumerate(names)}
    out: dict[str, list[SimLink]] = {n: [] for n in names}
    for (a, b), subnet in zip(pairs, subnets):
        net = ipaddress.IPv4Network(subnet)
        for me, peer in ((a, b), (b, a)):
            out[me].append(SimLink(network=link_network(prefix, a, b), ip=str(net.network_address + 11 + index[me]),
                                   peer=peer, prefix=net.prefixlen))
    return out




def netdev_for(ip_addr_output: str, ip: str) -> str | None:
    """The netdev that holds `ip`, from `ip -o -4 addr show` inside the node (`3: eth1    inet 172.30.7.12/24 ...`;
    a veth shows as `eth1@if12`). Docker numbers a container's interfaces in the order it attaches networks,
    which `docker network connect` does not promise, so the name is read, never assumed."""
    return next((dev for dev, addrs in probes.parse_ip_addr(ip_addr_output).items()
                 if any(a.split("/", 1)[0] == ip for a in addrs)), None)
