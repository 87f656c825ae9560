"""The simulated cluster: N "DGX Spark" nodes as Docker containers on the host's engine.

Each node runs systemd as PID 1, OpenSSH (key only, its own host keys made at first boot) and its own dockerd
(overlay2 on a named volume, systemd cgroup driver, the host's resolver), on a user network with fixed IPs.
As on a DGX Spark, the login is a non-root user (`nvidia` by default) with passwordless sudo, not in the docker
group: every command the kit runs goes through `sudo -n`, as it must on real nodes; `--user root` logs in as root.
`--privileged` is refused on some hosts (CAP_SYS_RESOURCE missing from the bounding set), so nodes get the
capability set that works there (see DESIGN.md "The simulated cluster").

Docker objects are named `sparkdeploy-sim-<name>-...` and labelled `sparkdeploy.sim.cluster=<name>`, so a test
cluster and a demo cluster never collide. Local state (SSH key, known_hosts, state.json) lives in the state
directory, `$SPARKDEPLOY_SIM_STATE_DIR` or `<checkout>/.sparkdeploy/sim/<name>/`; the SSH key and known_hosts
live where a user keeps theirs, `~/.ssh/sparkdeploy-sim-<name>_ed25519` and `..._known_hosts`, and the inventory
names them with `~` paths, as a real inventory does.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import ipaddress
import json
import os
import re
import shlex
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

from sparkdeploy import paths
from sparkdeploy.errors import SimError
from sparkdeploy.sim import images
from sparkdeploy.sim.inventory_file import api_key_path
from sparkdeploy.sim._proc import Reporter, need_tool, run

DEFAULT_NAME = "demo"
DEFAULT_USER = "nvidia"  # the login of the shipped inventory.yaml (DGX OS asks for one at first boot)
USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,23}$")
NODE_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,30}$")
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


# Run on a node as root with the login name as $1 and our public key on stdin: the user DGX OS makes at first
# boot (home, bash, group sudo, sudo without password), our key its only authorized one. Idempotent.
_LOGIN_SCRIPT = r"""set -eu
u=$1
if [ "$u" = root ]; then home=/root; else
  id -u "$u" >/dev/null 2>&1 || useradd --create-home --shell /bin/bash --groups sudo "$u"
  printf '%s ALL=(ALL) NOPASSWD:ALL
' "$u" > "/etc/sudoers.d/90-sparkdeploy-$u"
  chmod 0440 "/etc/sudoers.d/90-sparkdeploy-$u"
  home=$(getent passwd "$u" | cut -d: -f6)
fi
install -d -m 0700 -o "$u" -g "$u" "$home/.ssh"
umask 077
cat > "$home/.ssh/authorized_keys"
chown "$u:$u" "$home/.ssh/authorized_keys"
"""


def cluster_name(name: str | None = None) -> str:
    """The cluster's name: the argument, else $SPARKDEPLOY_SIM_NAME, else 'demo'; validated."""
    value = name or os.environ.get("SPARKDEPLOY_SIM_NAME") or DEFAULT_NAME
    if not NAME_RE.match(value):
        raise SimError(f"sim cluster name {value!r} is invalid: use 1-24 lowercase letters, digits and '-' "
                       "(option --name or $SPARKDEPLOY_SIM_NAME)")
    return value


def default_state_dir(name: str) -> Path:
    env = os.environ.get("SPARKDEPLOY_SIM_STATE_DIR")
    if env:
        return Path(env).resolve()
    return paths.state_dir() / "sim" / name


@dataclass
class SimNode:
    name: str
    ip: str
    container: str
    volume: str
    role: str  # head | worker

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class SimState:
    name: str
    subnet: str
    network: str
    image: str
    nodes: list[SimNode]
    key: str
    known_hosts: str
    inventory: str | None
    profile: str
    created: float = field(default_factory=time.time)
    user: str = "root"  # the SSH login; a state file from before logins other than root has none

    def node(self, name: str) -> SimNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise SimError(f"no node {name!r} in sim cluster {self.name!r}; nodes: {', '.join(n.name for n in self.nodes)}")

    @property
    def head(self) -> SimNode:
        return self.nodes[0]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["nodes"] = [n.to_dict() for n in self.nodes]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "SimState":
        d = dict(d)
        d["nodes"] = [SimNode(**n) for n in d["nodes"]]
        return cls(**d)


def _docker(*args: str, what: str, check: bool = True, timeout: float = 120, input: bytes | None = None):
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


class SimCluster:
    """One named simulated cluster. `up` is idempotent; every method raises SimError naming node and remedy."""

    def __init__(self, name: str | None = None, *, state_dir: Path | None = None, reporter: Reporter | None = None):
        self.name = cluster_name(name)
        self.prefix = f"sparkdeploy-sim-{self.name}"
        self.network = f"{self.prefix}-net"
        self.state_dir = Path(state_dir) if state_dir else default_state_dir(self.name)
        self.reporter = reporter or Reporter()
        self.user = DEFAULT_USER  # the SSH login; `load_state` sets the running cluster's

    # ------------------------------------------------------------------------------------------- state
    @property
    def state_file(self) -> Path:
        return self.state_dir / "state.json"

    @property
    def key_path(self) -> Path:
        return Path.home() / ".ssh" / f"{self.prefix}_ed25519"

    @property
    def known_hosts_path(self) -> Path:
        return Path.home() / ".ssh" / f"{self.prefix}_known_hosts"

    def default_inventory(self) -> Path:
        if self.name == DEFAULT_NAME:
            return Path.cwd() / "inventory.sim.yaml"
        return self.state_dir / "inventory.sim.yaml"

    def load_state(self) -> SimState:
        try:
            state = SimState.from_dict(json.loads(self.state_file.read_text()))
        except FileNotFoundError:
            how = "sparkdeploy sim up" + (f" --name {self.name}" if self.name != DEFAULT_NAME else "")
            raise SimError(f"sim cluster {self.name!r} is not up (no {self.state_file}); run `{how}`") from None
        except (ValueError, TypeError, KeyError) as err:
            raise SimError(f"{self.state_file} is unreadable ({err}); run `sparkdeploy sim down` then `sim up`") from None
        self.user = state.user
        return state

    def _save_state(self, state: SimState) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state.to_dict(), indent=2) + "\n")
        tmp.replace(self.state_file)

    # ------------------------------------------------------------------------------------------- up
    def up(self, nodes: int = 2, *, names: Sequence[str] | None = None, inventory: Path | None = None,
           subnet: str | None = None, profile: str = "sim-tiny", rebuild: bool = False,
           base_image_id: str | None = None, mtu: int | None = None, user: str = DEFAULT_USER) -> SimState:
        """Build (or reuse) the node image, start the nodes, wait for systemd + SSH + docker, write the inventory.

        `base_image_id` pins the inventory's serving-image base to the engine base image's ID. `mtu` (e.g. 9000,
        as on a CX-7 data plane) applies when the network is created; an existing network keeps its own. `user`
        is the SSH login made on every node (passwordless sudo; `root`: log in as root).
        """
        if not USER_RE.match(user):
            raise SimError(f"login name {user!r} is invalid: use lowercase letters, digits, '_' and '-' (option --user)")
        images.check_docker()
        need_tool("ssh", "openssh-client")
        need_tool("ssh-keygen", "openssh-client")
        names = list(names) if names else [f"node{i}" for i in range(1, nodes + 1)]
        if not 1 <= len(names) <= 8:
            raise SimError(f"a sim cluster has 1 to 8 nodes, not {len(names)}")
        for n in names:
            if not NODE_NAME_RE.match(n):
                raise SimError(f"node name {n!r} is invalid: use lowercase letters, digits and '-', starting with a letter")
        if len(set(names)) != len(names):
            raise SimError(f"node names repeat: {', '.join(names)}")

        built = images.ensure_node_image(self.reporter, force=rebuild)
        image = built.ref
        self._ensure_key()
        previous = self._existing_state()
        self.user = user  # after reading the previous state, which sets its own
        with self.reporter.phase("network") as info:
            net_subnet = self._ensure_network(subnet or (previous.subnet if previous else None), mtu)
            info["detail"] = f"{self.network} {net_subnet}"
        net = ipaddress.ip_network(net_subnet)
        nodes_: list[SimNode] = []
        for i, n in enumerate(names):
            nodes_.append(SimNode(name=n, ip=str(net.network_address + 11 + i), container=f"{self.prefix}-{n}",
                                  volume=f"{self.prefix}-{n}-docker", role="head" if i == 0 else "worker"))
        self._remove_stale_nodes(keep={n.container for n in nodes_})
        with self.reporter.phase("start nodes", f"{len(nodes_)} x {image}") as info:
            started = [self._ensure_node(node, image) for node in nodes_]
            info["detail"] = ", ".join(f"{n.name} {n.ip} ({how})" for n, how in zip(nodes_, started))
        with self.reporter.phase("wait for systemd, ssh, docker"):
            self._parallel(lambda node: self._wait_ready(node, require_running=True), nodes_)
        with self.reporter.phase("known_hosts from host keys"):
            self._write_known_hosts(nodes_)
        with self.reporter.phase("check ssh by key (host keys verified)"):
            self._parallel(self._check_ssh, nodes_)
        inv_path = Path(inventory).resolve() if inventory else self.default_inventory()
        state = SimState(name=self.name, subnet=str(net), network=self.network, image=image, nodes=nodes_,
                         key=str(self.key_path), known_hosts=str(self.known_hosts_path), inventory=str(inv_path),
                         profile=profile, user=user)
        from sparkdeploy.sim.inventory_file import write_inventory

        with self.reporter.phase("write inventory", str(inv_path)):
            problem = write_inventory(state, inv_path, base_image_id, vocab_dir=self.state_dir)
        if problem:
            self.reporter.note(problem)
        self._save_state(state)
        return state

    def _existing_state(self) -> SimState | None:
        try:
            return self.load_state()
        except SimError:
            return None

    def _ensure_key(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.state_dir, 0o700)
        self.key_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not self.key_path.exists():
            run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"sparkdeploy-sim-{self.name}", "-f",
                 str(self.key_path)], what="ssh-keygen")

    def _ensure_network(self, want: str | None, mtu: int | None = None) -> str:
        done = _docker("network", "inspect", self.network, "--format", "{{range .IPAM.Config}}{{.Subnet}}{{end}}",
                       what="docker network inspect", check=False)
        if done.rc == 0 and done.out.strip():
            return done.out.strip()
        taken = self._taken_subnets()
        candidates = [want] if want else self._subnet_candidates()
        for cand in candidates:
            net = ipaddress.ip_network(cand, strict=False)
            if any(net.overlaps(t) for t in taken):
                if want:
                    raise SimError(f"subnet {want} overlaps an existing Docker network; pick another with --subnet")
                continue
            gateway = str(net.network_address + 1)
            opts = ["--opt", f"com.docker.network.driver.mtu={mtu}"] if mtu else []
            created = _docker("network", "create", "--driver", "bridge", "--subnet", str(net), "--gateway", gateway,
                              *opts, "--label", f"{CLUSTER_LABEL}={self.name}", self.network,
                              what="docker network create", check=False)
            if created.rc == 0:
                return str(net)
            if want or "overlap" not in created.err.lower():
                raise SimError(f"cannot create network {self.network} ({net}): {created.err.strip()[:300]}")
        raise SimError("no free /24 in 172.30.100.0-172.30.249.0 for the sim network; pass --subnet")

    def _subnet_candidates(self) -> list[str]:
        start = int(hashlib.sha256(self.name.encode()).hexdigest(), 16) % 150
        return [f"172.30.{100 + (start + k) % 150}.0/24" for k in range(150)]

    @staticmethod
    def _taken_subnets() -> list:
        ids = _docker("network", "ls", "-q", what="docker network ls").out.split()
        if not ids:
            return []
        out = _docker("network", "inspect", "--format", "{{range .IPAM.Config}}{{.Subnet}} {{end}}", *ids,
                      what="docker network inspect").out
        nets = []
        for tok in out.split():
            try:
                nets.append(ipaddress.ip_network(tok, strict=False))
            except ValueError:
                pass
        return [n for n in nets if n.version == 4]

    def _containers(self) -> list[str]:
        out = _docker("ps", "-a", "--filter", f"label={CLUSTER_LABEL}={self.name}", "--format", "{{.Names}}",
                      what="docker ps").out
        return sorted(out.split())

    def _remove_stale_nodes(self, keep: set[str]) -> None:
        for c in self._containers():
            if c not in keep:
                self.reporter.note(f"removing {c} (not part of the requested node list)")
                _docker("rm", "-f", "-v", c, what=f"docker rm {c}")
                vol = f"{c}-docker"
                _docker("volume", "rm", "-f", vol, what=f"docker volume rm {vol}", check=False)

    def _inspect(self, container: str) -> dict | None:
        done = _docker("inspect", "--type", "container", container, what="docker inspect", check=False)
        if done.rc != 0:
            return None
        return json.loads(done.out)[0]

    def _ensure_node(self, node: SimNode, image: str) -> str:
        info = self._inspect(node.container)
        if info is not None:
            same_image = info["Config"]["Image"] == image
            nets = info["NetworkSettings"]["Networks"]
            same_ip = nets.get(self.network, {}).get("IPAMConfig", {}) and \
                nets[self.network]["IPAMConfig"].get("IPv4Address") == node.ip
            if same_image and same_ip:
                how = "kept"
                if not info["State"]["Running"]:
                    _docker("start", node.container, what=f"{node.name}: docker start")
                    how = "started"
                self._install_key(node)
                return how
            self.reporter.note(f"{node.name}: recreating (image or address changed); its Docker volume is kept")
            _docker("rm", "-f", node.container, what=f"{node.name}: docker rm")
        _docker("run", "-d", "--name", node.container, "--hostname", node.name, "--network", self.network,
                "--ip", node.ip, "--label", f"{CLUSTER_LABEL}={self.name}", "--label", f"{NODE_LABEL}={node.name}",
                "-v", f"{node.volume}:/var/lib/docker", "--shm-size", NODE_SHM, *NODE_RUN_OPTS, image,
                what=f"{node.name}: docker run of the node container (if this says 'operation not permitted', the "
                     "host refuses the capability set; see DESIGN.md 'The simulated cluster')")
        self._install_key(node)
        return "created"

    def _install_key(self, node: SimNode) -> None:
        """Make the login user (a sudoer without password, as DGX OS's first user) and authorize our key for it."""
        pub = Path(f"{self.key_path}.pub").read_bytes()
        _docker("exec", "-i", node.container, "sh", "-c", _LOGIN_SCRIPT, "login", self.user, input=pub,
                what=f"{node.name}: make the login user {self.user} and install the SSH key")

    # ------------------------------------------------------------------------------------------ waiting
    def _exec(self, node: SimNode, script: str, timeout: float = 30):
        return _docker("exec", node.container, "sh", "-c", script, what=f"{node.name}: docker exec", check=False,
                       timeout=timeout)

    def _wait_ready(self, node: SimNode, *, require_running: bool, after_ticks: int | None = None,
                    timeout: float = READY_TIMEOUT) -> dict:
        """Wait until PID 1 is a (new) systemd, the system is up, ssh and docker are active. Returns what it saw."""
        deadline = time.monotonic() + timeout
        last = "container not running"
        while time.monotonic() < deadline:
            info = self._inspect(node.container)
            if info is None:
                raise SimError(f"{node.name}: container {node.container} is gone; run `sparkdeploy sim up`")
            if not info["State"]["Running"]:
                last = f"container state {info['State']['Status']}"
                time.sleep(0.3)
                continue
            stat = self._exec(node, "cat /proc/1/stat", timeout=10)
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
            sysstate = self._exec(node, f"timeout {left} systemctl is-system-running --wait", timeout=left + 5)
            state = sysstate.out.strip()
            if state in ("initializing", "starting", "") or "Failed to connect" in sysstate.err:
                last = f"systemd {state or 'not answering'}"
                time.sleep(0.3)
                continue
            if state != "running":
                failed = self._exec(node, "systemctl --failed --no-legend --plain | cut -d' ' -f1").out.split()
                if require_running or state not in ("degraded",):
                    raise SimError(f"{node.name}: systemd is {state!r}, failed units: {', '.join(failed) or 'none'}; "
                                   f"look with `sparkdeploy sim ssh {node.name} -- journalctl -b -p err` "
                                   f"(or recreate: `sparkdeploy sim down && sparkdeploy sim up`)")
                self.reporter.note(f"{node.name}: systemd is degraded (failed: {', '.join(failed)})")
            units = self._exec(node, "systemctl is-active ssh docker").out.split()
            if units != ["active", "active"]:
                last = f"ssh/docker units: {' '.join(units)}"
                time.sleep(0.3)
                continue
            return {"pid1_ticks": ticks, "system": state}
        raise SimError(f"{node.name}: not ready after {timeout:.0f} s ({last}); see `docker logs {node.container}` "
                       f"or recreate it with `sparkdeploy sim down && sparkdeploy sim up`")

    def _write_known_hosts(self, nodes: list[SimNode]) -> None:
        lines = []
        for node in nodes:
            keys = self._exec(node, "cat /etc/ssh/ssh_host_*_key.pub")
            if keys.rc != 0 or not keys.out.strip():
                raise SimError(f"{node.name}: no SSH host keys in /etc/ssh (sparkdeploy-ssh-hostkeys.service failed?)")
            for line in keys.out.splitlines():
                parts = line.split()
                if len(parts) >= 2:
                    lines.append(f"{node.ip} {parts[0]} {parts[1]}")
        tmp = self.known_hosts_path.with_suffix(".tmp")
        tmp.write_text("\n".join(lines) + "\n")
        tmp.replace(self.known_hosts_path)

    def ssh_argv(self, node: SimNode, command: Sequence[str] | str | None = None, *, tty: bool = False) -> list[str]:
        """The OpenSSH command line for a node: our key only, host key checked against our known_hosts. A command
        runs as root through `sudo -n` when the login is another user (as the kit's own commands do)."""
        argv = ["ssh", "-i", str(self.key_path), "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=yes",
                "-o", f"UserKnownHostsFile={self.known_hosts_path}", "-o", "GlobalKnownHostsFile=/dev/null",
                "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR"]
        argv += ["-t"] if tty else ["-o", "BatchMode=yes"]
        argv.append(f"{self.user}@{node.ip}")
        if command:
            script = command if isinstance(command, str) else shlex.join(command)
            argv.append(script if self.user == "root" else shlex.join(["sudo", "-n", "--", "sh", "-c", script]))
        return argv

    def _check_ssh(self, node: SimNode, attempts: int = 20) -> None:
        err = ""
        for _ in range(attempts):
            done = run(self.ssh_argv(node, "systemctl is-system-running"), what=f"{node.name}: ssh", check=False,
                       timeout=30)
            if done.rc == 0 or done.out.strip() in ("running", "degraded"):
                return
            err = (done.err or done.out).strip()
            if "REMOTE HOST IDENTIFICATION HAS CHANGED" in err or "Host key verification failed" in err:
                break
            time.sleep(0.5)
        raise SimError(f"{node.name}: ssh {self.user}@{node.ip} by key failed: {err[-300:]}; check `docker logs "
                       f"{node.container}`, or `sparkdeploy sim down && sparkdeploy sim up`")

    def _parallel(self, fn, nodes: list[SimNode]) -> list:
        with cf.ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
            futures = [pool.submit(fn, n) for n in nodes]
            return [f.result() for f in futures]

    # --------------------------------------------------------------------------------------------- use
    def ssh(self, node_name: str, command: Sequence[str] | str | None = None, *, interactive: bool = False) -> int:
        """Run a command (or a login shell) on a node with the terminal attached; return its exit code."""
        state = self.load_state()
        node = state.node(node_name)
        return subprocess.call(self.ssh_argv(node, command, tty=interactive))

    def run_on(self, node_name: str, command: Sequence[str] | str, *, timeout: float = 120, check: bool = True):
        """Run a command on a node over SSH and capture its output (a `_proc.Done`)."""
        state = self.load_state()
        node = state.node(node_name)
        return run(self.ssh_argv(node, command), what=f"{node.name}: ssh {command if isinstance(command, str) else shlex.join(command)}"[:200],
                   timeout=timeout, check=check)

    def reboot(self, which: Sequence[str] | str = "all", *, timeout: float = READY_TIMEOUT) -> dict[str, float]:
        """Restart node containers (a reboot: PID 1 starts anew, enabled units come back); wait until ready.

        Returns seconds per node from the restart to systemd + ssh + docker being up again.
        """
        state = self.load_state()
        targets = state.nodes if which == "all" or list(which) == ["all"] else [state.node(n) for n in which]
        before = {}
        for node in targets:
            stat = self._exec(node, "cat /proc/1/stat", timeout=10)
            if stat.rc != 0:
                raise SimError(f"{node.name}: is not running; start it with `sparkdeploy sim up`")
            before[node.name] = pid1_start_ticks(stat.out)

        def one(node: SimNode) -> float:
            t0 = time.monotonic()
            _docker("restart", "-t", "30", node.container, what=f"{node.name}: docker restart", timeout=120)
            self._wait_ready(node, require_running=False, after_ticks=before[node.name], timeout=timeout)
            self._check_ssh(node)
            return round(time.monotonic() - t0, 2)

        with self.reporter.phase("reboot", ", ".join(n.name for n in targets)) as info:
            secs = dict(zip([n.name for n in targets], self._parallel(one, targets)))
            info["detail"] = ", ".join(f"{k} {v:.1f} s" for k, v in secs.items())
        return secs

    def status(self) -> dict:
        """What each node is doing: container state, PID 1 start, systemd, ssh, docker and its containers."""
        state = self.load_state()
        out = {"name": self.name, "network": state.network, "subnet": state.subnet, "image": state.image,
               "inventory": state.inventory, "key": state.key, "known_hosts": state.known_hosts, "nodes": []}

        def one(node: SimNode) -> dict:
            entry = {**node.to_dict(), "container_state": "missing", "booted_at": None, "system": None,
                     "ssh": False, "docker": None, "containers": []}
            info = self._inspect(node.container)
            if info is None:
                return entry
            entry["container_state"] = info["State"]["Status"]
            if not info["State"]["Running"]:
                return entry
            script = ("cat /proc/1/stat; echo '--'; systemctl is-system-running; echo '--'; systemctl is-active docker;"
                      " echo '--'; docker ps --format '{{.Names}}\t{{.Image}}\t{{.Status}}' 2>/dev/null")
            done = run(self.ssh_argv(node, script), what=f"{node.name}: ssh", check=False, timeout=30)
            parts = done.out.split("--\n")
            if done.rc == 255 or len(parts) < 4:
                entry["ssh_error"] = done.err.strip()[-200:]
                return entry
            entry["ssh"] = True
            ticks = pid1_start_ticks(parts[0].strip())
            entry["booted_at"] = round(ticks_to_epoch(ticks), 2)
            entry["system"] = parts[1].strip()
            entry["docker"] = parts[2].strip()
            entry["containers"] = [dict(zip(("name", "image", "status"), line.split("\t")))
                                   for line in parts[3].splitlines() if line.strip()]
            return entry

        out["nodes"] = self._parallel(one, state.nodes)
        return out

    def down(self, *, keep_volumes: bool = False) -> list[str]:
        """Remove the node containers, their Docker volumes (unless kept), the network and the local state."""
        removed = []
        state = self._existing_state()
        with self.reporter.phase("remove nodes") as info:
            containers = self._containers()
            if containers:
                _docker("rm", "-f", *containers, what="docker rm of the sim nodes", timeout=300)
                removed += containers
            if not keep_volumes:
                vols = _docker("volume", "ls", "-q", "--filter", f"name={self.prefix}-", what="docker volume ls").out.split()
                vols = [v for v in vols if v.startswith(f"{self.prefix}-") and v.endswith("-docker")]
                if vols:
                    _docker("volume", "rm", "-f", *vols, what="docker volume rm", timeout=600)
                    removed += vols
            if _docker("network", "inspect", self.network, what="docker network inspect", check=False).rc == 0:
                _docker("network", "rm", self.network, what=f"docker network rm {self.network}")
                removed.append(self.network)
            info["detail"] = f"{len(removed)} objects"
        if state and state.inventory:
            inv = Path(state.inventory)
            if inv.is_file() and "written by `sparkdeploy sim up`" in inv.read_text()[:300]:
                inv.unlink()
        for f in (self.state_file, self.known_hosts_path, self.key_path, Path(f"{self.key_path}.pub"),
                  api_key_path(self.key_path, self.name)):
            f.unlink(missing_ok=True)
        return removed

    # ------------------------------------------------------------------------------------- image preload
    def preload(self, image: str, nodes: Sequence[str] | None = None) -> dict:
        """Copy a host image into each node's own Docker engine: one `docker save`, streamed to every node's
        `docker load` over SSH at once (no registry; fabric's in_stream never sends EOF, so plain pipes).

        Skipped for nodes that already hold the same image ID. Returns {"seconds", "bytes", "nodes"}.
        """
        from sparkdeploy.sim.transport import stream_image

        state = self.load_state()
        targets = state.nodes if not nodes else [state.node(n) for n in nodes]
        want = _docker("image", "inspect", "--format", "{{.Id}}", image, what=f"docker image inspect {image}",
                       check=False)
        if want.rc != 0:
            raise SimError(f"image {image!r} is not on this host; build it first (e.g. `sparkdeploy sim image`)")
        image_id = want.out.strip()
        need = []
        for node in targets:
            have = run(self.ssh_argv(node, f"docker image inspect --format '{{{{.Id}}}}' {shlex.quote(image)}"),
                       what=f"{node.name}: ssh", check=False, timeout=30)
            if have.rc == 0 and have.out.strip() == image_id:
                self.reporter.note(f"{node.name}: already has {image}")
            else:
                need.append(node)
        if not need:
            return {"seconds": 0.0, "bytes": 0, "nodes": []}
        with self.reporter.phase("preload image", f"{image} -> {', '.join(n.name for n in need)}") as info:
            t0 = time.monotonic()
            nbytes = stream_image(image, {n.name: self.ssh_argv(n, "docker load -q") for n in need})
            secs = round(time.monotonic() - t0, 1)
            info["detail"] = f"{nbytes / 1e9:.2f} GB in {secs} s"
        # a re-loaded tag leaves the previous image dangling inside the node
        for node in need:
            run(self.ssh_argv(node, "docker image prune -f >/dev/null"), what=f"{node.name}: prune", check=False)
        return {"seconds": secs, "bytes": nbytes, "nodes": [n.name for n in need]}
