"""Which data link each node of a TP/EP group talks over, for the three networks NVIDIA Sync's Cluster Assistant
builds: a direct cable (2 nodes, one subnet), a 3-node ring (each node two links, each link its own subnet shared
with one peer) and a switch (one subnet for 2-4+ nodes).

Why one subnet for the whole group: every rank binds one interface for NCCL's sockets and Gloo
(NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME), announces one address (VLLM_HOST_IP) and reaches the head's master
address; Gloo and NCCL's bootstrap connect every rank to every other. So the group works when all its nodes have a
link on one subnet: the cable of a pair, the switch of a larger group. A ring gives a pair of its nodes a cable,
but three ranks on a ring have no subnet in common: each would need a second interface NCCL's socket transport
does not route over. That layout is refused here, naming the nodes and links, instead of hanging at the first
collective.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from itertools import combinations
from typing import Protocol, Sequence

DEFAULT_PREFIX = 24  # what the Cluster Assistant and host setup give a CX-7 subnet


@dataclass(frozen=True)
class Link:
    """One data link of a node: a netdev with its address on one subnet, the RoCE devices behind it, and the
    node at its other end where the cable goes to one (a direct cable, a ring; none through a switch)."""
    netdev: str
    ip: str
    prefix: int = DEFAULT_PREFIX
    hca: tuple[str, ...] = ()
    peer: str | None = None

    @property
    def subnet(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"{self.ip}/{self.prefix}", strict=False)

    def describe(self) -> str:
        return f"{self.netdev} {self.ip}/{self.prefix}"


class LinkedNode(Protocol):
    """What the choice needs of an inventory node (inventory.Node)."""
    name: str

    def data_links(self) -> tuple[Link, ...]: ...


class TopologyError(ValueError):
    """A group whose nodes do not all share a subnet; the message names the nodes and their links."""


def group_links(nodes: Sequence[LinkedNode]) -> tuple[Link, ...]:
    """For each node of the group (in order), the link on the subnet the whole group shares. Where several
    subnets are shared (two rails through a switch), the head's (first node's) first such link wins, so the plan
    is stable. A single node keeps its first link."""
    if len(nodes) == 1:
        return (nodes[0].data_links()[0],)
    shared = set.intersection(*({link.subnet for link in n.data_links()} for n in nodes))
    if not shared:
        raise TopologyError(_why_not_connected(nodes))
    subnet = next(link.subnet for link in nodes[0].data_links() if link.subnet in shared)
    return tuple(next(link for link in n.data_links() if link.subnet == subnet) for n in nodes)


def _links_of(node: LinkedNode) -> str:
    return f"{node.name} has {', '.join(link.describe() for link in node.data_links())}"


def _why_not_connected(nodes: Sequence[LinkedNode]) -> str:
    names = ", ".join(n.name for n in nodes)
    apart = [(a, b) for a, b in combinations(nodes, 2)
             if not {link.subnet for link in a.data_links()} & {link.subnet for link in b.data_links()}]
    where = "; ".join(_links_of(n) for n in nodes)
    if apart:
        pairs = ", ".join(f"{a.name}-{b.name}" for a, b in apart)
        return (f"nodes {names} form one TP/EP group but {pairs} share no subnet ({where}): NCCL and Gloo connect "
                "every rank to every other, so each pair needs a link on a common subnet; cable them (or put them "
                "on one switch) and list that link, or run the group on nodes that are connected")
    return (f"nodes {names} are cabled as a ring ({where}): each pair shares a cable, but no subnet reaches all "
            f"{len(nodes)}, and NCCL and Gloo bind one interface per rank; a group of {len(nodes)} needs a switch "
            "(one subnet for all), else run TP=2 on two of them (a service whose two nodes share a cable)")


def address_for(source: LinkedNode, target: LinkedNode, preferred: str | None = None) -> str | None:
    """The address of `target` that `source` reaches over a data link: `preferred` (the address a service uses)
    when it is on a subnet `source` is on, else another link of `target` that is, else None (on a ring the
    router's node may share a cable with a service's head only through its other port)."""
    mine = {link.subnet for link in source.data_links()}
    theirs = [link for link in target.data_links() if link.subnet in mine]
    chosen = next((link for link in theirs if link.ip == preferred), theirs[0] if theirs else None)
    return chosen.ip if chosen else None


@dataclass(frozen=True)
class LinkPair:
    """Two nodes' ends of one data link (a cable, or their subnet on a switch): what doctor tries and measures."""
    a: str
    a_link: Link
    b: str
    b_link: Link

    def describe(self) -> str:
        return f"{self.a} {self.a_link.netdev} -> {self.b} {self.b_link.netdev}"


def link_pairs(group: Sequence[LinkedNode], others: Sequence[LinkedNode] = ()) -> list[LinkPair]:
    """Every data link the group's nodes have, once per link: each pair of the group over each subnet it shares
    (two rails through a switch: two), and each cable from a group node to a `peer` outside the group (`others`):
    on a ring, doctor on the pair's service checks the cables to the third node too (the router and the next
    service placed there run over them)."""
    out = [LinkPair(a.name, la, b.name, lb) for a, b in combinations(group, 2)
           for la in a.data_links() for lb in b.data_links() if la.subnet == lb.subnet]
    inside, outside = {n.name for n in group}, {n.name: n for n in others}
    for a in group:
        for la in a.data_links():
            b = outside.get(la.peer) if la.peer not in inside else None
            lb = next((link for link in b.data_links() if link.subnet == la.subnet), None) if b else None
            if lb is not None:
                out.append(LinkPair(a.name, la, b.name, lb))
    return out
