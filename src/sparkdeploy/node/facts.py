"""What the planner needs to know about a node, as plain frozen data.

`NodeFacts` is filled three ways: `nominal(node)` (a built-in nominal GB10 or simulated node, the default so
`plan` works with no node reachable), `model/facts_file.load_facts_file(path)` (YAML, `plan --facts FILE`, shaped
by `model/schema.FactsFile`), or `from_probe(node, host_facts)` from a node's probe sections (`probes.SECTIONS`:
`/proc/meminfo`, `ip -o link`/`ip -o -4 addr`, the RoCE ports' GIDs, nvidia-smi, docker, enabled units), which
`gather` (for `up` and `plan`) and `doctor` both read, so both plan on the same facts.
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

from sparkdeploy.node import probes
from sparkdeploy.node.probes import HostFacts, NetDev  # the parsers of raw node output are in probes

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


# ------------------------------------------------------------------------------------------- probed
def from_probe(node: Any, probed: HostFacts, *, mem_available: int | None = None) -> NodeFacts:
    """NodeFacts for inventory node `node` from its probe sections (pure). Each RoCE device's GID is judged by
    the addresses of its own netdev (a ring node's second link, a CX-7 twin's own /24), falling back to the
    address of the inventory link that names it; the inventory's HCAs come first, in link order."""
    mem = probes.parse_meminfo(probed.text("meminfo"))
    netdevs = probes.parse_netdevs(probed.text("links"), probed.text("addrs"))
    gpus = probes.parse_nvidia_smi(probed.text("gpu"))[:1] if probed.rc("gpu") == 0 else []
    ports = probes.parse_rdma(probed.text("rdma"))
    ipv4_of = {d.name: d.ipv4 for d in netdevs}
    link_ip = {dev: ip for _, ip, hca in _links(node) for dev in hca}
    named = [dev for dev in link_ip if dev in ports]
    roce = tuple(
        RoceDev(dev, ports[dev].netdev, ports[dev].port,
                probes.port_gid_index(ports[dev], probes.twin_addresses(ports[dev].netdev, ipv4_of, link_ip.get(dev))))
        for dev in (*named, *sorted(set(ports) - set(named))))
    return NodeFacts(
        node=node.name,
        mem_total_bytes=mem.get("MemTotal", 0),
        mem_available_bytes=mem_available if mem_available is not None else mem.get("MemAvailable"),
        has_gpu=bool(gpus),
        gpu_name=gpus[0].name if gpus else None,
        driver=(gpus[0].driver or None) if gpus else None,
        docker_version=probed.kv("docker").get("server") or None,
        netdevs=netdevs,
        roce=roce,
        units=tuple(probes.parse_units(probed.text("enabled_units"))),
        source="ssh" if mem_available is None else "local",
    )


def _links(node: Any) -> list[tuple[str | None, str | None, tuple[str, ...]]]:
    """(netdev, address, HCAs) of each data link of an inventory node (or of anything with data_ip/netdev/hca)."""
    if hasattr(node, "data_links"):
        return [(link.netdev, link.ip, link.hca) for link in node.data_links()]
    return [(getattr(node, "netdev", None), getattr(node, "data_ip", None), tuple(getattr(node, "hca", ())))]
