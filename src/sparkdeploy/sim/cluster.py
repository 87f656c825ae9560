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

from sparkdeploy import fanout, paths, poll, timing
from sparkdeploy.errors import SimError
from sparkdeploy.sim import containers, host_docker, images, ring, seed
from sparkdeploy.sim._proc import Reporter, need_tool, run
from sparkdeploy.sim.inventory_file import api_key_path

DEFAULT_NAME = "demo"
DEFAULT_USER = "nvidia"  # the login of the shipped inventory.yaml (DGX OS asks for one at first boot)
USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,23}$")
NODE_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,30}$")
KEYS_WAIT_S = 30  # how long a node's SSH host keys may read as missing before `sim up` says so
# Run on a node as root with the login name as $1 and our public key as $2: the user DGX OS makes at first
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
printf '%s\n' "$2" > "$home/.ssh/authorized_keys"
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
    links: list[ring.SimLink] = field(default_factory=list)  # its data links (`sim up --ring`); none: eth0 only

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
        d["nodes"] = [SimNode(**{**n, "links": [ring.SimLink(**link) for link in n.get("links", ())]})
                      for n in d["nodes"]]
        return cls(**d)


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
           base_image_id: str | None = None, mtu: int | None = None, user: str = DEFAULT_USER,
           ring_links: bool = False, with_images: Sequence[str] = ()) -> SimState:
        """Build (or reuse) the node image, start the nodes, wait for systemd + SSH + docker, write the inventory.

        `base_image_id` pins the inventory's serving-image base to the engine base image's ID. `mtu` (e.g. 9000,
        as on a CX-7 data plane) applies when the network is created; an existing network keeps its own. `user`
        is the SSH login made on every node (passwordless sudo; `root`: log in as root). `ring_links`: cable the
        nodes as a ring, a network per link (sparkdeploy.sim.ring); SSH stays on the management network.
        `with_images`: host images every new node starts out holding (sparkdeploy.sim.seed); a node kept from
        before keeps what it has.
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
        if ring_links and len(names) < 2:
            raise SimError("a ring needs at least 2 nodes (--nodes)")

        with timing.span("cluster bring-up", f"{self.name}: {len(names)} nodes"):
            return self._up(names, inventory=inventory, subnet=subnet, profile=profile, rebuild=rebuild,
                            base_image_id=base_image_id, mtu=mtu, user=user, ring_links=ring_links,
                            with_images=list(with_images))

    def _up(self, names: list[str], *, inventory: Path | None, subnet: str | None, profile: str, rebuild: bool,
            base_image_id: str | None, mtu: int | None, user: str, ring_links: bool,
            with_images: list[str]) -> SimState:
        built = images.ensure_node_image(self.reporter, force=rebuild)
        image = built.ref
        wanted = {ref: images.image_id(ref) for ref in with_images}
        seeded = seed.ensure(wanted, image, self.reporter) if wanted else None
        planted: list[SimNode] = []
        self._ensure_key()
        previous = self._existing_state()
        self.user = user  # after reading the previous state, which sets its own
        with self.reporter.phase("network") as info:
            want = subnet or (previous.subnet if previous else None)
            net_subnet = containers.ensure_network(self.network, self.name, want, mtu)
            info["detail"] = f"{self.network} {net_subnet}"
        links = self._ring_networks(names, mtu) if ring_links else {n: [] for n in names}
        net = ipaddress.ip_network(net_subnet)
        nodes_: list[SimNode] = []
        for i, n in enumerate(names):
            nodes_.append(SimNode(name=n, ip=str(net.network_address + 11 + i), container=f"{self.prefix}-{n}",
                                  volume=f"{self.prefix}-{n}-docker", role="head" if i == 0 else "worker",
                                  links=links[n]))
        containers.remove_stale_nodes(self.name, {n.container for n in nodes_}, self.reporter)
        if seeded:
            with self.reporter.phase("seed nodes' Docker volumes", seeded) as info:
                planted = [n for n in nodes_ if seed.plant(seeded, n.volume)]
                info["detail"] = f"{', '.join(n.name for n in planted) or 'none'} (hard-linked layers; kept volumes " \
                                 "untouched)"
        with self.reporter.phase("start nodes", f"{len(nodes_)} x {image}") as info:
            started = [containers.ensure_node(node, image, self.network, self.name, self.reporter, self._install_key)
                       for node in nodes_]
            info["detail"] = ", ".join(f"{n.name} {n.ip} ({how})" for n, how in zip(nodes_, started))
        with self.reporter.phase("wait for systemd, ssh, docker"):
            fanout.each(nodes_, lambda node: containers.wait_ready(node, self.reporter, require_running=True))
        if planted:
            fanout.each(planted, lambda node: seed.tag(node, wanted))
        if ring_links:
            with self.reporter.phase("ring links: attach, read netdevs") as info:
                for node in nodes_:
                    node.links = [containers.attach_link(node, link) for link in node.links]
                info["detail"] = "; ".join(f"{n.name} " + ", ".join(f"{link.netdev} {link.ip} (to {link.peer})"
                                                                     for link in n.links) for n in nodes_)
        with self.reporter.phase("known_hosts from host keys"):
            self._write_known_hosts(nodes_)
        with self.reporter.phase("check ssh by key (host keys verified)"):
            fanout.each(nodes_, self._check_ssh)
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

    def _ring_networks(self, names: list[str], mtu: int | None) -> dict[str, list[ring.SimLink]]:
        """One network per cable of the ring (each its own free /24, or the one it has); {node: its links}."""
        with self.reporter.phase("ring link networks") as info:
            subnets = [containers.ensure_network(ring.link_network(self.prefix, a, b), self.name, None, mtu)
                       for a, b in ring.ring_pairs(names)]
            info["detail"] = ", ".join(f"{a}-{b} {s}" for (a, b), s in zip(ring.ring_pairs(names), subnets))
        return ring.ring_addresses(names, subnets, self.prefix)

    def _ensure_key(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.state_dir, 0o700)
        self.key_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not self.key_path.exists():
            run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"sparkdeploy-sim-{self.name}", "-f",
                 str(self.key_path)], what="ssh-keygen")

    def _install_key(self, node: SimNode) -> None:
        """Make the login user (a sudoer without password, as DGX OS's first user) and authorize our key for it."""
        pub = Path(f"{self.key_path}.pub").read_text().strip()
        what = f"{node.name}: make the login user {self.user} and install the SSH key"
        done = host_docker.exec_run(node.container, ["sh", "-c", _LOGIN_SCRIPT, "login", self.user, pub], what=what)
        if done.rc != 0:
            raise SimError(f"{what} failed (exit {done.rc}): {(done.err or done.out).strip()[-400:]}")

    def _write_known_hosts(self, nodes: list[SimNode]) -> None:
        lines = []
        for node in nodes:
            def host_keys(node=node) -> str:
                """Read again while empty: under load an exec of a node whose keys were there once answered
                nothing (run29b: a kept node, so no key service was even starting)."""
                keys = containers.exec_in(node, "cat /etc/ssh/ssh_host_*_key.pub")
                if keys.rc != 0 or not keys.out.strip():
                    raise poll.NotYet(f"exit {keys.rc}: {(keys.err or keys.out).strip()[-200:]}")
                return keys.out

            try:
                text = poll.until(host_keys, timeout=KEYS_WAIT_S, interval=1)
            except poll.TimedOut as err:
                raise SimError(f"{node.name}: no SSH host keys in /etc/ssh (sparkdeploy-ssh-hostkeys.service "
                               f"failed?): {err.last}") from None
            for line in text.splitlines():
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

    def _check_ssh(self, node: SimNode, timeout: float = 60.0) -> None:
        def fail(err: str) -> SimError:
            return SimError(f"{node.name}: ssh {self.user}@{node.ip} by key failed: {err[-300:]}; check `docker logs "
                            f"{node.container}`, or `sparkdeploy sim down && sparkdeploy sim up`")

        def attempt() -> None:
            done = run(self.ssh_argv(node, "systemctl is-system-running"), what=f"{node.name}: ssh", check=False,
                       timeout=30)
            if done.rc == 0 or done.out.strip() in ("running", "degraded"):
                return
            err = (done.err or done.out).strip()
            if "REMOTE HOST IDENTIFICATION HAS CHANGED" in err or "Host key verification failed" in err:
                raise fail(err)  # another node's key on this address: waiting does not help
            raise poll.NotYet(err)

        try:
            poll.until(attempt, timeout=timeout, interval=0.5)
        except poll.TimedOut as out:
            raise fail(out.last) from None

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

    def reboot(self, which: Sequence[str] | str = "all", *, timeout: float = containers.READY_TIMEOUT) -> dict[str, float]:
        """Restart node containers (a reboot: PID 1 starts anew, enabled units come back); wait until ready.

        Returns seconds per node from the restart to systemd + ssh + docker being up again.
        """
        state = self.load_state()
        targets = state.nodes if which == "all" or list(which) == ["all"] else [state.node(n) for n in which]
        before = {}
        for node in targets:
            stat = containers.exec_in(node, "cat /proc/1/stat", timeout=10)
            if stat.rc != 0:
                raise SimError(f"{node.name}: is not running; start it with `sparkdeploy sim up`")
            before[node.name] = containers.pid1_start_ticks(stat.out)

        def one(node: SimNode) -> float:
            t0 = time.monotonic()
            host_docker.call(f"{node.name}: docker restart", host_docker.api().restart, node.container, timeout=30)
            containers.wait_ready(node, self.reporter, require_running=False, after_ticks=before[node.name],
                                  timeout=timeout)
            self._check_ssh(node)
            return round(time.monotonic() - t0, 2)

        with self.reporter.phase("reboot", ", ".join(n.name for n in targets)) as info:
            secs = dict(zip([n.name for n in targets], fanout.each(targets, one)))
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
            info = containers.inspect(node.container)
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
            ticks = containers.pid1_start_ticks(parts[0].strip())
            entry["booted_at"] = round(containers.ticks_to_epoch(ticks), 2)
            entry["system"] = parts[1].strip()
            entry["docker"] = parts[2].strip()
            entry["containers"] = [dict(zip(("name", "image", "status"), line.split("\t")))
                                   for line in parts[3].splitlines() if line.strip()]
            return entry

        out["nodes"] = fanout.each(state.nodes, one)
        return out

    def down(self, *, keep_volumes: bool = False) -> list[str]:
        """Remove the node containers, their Docker volumes (unless kept), the network and the local state."""
        removed = []
        state = self._existing_state()
        with self.reporter.phase("remove nodes") as info:
            nodes = containers.cluster_containers(self.name)
            # This cluster's volumes only: those its own containers (found by label) mount and those its state
            # names. A name prefix would also take another cluster's ("pytest" would take "pytest-quad"'s), and
            # the test workers run their clusters side by side.
            vols = {v for v in containers.mounted_volumes(nodes) if v.endswith("-docker")}
            vols |= {n.volume for n in (state.nodes if state else ())}
            for node in nodes:
                containers.remove_container(node, f"docker rm of the sim node {node}")
            removed += nodes
            if not keep_volumes:
                listed = host_docker.call("docker volume ls", host_docker.api().volumes)
                vols = sorted(vols & {v["Name"] for v in listed.get("Volumes") or ()})
                for vol in vols:
                    containers.remove_volume(vol, f"docker volume rm {vol}")
                removed += vols
            networks = containers.cluster_networks(self.name)  # the management network and any ring links
            for network in networks:
                host_docker.call(f"docker network rm {network}", host_docker.api().remove_network, network)
            removed += networks
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
        """Copy a host image into each node's own Docker engine: one save stream from the host's engine, fed to
        every node's `docker load` over SSH at once (no registry; fabric's in_stream never sends EOF, so plain
        pipes).

        Skipped for nodes that already hold the same image ID; a node that holds it under another name (a seeded
        node: sparkdeploy.sim.seed) only tags it. Returns {"seconds", "bytes", "nodes"}.
        """
        from sparkdeploy.sim.transport import stream_image

        state = self.load_state()
        targets = state.nodes if not nodes else [state.node(n) for n in nodes]
        image_id = images.image_id(image)
        need = []
        for node in targets:
            ids = " ; ".join(f"(docker image inspect --format '{{{{.Id}}}}' {ref} 2>/dev/null || echo none)"
                             for ref in (shlex.quote(image), image_id))
            by_name, by_id = (run(self.ssh_argv(node, ids), what=f"{node.name}: ssh", check=False,
                                  timeout=30).out.split() + ["none", "none"])[:2]
            if by_name == image_id:
                self.reporter.note(f"{node.name}: already has {image}")
            elif by_id == image_id:
                run(self.ssh_argv(node, f"docker tag {image_id} {shlex.quote(image)}"), what=f"{node.name}: ssh",
                    timeout=30)
                self.reporter.note(f"{node.name}: had {image_id[:19]} under another name; tagged it {image}")
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
