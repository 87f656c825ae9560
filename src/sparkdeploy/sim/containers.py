"""The sim nodes' containers on the host's Docker engine: the network, each node's container, its boot time
and readiness (systemd, ssh, docker). Functions of a node record (`name`, `ip`, `container`, `volume`), so
`SimCluster` keeps only the cluster's own state and SSH access."""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import time
from pathlib import Path

from sparkdeploy.errors import SimError
from sparkdeploy.sim._proc import Reporter, run

CLUSTER_LABEL = "sparkdeploy.sim.cluster"
NODE_LABEL = "sparkdeploy.sim.node"
NODE_SHM = "2g"  # a real host has a big /dev/shm; engines run with --ipc host
READY_TIMEOUT = 180.0

# What worked where --privileged is refused (DESIGN.md, reference/cluster-sim-feasibility.md B.2).
NODE_RUN_OPTS = (
    "--cap-add", "ALL", "--cap-drop", "SYS_RESOURCE",
    "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
    "--security-opt", "systempaths=unconfined",
    "--device-cgroup-rule", "a *:* rwm",
    "--cgroupns=host", "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
    "--tmpfs", "/run", "--tmpfs", "/run/lock", "--tmpfs", "/tmp",
    "--restart", "unless-stopped", "--stop-timeout", "30",
)


def docker(*args: str, what: str, check: bool = True, timeout: float = 120, input: bytes | None = None):
    return run(["docker", *args], what=what, check=check, timeout=timeout, input=input)


def pid1_start_ticks(stat_line: str) -> int:
    """PID 1's start time (clock ticks since the host booted) from /proc/1/stat: changes on every node reboot.

    boot_id and /proc/uptime belong to the host's kernel and do not change when a node container restarts.
    """
    rest = stat_line[stat_line.rindex(")") + 2:].split()
    return int(rest[19])  # field 22 of proc(5); rest starts at field 3


def _host_btime() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0


def ticks_to_epoch(ticks: int) -> float:
    return _host_btime() + ticks / os.sysconf("SC_CLK_TCK")


def ensure_network(network: str, cluster: str, want: str | None, mtu: int | None = None) -> str:
    """The cluster's bridge network (created on a free /24 unless `want`); returns its subnet."""
    done = docker("network", "inspect", network, "--format", "{{range .IPAM.Config}}{{.Subnet}}{{end}}",
                  what="docker network inspect", check=False)
    if done.rc == 0 and done.out.strip():
        return done.out.strip()
    taken = taken_subnets()
    candidates = [want] if want else subnet_candidates(cluster)
    for cand in candidates:
        net = ipaddress.ip_network(cand, strict=False)
        if any(net.overlaps(t) for t in taken):
            if want:
                raise SimError(f"subnet {want} overlaps an existing Docker network; pick another with --subnet")
            continue
        gateway = str(net.network_address + 1)
        opts = ["--opt", f"com.docker.network.driver.mtu={mtu}"] if mtu else []
        created = docker("network", "create", "--driver", "bridge", "--subnet", str(net), "--gateway", gateway,
                         *opts, "--label", f"{CLUSTER_LABEL}={cluster}", network,
                         what="docker network create", check=False)
        if created.rc == 0:
            return str(net)
        if want or "overlap" not in created.err.lower():
            raise SimError(f"cannot create network {network} ({net}): {created.err.strip()[:300]}")
    raise SimError("no free /24 in 172.30.100.0-172.30.249.0 for the sim network; pass --subnet")

def subnet_candidates(cluster: str) -> list[str]:
    start = int(hashlib.sha256(cluster.encode()).hexdigest(), 16) % 150
    return [f"172.30.{100 + (start + k) % 150}.0/24" for k in range(150)]

def taken_subnets() -> list:
    ids = docker("network", "ls", "-q", what="docker network ls").out.split()
    if not ids:
        return []
    out = docker("network", "inspect", "--format", "{{range .IPAM.Config}}{{.Subnet}} {{end}}", *ids,
                 what="docker network inspect").out
    nets = []
    for tok in out.split():
        try:
            nets.append(ipaddress.ip_network(tok, strict=False))
        except ValueError:
            pass
    return [n for n in nets if n.version == 4]


def cluster_networks(cluster: str) -> list[str]:
    """The cluster's Docker networks (found by label): the management network and, on a ring, one per link."""
    out = docker("network", "ls", "--filter", f"label={CLUSTER_LABEL}={cluster}", "--format", "{{.Name}}",
                 what="docker network ls").out
    return sorted(out.split())


def cluster_containers(cluster: str) -> list[str]:
    out = docker("ps", "-a", "--filter", f"label={CLUSTER_LABEL}={cluster}", "--format", "{{.Names}}",
                 what="docker ps").out
    return sorted(out.split())


def mounted_volumes(names: list[str]) -> list[str]:
    """The named volumes these containers mount."""
    if not names:
        return []
    out = docker("inspect", "-f", "{{range .Mounts}}{{if .Name}}{{.Name}} {{end}}{{end}}", *names,
                 what="docker inspect of the sim nodes' mounts", check=False).out
    return out.split()


def remove_stale_nodes(cluster: str, keep: set[str], reporter: Reporter) -> None:
    for c in cluster_containers(cluster):
        if c not in keep:
            reporter.note(f"removing {c} (not part of the requested node list)")
            docker("rm", "-f", "-v", c, what=f"docker rm {c}")
            vol = f"{c}-docker"
            docker("volume", "rm", "-f", vol, what=f"docker volume rm {vol}", check=False)

def inspect(container: str) -> dict | None:
    done = docker("inspect", "--type", "container", container, what="docker inspect", check=False)
    if done.rc != 0:
        return None
    return json.loads(done.out)[0]

def ensure_node(node, image: str, network: str, cluster: str, reporter: Reporter, install_key) -> str:
    """Keep, start or (re)create a node's container; `install_key(node)` runs on every path."""
    info = inspect(node.container)
    if info is not None:
        same_image = info["Config"]["Image"] == image
        nets = info["NetworkSettings"]["Networks"]
        same_ip = nets.get(network, {}).get("IPAMConfig", {}) and \
            nets[network]["IPAMConfig"].get("IPv4Address") == node.ip
        if same_image and same_ip:
            how = "kept"
            if not info["State"]["Running"]:
                docker("start", node.container, what=f"{node.name}: docker start")
                how = "started"
            install_key(node)
            return how
        reporter.note(f"{node.name}: recreating (image or address changed); its Docker volume is kept")
        docker("rm", "-f", node.container, what=f"{node.name}: docker rm")
    docker("run", "-d", "--name", node.container, "--hostname", node.name, "--network", network,
           "--ip", node.ip, "--label", f"{CLUSTER_LABEL}={cluster}", "--label", f"{NODE_LABEL}={node.name}",
           "-v", f"{node.volume}:/var/lib/docker", "--shm-size", NODE_SHM, *NODE_RUN_OPTS, image,
           what=f"{node.name}: docker run of the node container (if this says 'operation not permitted', the "
           "host refuses the capability set; see DESIGN.md 'The simulated cluster')")
    install_key(node)
    return "created"


def attach_link(node, link, attempts: int = 20):
    """Connect the running node to a link network at its fixed address (kept when already there), then return
    the link with the netdev the node sees it on, read by address inside the node (sparkdeploy.sim.ring)."""
    from dataclasses import replace

    from sparkdeploy.sim.ring import netdev_for

    info = inspect(node.container) or {}
    have = (info.get("NetworkSettings", {}).get("Networks", {}).get(link.network) or {}).get("IPAMConfig") or {}
    if have.get("IPv4Address") != link.ip:
        if link.network in info.get("NetworkSettings", {}).get("Networks", {}):
            docker("network", "disconnect", "-f", link.network, node.container,
                   what=f"{node.name}: docker network disconnect {link.network}")
        docker("network", "connect", "--ip", link.ip, link.network, node.container,
               what=f"{node.name}: docker network connect {link.network} ({link.ip})")
    seen = ""
    for _ in range(attempts):  # the interface shows up inside the node a moment after `connect` returns
        seen = exec_in(node, "ip -o -4 addr show", timeout=10).out
        netdev = netdev_for(seen, link.ip)
        if netdev:
            return replace(link, netdev=netdev)
        time.sleep(0.25)
    raise SimError(f"{node.name}: no interface holds {link.ip} after connecting {link.network} (ip -o -4 addr "
                   f"show: {' | '.join(seen.splitlines())[:300]}); recreate with `sparkdeploy sim down && sparkdeploy "
                   "sim up --ring`")


def exec_in(node, script: str, timeout: float = 30):
    return docker("exec", node.container, "sh", "-c", script, what=f"{node.name}: docker exec", check=False,
                  timeout=timeout)


def wait_ready(node, reporter: Reporter, *, require_running: bool, after_ticks: int | None = None,
               timeout: float = READY_TIMEOUT) -> dict:
    """Wait until PID 1 is a (new) systemd, the system is up, ssh and docker are active. Returns what it saw."""
    deadline = time.monotonic() + timeout
    last = "container not running"
    while time.monotonic() < deadline:
        info = inspect(node.container)
        if info is None:
            raise SimError(f"{node.name}: container {node.container} is gone; run `sparkdeploy sim up`")
        if not info["State"]["Running"]:
            last = f"container state {info['State']['Status']}"
            time.sleep(0.3)
            continue
        stat = exec_in(node, "cat /proc/1/stat", timeout=10)
        if stat.rc != 0:
            last = "cannot read /proc/1/stat"
            time.sleep(0.3)
            continue
        ticks = pid1_start_ticks(stat.out)
        if after_ticks is not None and ticks <= after_ticks:
            last = "PID 1 has not restarted yet"
            time.sleep(0.3)
            continue
        left = max(5, int(deadline - time.monotonic()))
        sysstate = exec_in(node, f"timeout {left} systemctl is-system-running --wait", timeout=left + 5)
        state = sysstate.out.strip()
        if state in ("initializing", "starting", "") or "Failed to connect" in sysstate.err:
            last = f"systemd {state or 'not answering'}"
            time.sleep(0.3)
            continue
        if state != "running":
            failed = exec_in(node, "systemctl --failed --no-legend --plain | cut -d' ' -f1").out.split()
            if require_running or state not in ("degraded",):
                raise SimError(f"{node.name}: systemd is {state!r}, failed units: {', '.join(failed) or 'none'}; "
                               f"look with `sparkdeploy sim ssh {node.name} -- journalctl -b -p err` "
                               f"(or recreate: `sparkdeploy sim down && sparkdeploy sim up`)")
            reporter.note(f"{node.name}: systemd is degraded (failed: {', '.join(failed)})")
        units = exec_in(node, "systemctl is-active ssh docker").out.split()
        if units != ["active", "active"]:
            last = f"ssh/docker units: {' '.join(units)}"
            time.sleep(0.3)
            continue
        return {"pid1_ticks": ticks, "system": state}
    raise SimError(f"{node.name}: not ready after {timeout:.0f} s ({last}); see `docker logs {node.container}` "
                   f"or recreate it with `sparkdeploy sim down && sparkdeploy sim up`")

