"""What the planner needs to know about a node, as plain frozen data.

`NodeFacts` is filled three ways: `nominal(node)` (a built-in nominal GB10 or simulated node, the default so
`plan` works with no node reachable), `model/facts_file.load_facts_file(path)` (YAML, `plan --facts FILE`, shaped
by `model/schema.FactsFile`), or by `gather`
reading the node over SSH and feeding the raw text to the parsers in `probes` (`/proc/meminfo`, `ip -j addr`,
`/sys/class/infiniband/<dev>/ports/1/gids/*` + `gid_attrs/types/*`).
Memory is kept in bytes (`mem_total_bytes`, `mem_available_bytes`); `*_gib` properties convert.

Facts file shape:

    nodes:
      spark1:
        mem_total_gib: 119.7          # or mem_total_bytes
        mem_available_gib: 116.0      # or mem_available_bytes; null if unknown
        gpu_name: NVIDIA GB10         # null for none
        driver: "580.95.05"
        docker_version: "28.3.3"
        netdevs: {enp1s0f1np1: {ipv4: [192.168.177.11/24], mtu: 9000}}
        roce: {rocep1s0f1: {netdev: enp1s0f1np1, gid_index: 3}}
        units: [docker.service, sparkdeploy-engine.service]
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping

from sparkdeploy.node.probes import NetDev  # the parsers of raw node output are in probes, one per fact

GIB = 1 << 30

# Nominal GB10 (DGX Spark), the 128 GB model: the kernel reports about 119.7 GiB MemTotal (`free -h` shows 119Gi)
# and a headless idle box with dropped caches about 116 GiB MemAvailable. Estimates, used only when nothing was
# measured (`plan` labels them "nominal"); a 64 GB Spark is planned from its own facts (`plan --facts`, gather).
NOMINAL_GB10_MEM_TOTAL_BYTES = int(119.7 * GIB)
NOMINAL_GB10_MEM_AVAILABLE_BYTES = int(116.0 * GIB)
NOMINAL_GB10_DRIVER = "580.95.05"
# Simulated node: a container on a small VM; memory is the host's, shared by both nodes.
NOMINAL_SIM_MEM_TOTAL_BYTES = 24 * GIB
NOMINAL_SIM_MEM_AVAILABLE_BYTES = 20 * GIB


@dataclass(frozen=True)
class RoceDev:
    name: str
    netdev: str | None = None
    port: int = 1
    gid_index: int | None = None  # RoCE v2 GID whose value is IPv4-mapped (::ffff:a.b.c.d); None if none/unknown


@dataclass(frozen=True)
class NodeFacts:
    node: str
    mem_total_bytes: int
    mem_available_bytes: int | None
    has_gpu: bool
    gpu_name: str | None = None
    driver: str | None = None
    docker_version: str | None = None
    netdevs: tuple[NetDev, ...] = ()
    roce: tuple[RoceDev, ...] = ()
    units: tuple[str, ...] = ()
    source: str = "nominal"  # nominal | file:<path> | ssh

    @property
    def mem_total_gib(self) -> float:
        return self.mem_total_bytes / GIB

    @property
    def mem_available_gib(self) -> float | None:
        return None if self.mem_available_bytes is None else self.mem_available_bytes / GIB

    def netdev(self, name: str) -> NetDev | None:
        return next((d for d in self.netdevs if d.name == name), None)

    def roce_dev(self, name: str) -> RoceDev | None:
        return next((d for d in self.roce if d.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ------------------------------------------------------------------------------------------- nominal
def nominal_gb10(node: Any) -> NodeFacts:
    """Nominal facts for a GB10 node of the inventory: each link's netdev carries its address, MTU 9000, GIDs
    unknown."""
    return NodeFacts(
        node=node.name,
        mem_total_bytes=NOMINAL_GB10_MEM_TOTAL_BYTES,
        mem_available_bytes=NOMINAL_GB10_MEM_AVAILABLE_BYTES,
        has_gpu=True,
        gpu_name="NVIDIA GB10",
        driver=NOMINAL_GB10_DRIVER,
        netdevs=_link_netdevs(node, 9000),
        roce=tuple(RoceDev(dev, None, 1, None) for link in node.data_links() for dev in link.hca),
        source="nominal",
    )


def nominal_sim(node: Any) -> NodeFacts:
    """Nominal facts for a simulated (gpu: none) node."""
    return NodeFacts(
        node=node.name,
        mem_total_bytes=NOMINAL_SIM_MEM_TOTAL_BYTES,
        mem_available_bytes=NOMINAL_SIM_MEM_AVAILABLE_BYTES,
        has_gpu=False,
        netdevs=_link_netdevs(node, 1500),
        source="nominal",
    )


def _link_netdevs(node: Any, mtu: int) -> tuple[NetDev, ...]:
    return tuple(NetDev(link.netdev, (f"{link.ip}/{link.prefix}",), mtu, True) for link in node.data_links())


def nominal(node: Any) -> NodeFacts:
    return nominal_gb10(node) if node.gpu != "none" else nominal_sim(node)


# ------------------------------------------------------------------------------------------ facts file
def facts_for(nodes: Iterable[Any], given: Mapping[str, NodeFacts] | None = None) -> dict[str, NodeFacts]:
    """Facts for every inventory node: the given ones where present, nominal ones for the rest."""
    given = given or {}
    return {n.name: given.get(n.name) or nominal(n) for n in nodes}
