"""The sim nodes' containers on the host's Docker engine: the network, each node's container, its boot time
and readiness (systemd, ssh, docker). Functions of a node record (`name`, `ip`, `container`, `volume`), so
`SimCluster` keeps only the cluster's own state and SSH access."""

from __future__ import annotations

import hashlib
import ipaddress
import os
import time
from pathlib import Path

from sparkdeploy import poll
from sparkdeploy.errors import SimError
from sparkdeploy.sim import host_docker
from sparkdeploy.sim._proc import Reporter

CLUSTER_LABEL = "sparkdeploy.sim.cluster"
NODE_LABEL = "sparkdeploy.sim.node"
NODE_SHM = "2g"  # a real host has a big /dev/shm; engines run with --ipc host
READY_TIMEOUT = 180.0


def host_config(volume: str, network: str, *, node: bool = True) -> dict:
    """What worked where --privileged is refused (DESIGN.md, reference/cluster-sim-feasibility.md B.2): all
    capabilities but SYS_RESOURCE, no seccomp/AppArmor profile, no masked /proc paths (the CLI's
    `--security-opt systempaths=unconfined`), every device, the host's cgroup tree, tmpfs on /run, /run/lock and
    /tmp, dockerd's data on its own volume. A node is restarted unless stopped; anything else (a seed's loader
    running dockerd alone) gets docker's init, which passes `docker stop`'s signal on to it."""
    config = host_docker.api().create_host_config(
        cap_add=["ALL"], cap_drop=["CAP_SYS_RESOURCE"],
        security_opt=["seccomp=unconfined", "apparmor=unconfined"],
        device_cgroup_rules=["a *:* rwm"], cgroupns="host",
        binds={"/sys/fs/cgroup": {"bind": "/sys/fs/cgroup", "mode": "rw"},
               volume: {"bind": "/var/lib/docker", "mode": "rw"}},
        tmpfs={"/run": "", "/run/lock": "", "/tmp": ""},
        restart_policy={"Name": "unless-stopped"} if node else None, init=None if node else True,
        shm_size=NODE_SHM, network_mode=network)
    config["MaskedPaths"] = []  # what the CLI sends for systempaths=unconfined
    config["ReadonlyPaths"] = []
    return config


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
    api = host_docker.api()
    have = host_docker.inspect_or_none(api.inspect_network, network, f"docker network inspect {network}")
    if have and _subnets(have):
        return _subnets(have)[0]
    taken = taken_subnets()
    candidates = [want] if want else subnet_candidates(cluster)
    types = host_docker.sdk().types
    for cand in candidates:
        net = ipaddress.ip_network(cand, strict=False)
        if any(net.overlaps(t) for t in taken):
            if want:
                raise SimError(f"subnet {want} overlaps an existing Docker network; pick another with --subnet")
            continue
        ipam = types.IPAMConfig(pool_configs=[types.IPAMPool(subnet=str(net), gateway=str(net.network_address + 1))])
        try:
            api.create_network(network, driver="bridge", ipam=ipam, labels={CLUSTER_LABEL: cluster},
                               options={"com.docker.network.driver.mtu": str(mtu)} if mtu else None)
            return str(net)
        except host_docker.errors().APIError as err:
            text = str(err.explanation or err)
            if want or "overlap" not in text.lower():
                raise SimError(f"cannot create network {network} ({net}): {text.strip()[:300]}") from None
    raise SimError("no free /24 in 172.30.100.0-172.30.249.0 for the sim network; pass --subnet")


def _subnets(network: dict) -> list[str]:
    return [c["Subnet"] for c in (network.get("IPAM") or {}).get("Config") or () if c.get("Subnet")]


def subnet_candidates(cluster: str) -> list[str]:
    start = int(hashlib.sha256(cluster.encode()).hexdigest(), 16) % 150
    return [f"172.30.{100 + (start + k) % 150}.0/24" for k in range(150)]

def taken_subnets() -> list:
    networks = host_docker.call("docker network ls", host_docker.api().networks)
    nets = []
    for subnet in (s for n in networks for s in _subnets(n)):
        try:
            nets.append(ipaddress.ip_network(subnet, strict=False))
        except ValueError:
            pass
    return [n for n in nets if n.version == 4]


def cluster_networks(cluster: str) -> list[str]:
    """The cluster's Docker networks (found by label): the management network and, on a ring, one per link."""
    found = host_docker.call("docker network ls", host_docker.api().networks,
                             filters={"label": f"{CLUSTER_LABEL}={cluster}"})
    return sorted(n["Name"] for n in found)


def cluster_containers(cluster: str) -> list[str]:
    found = host_docker.call("docker ps", host_docker.api().containers, all=True,
                             filters={"label": f"{CLUSTER_LABEL}={cluster}"})
    return sorted(c["Names"][0].lstrip("/") for c in found)


def mounted_volumes(names: list[str]) -> list[str]:
    """The named volumes these containers mount."""
    mounts = [m for name in names for m in (inspect(name) or {}).get("Mounts") or ()]
    return [m["Name"] for m in mounts if m.get("Name")]


# What the engine answers while a killed container has not exited yet: it waits 10 s for the exit, and a node
# (systemd, its own dockerd and engines) on a loaded host can take longer (CI: `sim down` failed on it).
STILL_EXITING = ("did not receive an exit event", "is already in progress")
REMOVE_TIMEOUT = 120.0


def remove_container(container: str, what: str, *, volumes: bool = False) -> None:
    """`docker rm -f` (with `volumes`: and its anonymous volumes); a container already gone is fine, and one
    still exiting after its kill is removed once it has."""

    def removed() -> None:
        try:
            host_docker.api().remove_container(container, force=True, v=volumes)
        except host_docker.errors().NotFound:
            pass
        except host_docker.errors().APIError as err:
            if any(s in str(err.explanation or err) for s in STILL_EXITING):
                raise poll.NotYet(str(err.explanation or err)) from None
            raise host_docker.failed(what, err) from None
        except host_docker.engine_errors() as err:
            raise host_docker.failed(what, err) from None

    try:
        poll.until(removed, timeout=REMOVE_TIMEOUT, interval=2)
    except poll.TimedOut as out:
        raise SimError(f"{what} failed: the container had not exited {out.elapsed:.0f} s after its kill "
                       f"({out.last})") from None


def remove_volume(volume: str, what: str) -> None:
    """`docker volume rm -f`: a volume already gone is fine."""
    try:
        host_docker.api().remove_volume(volume, force=True)
    except host_docker.errors().NotFound:
        pass
    except host_docker.engine_errors() as err:
        raise host_docker.failed(what, err) from None


def remove_stale_nodes(cluster: str, keep: set[str], reporter: Reporter) -> None:
    for c in cluster_containers(cluster):
        if c not in keep:
            reporter.note(f"removing {c} (not part of the requested node list)")
            remove_container(c, f"docker rm {c}", volumes=True)
            vol = f"{c}-docker"
            try:
                remove_volume(vol, f"docker volume rm {vol}")
            except SimError as err:  # best effort, as before: the node is gone, a volume in use stays
                reporter.note(str(err))


def inspect(container: str) -> dict | None:
    return host_docker.inspect_or_none(host_docker.api().inspect_container, container, f"docker inspect {container}")


def ensure_node(node, image: str, network: str, cluster: str, reporter: Reporter, install_key) -> str:
    """Keep, start or (re)create a node's container; `install_key(node)` runs on every path."""
    api = host_docker.api()
    info = inspect(node.container)
    if info is not None:
        same_image = info["Config"]["Image"] == image
        nets = info["NetworkSettings"]["Networks"]
        same_ip = nets.get(network, {}).get("IPAMConfig", {}) and \
            nets[network]["IPAMConfig"].get("IPv4Address") == node.ip
        if same_image and same_ip:
            how = "kept"
            if not info["State"]["Running"]:
                host_docker.call(f"{node.name}: docker start", api.start, node.container)
                how = "started"
            install_key(node)
            return how
        reporter.note(f"{node.name}: recreating (image or address changed); its Docker volume is kept")
        remove_container(node.container, f"{node.name}: docker rm")
    what = (f"{node.name}: docker run of the node container (if this says 'operation not permitted', the host "
            "refuses the capability set; see DESIGN.md 'The simulated cluster')")
    endpoints = api.create_networking_config({network: api.create_endpoint_config(ipv4_address=node.ip)})
    created = host_docker.call(what, api.create_container, image, name=node.container, hostname=node.name,
                               labels={CLUSTER_LABEL: cluster, NODE_LABEL: node.name}, detach=True,
                               stop_timeout=30, host_config=host_config(node.volume, network),
                               networking_config=endpoints)
    host_docker.call(what, api.start, created["Id"])
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
        api = host_docker.api()
        if link.network in info.get("NetworkSettings", {}).get("Networks", {}):
            host_docker.call(f"{node.name}: docker network disconnect {link.network}",
                             api.disconnect_container_from_network, node.container, link.network, force=True)
        host_docker.call(f"{node.name}: docker network connect {link.network} ({link.ip})",
                         api.connect_container_to_network, node.container, link.network, ipv4_address=link.ip)
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
    """Run a shell script in the node's container as root (a Done; a stopped container answers rc 1)."""
    return host_docker.exec_run(node.container, ["sh", "-c", script], what=f"{node.name}: docker exec",
                                timeout=timeout)


def wait_ready(node, reporter: Reporter, *, require_running: bool, after_ticks: int | None = None,
               timeout: float = READY_TIMEOUT) -> dict:
    """Wait until PID 1 is a (new) systemd, the system is up, ssh and docker are active. Returns what it saw."""
    deadline = time.monotonic() + timeout

    def attempt() -> dict:
        info = inspect(node.container)
        if info is None:
            raise SimError(f"{node.name}: container {node.container} is gone; run `sparkdeploy sim up`")
        if not info["State"]["Running"]:
            raise poll.NotYet(f"container state {info['State']['Status']}")
        stat = exec_in(node, "cat /proc/1/stat", timeout=10)
        if stat.rc != 0 or ")" not in stat.out:  # an exec while PID 1 restarts can answer 0 with nothing
            raise poll.NotYet("cannot read /proc/1/stat")
        ticks = pid1_start_ticks(stat.out)
        if after_ticks is not None and ticks <= after_ticks:
            raise poll.NotYet("PID 1 has not restarted yet")
        left = max(5, int(deadline - time.monotonic()))
        sysstate = exec_in(node, f"timeout {left} systemctl is-system-running --wait", timeout=left + 5)
        state = sysstate.out.strip()
        if state in ("initializing", "starting", "") or "Failed to connect" in sysstate.err:
            raise poll.NotYet(f"systemd {state or 'not answering'}")
        if state != "running":
            failed = exec_in(node, "systemctl --failed --no-legend --plain | cut -d' ' -f1").out.split()
            if require_running or state not in ("degraded",):
                raise SimError(f"{node.name}: systemd is {state!r}, failed units: {', '.join(failed) or 'none'}; "
                               f"look with `sparkdeploy sim ssh {node.name} -- journalctl -b -p err` "
                               f"(or recreate: `sparkdeploy sim down && sparkdeploy sim up`)")
            reporter.note(f"{node.name}: systemd is degraded (failed: {', '.join(failed)})")
        units = exec_in(node, "systemctl is-active ssh docker").out.split()
        if units != ["active", "active"]:
            raise poll.NotYet(f"ssh/docker units: {' '.join(units)}")
        return {"pid1_ticks": ticks, "system": state}

    try:
        return poll.until(attempt, timeout=timeout, interval=0.3)
    except poll.TimedOut as out:
        raise SimError(f"{node.name}: not ready after {timeout:.0f} s ({out.last}); see `docker logs "
                       f"{node.container}` or recreate it with `sparkdeploy sim down && sparkdeploy sim up`") from None

