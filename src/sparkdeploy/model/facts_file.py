"""`--facts FILE` (plan, doctor): what gather would read on each node, given as YAML, in the shape
`model/schema.FactsFile` declares (`nodes: {name: {mem_total_gib, netdevs, roce, units, ...}}`)."""

from __future__ import annotations

from pathlib import Path

from sparkdeploy import yamlfile
from sparkdeploy.model.fields import read
from sparkdeploy.model.schema import FactsFile
from sparkdeploy.node.facts import NodeFacts, RoceDev
from sparkdeploy.node.probes import NetDev


def load_facts_file(path: str | Path) -> dict[str, NodeFacts]:
    """Read a facts YAML into {node name: NodeFacts}, through the hardened loader the inventory uses (bounded
    read, regular files only, no duplicate keys, no alias bombs)."""
    file = str(path)
    facts = read(FactsFile, yamlfile.load(path, "facts"), "", file)
    out = {}
    for name, e in facts.nodes.items():
        out[name] = NodeFacts(
            node=name, mem_total_bytes=e.bytes("mem_total"), mem_available_bytes=e.bytes("mem_available"),
            has_gpu=e.has_gpu if e.has_gpu is not None else e.gpu_name is not None, gpu_name=e.gpu_name,
            driver=e.driver, docker_version=e.docker_version,
            netdevs=tuple(NetDev(dev, n.ipv4, n.mtu, n.up) for dev, n in e.netdevs.items()),
            roce=tuple(RoceDev(dev, r.netdev, r.port, r.gid_index) for dev, r in e.roce.items()),
            units=e.units, source=f"file:{file}")
    return out
