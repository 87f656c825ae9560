"""Read a node's facts (memory, GPU, driver, netdevs, RoCE GIDs, docker, units) and turn them into `NodeFacts`.

One round trip per node: a fixed script prints tagged sections; the pure parsers in `facts.py` read them.
For a node that is this machine the same script runs through the local connection; memory comes from
psutil (the same MemAvailable the kernel reports).
"""

from __future__ import annotations

import json
from typing import Any

from sparkdeploy import facts as F
from sparkdeploy.checkpoint import Checkpoint, detect
from sparkdeploy.errors import RemoteError
from sparkdeploy.remote import Conn, LocalConn

# $1.. are the node's RoCE devices (from the inventory, passed as argv, never spliced into the script).
_SCRIPT = r"""
echo '@@meminfo'; cat /proc/meminfo
echo '@@ip'; ip -j addr 2>/dev/null || echo '[]'
echo '@@gpu'; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1
echo '@@docker'; docker version --format '{{.Server.Version}}' 2>/dev/null
echo '@@units'; for l in /etc/systemd/system/*.wants/* /etc/systemd/system/*.requires/*; do [ -e "$l" ] && echo "${l##*/}"; done | sort -u
for dev in "$@"; do
  p=/sys/class/infiniband/$dev/ports/1
  [ -d "$p" ] || continue
  for g in "$p"/gids/*; do
    i=${g##*/}; t=$(cat "$p/gid_attrs/types/$i" 2>/dev/null) || continue
    printf '@@gid %s %s %s %s\n' "$dev" "$i" "$(cat "$g" 2>/dev/null)" "$t"
  done
  nd=$(ls "$p/gid_attrs/ndevs" >/dev/null 2>&1 && cat "$p"/gid_attrs/ndevs/0 2>/dev/null)
  printf '@@ndev %s %s\n' "$dev" "$nd"
done
echo '@@end'
"""


def _sections(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    key = None
    for line in text.splitlines():
        if line.startswith("@@gid ") or line.startswith("@@ndev "):
            out.setdefault(line.split()[0][2:], []).append(line)
            continue
        if line.startswith("@@"):
            key = line[2:].strip()
            out.setdefault(key, [])
            continue
        if key:
            out[key].append(line)
    return out


def parse_gather(node: Any, text: str, *, mem_available: int | None = None) -> F.NodeFacts:
    """Turn the gather script's output into NodeFacts for inventory node `node` (pure)."""
    sec = _sections(text)
    mem = F.parse_meminfo("\n".join(sec.get("meminfo", [])))
    netdevs = F.parse_ip_addr_json("\n".join(sec.get("ip", [])) or "[]")
    gpu_line = next((l for l in sec.get("gpu", []) if l.strip()), "")
    gpu_name, driver = (None, None)
    if gpu_line:
        parts = [p.strip() for p in gpu_line.split(",")]
        gpu_name, driver = parts[0], (parts[1] if len(parts) > 1 else None)
    docker_version = next((l.strip() for l in sec.get("docker", []) if l.strip()), None)
    units = tuple(l.strip() for l in sec.get("units", []) if l.strip())
    gids: dict[str, tuple[dict[int, str], dict[int, str]]] = {}
    for line in sec.get("gid", []):
        parts = line.split(None, 4)
        if len(parts) == 5 and parts[2].isdigit():
            g, t = gids.setdefault(parts[1], ({}, {}))
            g[int(parts[2])], t[int(parts[2])] = parts[3], parts[4]
    ip = getattr(node, "data_ip", None)
    roce = tuple(
        F.RoceDev(dev, getattr(node, "netdev", None), 1, F.roce_v2_ipv4_gid_index(*gids.get(dev, ({}, {})), ip))
        for dev in getattr(node, "hca", ()) if dev in gids
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


def gather(conn: Conn, node: Any) -> F.NodeFacts:
    """Read one node's facts over its connection."""
    out = conn.run(["sh", "-c", _SCRIPT, "gather", *getattr(node, "hca", ())], timeout=60).stdout
    avail = None
    if isinstance(conn, LocalConn):
        import psutil

        avail = psutil.virtual_memory().available
    return parse_gather(node, out, mem_available=avail)


def checkpoint_facts(conn: Conn, host_dir: str | None) -> Checkpoint | None:
    """What the checkpoint on the head says about its own format (None: no host dir, or no config.json there)."""
    if not host_dir:
        return None
    script = 'cat "$1/config.json" 2>/dev/null || exit 3; echo; echo @@hf_quant; cat "$1/hf_quant_config.json" 2>/dev/null'
    res = conn.run(["sh", "-c", script, "checkpoint", host_dir], check=False, timeout=30)
    if res.rc == 3:
        return None
    config_text, _, quant_text = res.stdout.partition("\n@@hf_quant\n")
    try:
        config = json.loads(config_text)
        quant = json.loads(quant_text) if quant_text.strip() else None
    except ValueError as err:
        raise RemoteError(f"{host_dir}/config.json (or hf_quant_config.json) is not JSON: {err}", node=conn.name) from None
    return detect(config, quant, source=f"{conn.name}:{host_dir}")
