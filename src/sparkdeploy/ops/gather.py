"""Read a node's facts (memory, GPU, driver, netdevs, RoCE GIDs, docker, units) and turn them into `NodeFacts`.

One round trip per node: `probes.GATHER_SECTIONS`, a subset of doctor's probe sections, read by the same
`facts.from_probe` doctor plans on.
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


def gather(conn: Conn, node: Any) -> F.NodeFacts:
    """Read one node's facts over its connection."""
    out = conn.query(probes.gather_argv(), timeout=60).stdout
    avail = None
    if isinstance(conn, LocalConn):
        import psutil

        avail = psutil.virtual_memory().available
    return F.from_probe(node, probes.HostFacts.from_output(node.name, out), mem_available=avail)


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
