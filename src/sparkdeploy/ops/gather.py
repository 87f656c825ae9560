"""Read a node's facts (memory, GPU, driver, netdevs, RoCE GIDs, docker, units) and turn them into `NodeFacts`.

One round trip per node: `probes.GATHER_SECTIONS`, in the probe's one `@@@` grammar; the pure parsers in `probes`
read them (the same meminfo parser and GID rule doctor uses).
For a node that is this machine the same script runs through the local connection; memory comes from
psutil (the same MemAvailable the kernel reports).
"""

from __future__ import annotations

import json
from typing import Any

from sparkdeploy.errors import RemoteError
from sparkdeploy.model.checkpoint import Checkpoint, detect
from sparkdeploy.node import facts as F
from sparkdeploy.node import probes
from sparkdeploy.remote.connection import Conn
from sparkdeploy.remote.ssh import LocalConn


def parse_gather(node: Any, text: str, *, mem_available: int | None = None) -> F.NodeFacts:
    """Turn the gather script's output into NodeFacts for inventory node `node` (pure)."""
    sec = probes.split_sections(text)

    def lines(name: str) -> list[str]:
        return probes.section_text(sec, name).splitlines()

    mem = probes.parse_meminfo(probes.section_text(sec, "meminfo"))
    netdevs = probes.parse_ip_addr_json(probes.section_text(sec, "ip") or "[]")
    gpus = probes.parse_nvidia_smi(probes.section_text(sec, "gpu"))[:1]  # the script keeps nvidia-smi's first line
    gpu_name, driver = (gpus[0].name, gpus[0].driver or None) if gpus else (None, None)
    docker_version = next((l.strip() for l in lines("docker") if l.strip()), None)
    units = tuple(l.strip() for l in lines("units") if l.strip())
    roce_lines = [l.split(None, 4) for l in lines("roce")]
    gids: dict[str, tuple[dict[int, str], dict[int, str]]] = {}
    for parts in roce_lines:
        if len(parts) == 5 and parts[0] == "gid" and parts[2].isdigit():
            g, t = gids.setdefault(parts[1], ({}, {}))
            g[int(parts[2])], t[int(parts[2])] = parts[3], parts[4]
    ndev_of = {p[1]: p[2] for p in roce_lines if len(p) >= 3 and p[0] == "ndev"}
    ipv4_of = {d.name: d.ipv4 for d in netdevs}
    roce = tuple(  # each link's HCAs, their GID judged by that link's own address (a ring node has two)
        F.RoceDev(dev, netdev, 1,
                  probes.roce_v2_ipv4_gid_index(*gids[dev], probes.twin_addresses(ndev_of.get(dev), ipv4_of, ip)))
        for netdev, ip, hca in _links(node) for dev in hca if dev in gids
    )
    return F.NodeFacts(
        node=node.name,
        mem_total_bytes=mem.get("MemTotal", 0),
        mem_available_bytes=mem_available if mem_available is not None else mem.get("MemAvailable"),
        has_gpu=gpu_name is not None,
        gpu_name=gpu_name,
        driver=driver,
        docker_version=docker_version,
        netdevs=netdevs,
        roce=roce,
        units=units,
        source="ssh" if mem_available is None else "local",
    )


def _links(node: Any) -> list[tuple[str | None, str | None, tuple[str, ...]]]:
    """(netdev, address, HCAs) of each data link of an inventory node (or of anything with data_ip/netdev/hca)."""
    if hasattr(node, "data_links"):
        return [(link.netdev, link.ip, link.hca) for link in node.data_links()]
    return [(getattr(node, "netdev", None), getattr(node, "data_ip", None), tuple(getattr(node, "hca", ())))]


def gather(conn: Conn, node: Any) -> F.NodeFacts:
    """Read one node's facts over its connection."""
    hcas = [dev for _, _, hca in _links(node) for dev in hca]
    out = conn.query(probes.gather_argv(hcas), timeout=60).stdout
    avail = None
    if isinstance(conn, LocalConn):
        import psutil

        avail = psutil.virtual_memory().available
    return parse_gather(node, out, mem_available=avail)


def checkpoint_facts(conn: Conn, host_dir: str | None) -> Checkpoint | None:
    """What the checkpoint on the head says about its own format (None: no host dir, or no config.json there)."""
    if not host_dir:
        return None
    sections = {"config": 'cat "$dir/config.json"', "hf_quant": 'cat "$dir/hf_quant_config.json" 2>/dev/null; true'}
    sec = probes.split_sections(conn.query(probes.named_probe_argv("checkpoint", sections, {"dir": host_dir}),
                                           check=False, timeout=30).stdout)
    if "config" not in sec or sec["config"].rc != 0:
        return None
    config_text, quant_text = sec["config"].text, probes.section_text(sec, "hf_quant")
    try:
        config = json.loads(config_text)
        quant = json.loads(quant_text) if quant_text.strip() else None
    except ValueError as err:
        raise RemoteError(f"{host_dir}/config.json (or hf_quant_config.json) is not JSON: {err}", node=conn.name) from None
    return detect(config, quant, source=f"{conn.name}:{host_dir}")
