"""What the planner needs to know about a node, as plain frozen data.

`NodeFacts` is filled three ways: `nominal(node)` (a built-in nominal GB10 or simulated node, the default so
`plan` works with no node reachable), `load_facts_file(path)` (YAML, `plan --facts FILE`), or by `gather`
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

import ipaddress
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from sparkdeploy import yamlfile
from sparkdeploy.errors import InventoryError
from sparkdeploy.node.probes import NetDev  # the parsers of raw node output are in probes, one per fact

GIB = 1 << 30
MAX_MEMORY_GIB = 1 << 16  # 64 TiB: far above any node, far below a float that int() cannot hold
MAX_ITEMS = 256  # netdevs, RDMA devices and units a node may list in a facts file

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
_FACT_KEYS = ("mem_total_gib", "mem_total_bytes", "mem_available_gib", "mem_available_bytes", "gpu_name", "driver",
              "docker_version", "netdevs", "roce", "units", "has_gpu")


def _fail(file: str, field_path: str, message: str) -> None:
    raise InventoryError(message, file=file, field=field_path)


def _memory(raw: dict, key: str, file: str, where: str, required: bool) -> int | None:
    gib, byte = raw.get(f"{key}_gib"), raw.get(f"{key}_bytes")
    if gib is not None and byte is not None:
        _fail(file, f"{where}.{key}_gib", f"give {key}_gib or {key}_bytes, not both")
    if gib is None and byte is None:
        if required:
            _fail(file, f"{where}.{key}_gib", "missing; expected GiB of memory (a number)")
        return None
    value = gib if gib is not None else byte
    name = f"{key}_gib" if gib is not None else f"{key}_bytes"
    limit = MAX_MEMORY_GIB if gib is not None else MAX_MEMORY_GIB * GIB
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= limit:
        _fail(file, f"{where}.{name}", f"expected a number above 0 and at most {limit}, got {_quote(value)}")
    return int(value * GIB) if gib is not None else int(value)


def _quote(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _opt_str(raw: dict, key: str, file: str, where: str) -> str | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, (str, int, float)) or isinstance(value, bool) or (
            isinstance(value, float) and not math.isfinite(value)):
        _fail(file, f"{where}.{key}", f"expected a string, got {_quote(value)}")
    return str(value)


def _mapping(raw: dict, key: str, file: str, where: str) -> dict:
    value = raw.get(key) or {}
    if not isinstance(value, dict) or len(value) > MAX_ITEMS:
        _fail(file, f"{where}.{key}", f"expected a mapping of at most {MAX_ITEMS} device names to their facts")
    for name in value:
        if not isinstance(name, str):
            _fail(file, f"{where}.{key}", f"device names are strings, got {_quote(name)}")
    return value


def _opt_int(spec: dict, key: str, lo: int, hi: int, file: str, where: str, default: int | None = None) -> int | None:
    value = spec.get(key, default)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi):
        _fail(file, f"{where}.{key}", f"expected an integer {lo}..{hi}, got {_quote(value)}")
    return value


def facts_from_dict(name: str, raw: Any, file: str = "<facts>") -> NodeFacts:
    where = f"nodes.{name}"
    if not isinstance(raw, dict):
        _fail(file, where, "expected a mapping of facts")
    for key in raw:
        if key not in _FACT_KEYS:
            _fail(file, f"{where}.{str(key)[:60]}", f"unknown key; allowed: {', '.join(_FACT_KEYS)}")
    total = _memory(raw, "mem_total", file, where, required=True)
    available = _memory(raw, "mem_available", file, where, required=False)
    if available is not None and total is not None and available > total:
        _fail(file, f"{where}.mem_available_gib", "larger than mem_total")
    netdevs = []
    for dev, spec in _mapping(raw, "netdevs", file, where).items():
        spec = spec or {}
        at = f"{where}.netdevs.{dev[:60]}"
        if not isinstance(spec, dict) or set(spec) - {"ipv4", "mtu", "up"}:
            _fail(file, at, "expected {ipv4: [a.b.c.d/n], mtu: N, up: bool}")
        ipv4 = spec.get("ipv4") or []
        if isinstance(ipv4, str):
            ipv4 = [ipv4]
        if not isinstance(ipv4, list) or len(ipv4) > MAX_ITEMS:
            _fail(file, f"{at}.ipv4", f"expected a list of at most {MAX_ITEMS} IPv4 addresses")
        for i, addr in enumerate(ipv4):
            try:
                ipaddress.IPv4Interface(addr)
            except (ValueError, TypeError):
                _fail(file, f"{at}.ipv4[{i}]", f"{_quote(addr)} is not an IPv4 address")
        up = spec.get("up")
        if up is not None and not isinstance(up, bool):
            _fail(file, f"{at}.up", f"expected true or false, got {_quote(up)}")
        netdevs.append(NetDev(dev, tuple(str(a) if "/" in str(a) else f"{a}/32" for a in ipv4),
                              _opt_int(spec, "mtu", 68, 65536, file, at), up))
    roce = []
    for dev, spec in _mapping(raw, "roce", file, where).items():
        spec = spec or {}
        at = f"{where}.roce.{dev[:60]}"
        if not isinstance(spec, dict) or set(spec) - {"netdev", "gid_index", "port"}:
            _fail(file, at, "expected {netdev: NAME, gid_index: N|null, port: 1}")
        netdev = spec.get("netdev")
        if netdev is not None and not isinstance(netdev, str):
            _fail(file, f"{at}.netdev", f"expected a netdev name, got {_quote(netdev)}")
        roce.append(RoceDev(dev, netdev, _opt_int(spec, "port", 1, 255, file, at, default=1),
                            _opt_int(spec, "gid_index", 0, 255, file, at)))
    units = raw.get("units") or []
    if not isinstance(units, list) or len(units) > MAX_ITEMS or not all(isinstance(u, str) for u in units):
        _fail(file, f"{where}.units", f"expected a list of at most {MAX_ITEMS} unit names")
    gpu_name = _opt_str(raw, "gpu_name", file, where)
    has_gpu = raw.get("has_gpu", gpu_name is not None)
    if not isinstance(has_gpu, bool):
        _fail(file, f"{where}.has_gpu", f"expected true or false, got {_quote(has_gpu)}")
    return NodeFacts(
        node=name, mem_total_bytes=total, mem_available_bytes=available, has_gpu=has_gpu, gpu_name=gpu_name,
        driver=_opt_str(raw, "driver", file, where), docker_version=_opt_str(raw, "docker_version", file, where),
        netdevs=tuple(netdevs), roce=tuple(roce), units=tuple(units), source=f"file:{file}",
    )


def load_facts_file(path: str | Path) -> dict[str, NodeFacts]:
    """Read a facts YAML (`nodes: {name: {...}}`) into {node name: NodeFacts}, through the hardened loader the
    inventory uses (bounded read, regular files only, no duplicate keys, no alias bombs)."""
    file = str(path)
    raw = yamlfile.load(path, "facts")
    if not isinstance(raw, dict) or set(raw) != {"nodes"} or not isinstance(raw["nodes"], dict):
        raise InventoryError("expected a mapping with one key, nodes: {name: facts}", file=file, field="nodes")
    if not all(isinstance(name, str) for name in raw["nodes"]):
        raise InventoryError("node names are strings", file=file, field="nodes")
    return {name: facts_from_dict(name, spec, file) for name, spec in raw["nodes"].items()}


def facts_for(nodes: Iterable[Any], given: Mapping[str, NodeFacts] | None = None) -> dict[str, NodeFacts]:
    """Facts for every inventory node: the given ones where present, nominal ones for the rest."""
    given = given or {}
    return {n.name: given.get(n.name) or nominal(n) for n in nodes}
