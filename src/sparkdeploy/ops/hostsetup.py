"""`host setup`: the host guard rails, as idempotent items (read, diff, change only the difference).

Items, in order, per node:
  packages           earlyoom and rsync installed (apt; `apt-get update` once if the lists are missing)
  earlyoom-config    /etc/default/earlyoom = deploy/host/earlyoom.default.j2 (prefer vllm/python/ray,
                     avoid sshd/dockerd/containerd/systemd)
  earlyoom-service   enabled, active, and running with the configured arguments (restarted when they differ)
  sshd-oom           drop-in OOMScoreAdjust=-1000 for ssh.service, and the running sshd set to -1000 now
                     (no sshd restart: the connection we are using survives)
  netplan            /etc/netplan/40-cx7.yaml (mode 600, one /24 per CX-7 twin, MTU 9000), written and applied
                     only with --apply-network; otherwise its diff is shown and the item is skipped

`plan_items()` is pure (state + desired -> items with their diff and the commands that close it), so
idempotence is unit-tested: the state after applying yields no item to change.
"""

from __future__ import annotations

import difflib
import ipaddress
import shlex
from dataclasses import dataclass, field
from typing import Sequence

from sparkdeploy.errors import RemoteError
from sparkdeploy.model.topology import Link
from sparkdeploy.node import probes
from sparkdeploy.plan import render
from sparkdeploy.verdict import Status

EARLYOOM_DEFAULT = "/etc/default/earlyoom"
NETPLAN_FILE = "/etc/netplan/40-cx7.yaml"
SSHD_DROPIN_NAME = "50-sparkdeploy-oom.conf"

# Thresholds: see the template. Fractions of the node's own MemTotal: 4% is about 4.8 GiB on a 128 GB GB10 and
# 2.4 GiB on a 64 GB one.
EARLYOOM_MEM_TERM, EARLYOOM_MEM_KILL = 4, 2
EARLYOOM_SWAP, EARLYOOM_REPORT_S = "100,100", 3600

# the one result vocabulary (verdict.Status): an item is ok, skipped, or would change; applied, it changed or
# failed, and the items after a failure on that node are skipped
OK, CHANGE, SKIPPED = Status.OK, Status.WOULD_CHANGE, Status.SKIPPED

#: earlyoom arguments the kit installs (rendered into /etc/default/earlyoom; doctor checks for them).
EARLYOOM_PREFER = "^(vllm|VLLM|python|ray)"
EARLYOOM_AVOID = "^(sshd|dockerd|containerd|systemd)"
#: the MTU of the CX-7 data plane (netplan here; doctor's mtu check)
DATA_PLANE_MTU = 9000


@dataclass(frozen=True)
class Twin:
    netdev: str
    address: str  # a.b.c.d/24


@dataclass
class HostState:
    """What `read_state` saw on a node."""

    earlyoom_installed: bool = False
    rsync_installed: bool = False
    earlyoom_enabled: str = ""
    earlyoom_active: str = ""
    earlyoom_cmdline: str = ""
    can_lower_oom: bool = True  # CAP_SYS_RESOURCE in PID 1's bounding set (containers often lack it)
    ssh_unit: str = "ssh"
    sshd_pid: str = ""
    sshd_live_adj: str = ""
    netplan_available: bool = False
    apt_available: bool = False
    files: dict[str, str | None] = field(default_factory=dict)  # path -> content (None: missing)
    twin_netdevs: tuple[str, ...] = ()  # netdevs of the node's RoCE devices, in inventory order


@dataclass
class Item:
    name: str
    status: Status  # OK, CHANGE (would change) or SKIPPED; once applied CHANGED or FAILED (SKIPPED: not run)
    what: list[str] = field(default_factory=list)  # one line per action (dry-run shows these)
    diff: str = ""
    writes: list[tuple[str, str, int]] = field(default_factory=list)  # (path, content, mode)
    commands: list[list[str]] = field(default_factory=list)  # run as root after the writes
    note: str = ""

    def to_dict(self) -> dict:
        return {"item": self.name, "status": self.status.value, "actions": self.what, "diff": self.diff,
                "note": self.note}


# ----------------------------------------------------------------------------------------------- render
_env = render.environment


def render_earlyoom(mem_term: int = EARLYOOM_MEM_TERM, mem_kill: int = EARLYOOM_MEM_KILL) -> str:
    return _env().get_template("deploy/host/earlyoom.default.j2").render(
        mem_term=mem_term, mem_kill=mem_kill, swap=EARLYOOM_SWAP, report=EARLYOOM_REPORT_S,
        prefer=EARLYOOM_PREFER, avoid=EARLYOOM_AVOID)


def earlyoom_args(mem_term: int = EARLYOOM_MEM_TERM, mem_kill: int = EARLYOOM_MEM_KILL) -> list[str]:
    """The arguments earlyoom should be running with (what the rendered file gives it)."""
    for line in render_earlyoom(mem_term, mem_kill).splitlines():
        if line.startswith("EARLYOOM_ARGS="):
            return line.split("=", 1)[1].strip('"').split()
    raise AssertionError("template has no EARLYOOM_ARGS")


def render_sshd_dropin() -> str:
    return _env().get_template("deploy/host/sshd-oom.conf.j2").render()


def twins_for(netdev: str, data_ip: str, twin_netdevs: Sequence[str]) -> list[Twin]:
    """The data_ip's netdev first, then each other twin on the next /24 (192.168.177.x -> 192.168.178.x)."""
    ip = ipaddress.IPv4Address(data_ip)
    out = [Twin(netdev, f"{ip}/24")]
    k = 0
    for nd in twin_netdevs:
        if nd and nd != netdev and nd not in {t.netdev for t in out}:
            k += 1
            out.append(Twin(nd, f"{ipaddress.IPv4Address(int(ip) + (k << 8))}/24"))
    return out


def link_twins(links: Sequence[Link]) -> list[Twin]:
    """A node with several data links (a ring: one subnet per cable): each link's netdev with the address and
    prefix the inventory gives it. No twin gets a derived /24 here: the next /24 may be another cable's subnet."""
    return [Twin(link.netdev, f"{link.ip}/{link.prefix}") for link in links]


def render_netplan(node: str, twins: Sequence[Twin], mtu: int = DATA_PLANE_MTU) -> str:
    return _env().get_template("deploy/host/netplan-cx7.yaml.j2").render(node=node, twins=twins, mtu=mtu)


def unified(path: str, old: str | None, new: str, node: str = "") -> str:
    where = f"{node}:{path}" if node else path
    return "".join(difflib.unified_diff((old or "").splitlines(True), new.splitlines(True),
                                        fromfile=f"{where} (now{', missing' if old is None else ''})",
                                        tofile=f"{where} (sparkdeploy)"))


# ------------------------------------------------------------------------------------------------ plan
def dropin_path(unit: str) -> str:
    return f"/etc/systemd/system/{unit}.service.d/{SSHD_DROPIN_NAME}"


def plan_items(node: str, state: HostState, *, netdev: str, data_ip: str, hca: Sequence[str] = ("?",),
               links: Sequence[Link] = (), apply_network: bool = False,
               mem_term: int = EARLYOOM_MEM_TERM, mem_kill: int = EARLYOOM_MEM_KILL) -> list[Item]:
    """Pure: what to change on `node` so it matches the kit's host setup. `links`: every data link of the node;
    with several, the netplan lists each of them (else the data_ip's netdev and its twins)."""
    items: list[Item] = []

    pkg = Item("packages", OK)
    missing = [p for p, have in (("earlyoom", state.earlyoom_installed), ("rsync", state.rsync_installed)) if not have]
    if missing:
        pkg.status = CHANGE
        pkg.what = [f"apt-get install {' '.join(missing)}"]
        install = "DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o Dpkg::Options::=--force-confold \"$@\""
        pkg.commands = [["sh", "-c", f"{install} || {{ apt-get update -q && {install}; }}", "install", *missing]]
        if not state.apt_available:
            pkg.note = f"apt-get not found: install {' '.join(missing)} with the system's package manager"
    items.append(pkg)

    want = render_earlyoom(mem_term, mem_kill)
    have = state.files.get(EARLYOOM_DEFAULT)
    cfg = Item("earlyoom-config", OK)
    if have != want:
        cfg.status = CHANGE
        cfg.diff = unified(EARLYOOM_DEFAULT, have, want, node)
        cfg.what = [f"write {EARLYOOM_DEFAULT}"]
        cfg.writes = [(EARLYOOM_DEFAULT, want, 0o644)]
    items.append(cfg)

    svc = Item("earlyoom-service", OK)
    args = earlyoom_args(mem_term, mem_kill)
    running_args = state.earlyoom_cmdline.split()[1:]
    if state.earlyoom_enabled != "enabled":
        svc.what.append("systemctl enable earlyoom")
        svc.commands.append(["systemctl", "enable", "earlyoom"])
    if cfg.status == CHANGE or not state.earlyoom_installed or state.earlyoom_active != "active" or running_args != args:
        just_installed = not state.earlyoom_installed
        why = ("config changed" if cfg.status == CHANGE else "just installed" if just_installed
               else "not active" if state.earlyoom_active != "active" else "running with other arguments")
        svc.what.append(f"systemctl restart earlyoom ({why})")
        svc.commands.append(["systemctl", "restart", "earlyoom"])
    if svc.commands:
        svc.status = CHANGE
    items.append(svc)

    ssh = Item("sshd-oom", OK)
    path = dropin_path(state.ssh_unit)
    want = render_sshd_dropin()
    have = state.files.get(path)
    if have != want:
        ssh.status = CHANGE
        ssh.diff = unified(path, have, want, node)
        ssh.what += [f"write {path}", "systemctl daemon-reload"]
        ssh.writes = [(path, want, 0o644)]
        ssh.commands.append(["systemctl", "daemon-reload"])
    if state.sshd_pid and state.sshd_pid != "0" and state.sshd_live_adj != "-1000" and not state.can_lower_oom:
        ssh.note = ("this node cannot lower oom_score_adj (no CAP_SYS_RESOURCE in PID 1's bounding set: a "
                    "container); the drop-in is what a real host applies at sshd's next start")
    elif state.sshd_pid and state.sshd_pid != "0" and state.sshd_live_adj != "-1000":
        ssh.status = CHANGE
        ssh.what.append(f"set running sshd (pid {state.sshd_pid}) oom_score_adj -1000 (no restart)")
        ssh.commands.append(["sh", "-c", 'echo -1000 > "/proc/$1/oom_score_adj"', "set-adj", state.sshd_pid])
    items.append(ssh)

    net = Item("netplan", OK)
    if not hca:
        net.status = SKIPPED
        net.note = "no RoCE devices in the inventory (hca: []): no CX-7 twins to configure"
        items.append(net)
        return items
    twins = link_twins(links) if len(links) > 1 else twins_for(netdev, data_ip, state.twin_netdevs)
    want = render_netplan(node, twins)
    have = state.files.get(NETPLAN_FILE)
    if have != want:
        net.diff = unified(NETPLAN_FILE, have, want, node)
        if not apply_network:
            net.status = SKIPPED
            net.note = "network left alone: re-run with --apply-network to write and apply it"
        elif not state.netplan_available:
            net.status = SKIPPED
            net.note = "netplan is not installed on this node (not DGX OS/Ubuntu?): configure the CX-7 twins by hand"
        else:
            net.status = CHANGE
            net.what = [f"write {NETPLAN_FILE} (mode 600)", "netplan apply"]
            net.writes = [(NETPLAN_FILE, want, 0o600)]
            net.commands = [["netplan", "apply"]]
    items.append(net)
    return items


# ----------------------------------------------------------------------------------------- read / apply
def sudo_prefix(user: str) -> list[str]:
    return [] if user == "root" else ["sudo", "-n"]


def read_state(conn, hca: Sequence[str] = (), *, sudo: Sequence[str] = ()) -> HostState:
    out = conn.query(probes.host_state_argv(), timeout=60).stdout
    sec = probes.split_sections(out)
    pkg, eo, ssh = (probes.parse_kv(sec.get(k, probes.Section(0, "")).text) for k in ("pkg", "earlyoom", "sshd"))
    ports = probes.parse_rdma(sec.get("rdma", probes.Section(0, "")).text)
    st = HostState(
        earlyoom_installed=pkg.get("earlyoom") == "yes", rsync_installed=pkg.get("rsync") == "yes",
        apt_available=pkg.get("apt-get") == "yes",
        netplan_available=pkg.get("netplan") == "yes",
        earlyoom_enabled=eo.get("enabled", ""), earlyoom_active=eo.get("active", ""),
        earlyoom_cmdline=eo.get("cmdline", ""),
        can_lower_oom=probes.has_cap_sys_resource(ssh.get("capbnd", "")),
        ssh_unit=ssh.get("unit", "ssh"), sshd_pid=ssh.get("pid", ""), sshd_live_adj=ssh.get("live_adj", ""),
        twin_netdevs=tuple(ports[d].netdev for d in hca if d in ports and ports[d].netdev),
    )
    for path in (EARLYOOM_DEFAULT, dropin_path(st.ssh_unit), NETPLAN_FILE):
        res = conn.query([*sudo, "cat", path], check=False, timeout=30)
        st.files[path] = res.stdout if res.rc == 0 else None
    return st


def write_file(conn, path: str, content: str, mode: int, *, sudo: Sequence[str] = ()) -> None:
    """Atomic write as root: directly when logged in as root, else via a temp file and `sudo install`."""
    import posixpath

    parent = posixpath.dirname(path)
    conn.run([*sudo, "mkdir", "-p", parent], timeout=30)
    if not sudo:
        conn.put(path, content.encode(), mode=mode)
        return
    # A private directory made by mktemp (0700, unpredictable name): nobody else on the node can plant a link
    # or race a file where the content waits for `sudo install`.
    tmp_dir = conn.run(["mktemp", "-d", "/tmp/.sparkdeploy-host.XXXXXXXXXX"], timeout=30,
                       answer=f"<directory mktemp makes on {conn.name}>").stdout.strip()
    tmp = posixpath.join(tmp_dir, posixpath.basename(path))
    try:
        conn.put(tmp, content.encode(), mode=0o600)
        conn.run([*sudo, "install", "-m", format(mode, "o"), "-o", "root", "-g", "root", tmp, path], timeout=30)
    finally:
        conn.run(["rm", "-rf", tmp_dir], check=False, timeout=30)


@dataclass
class Applied:
    item: str
    status: Status  # CHANGED, FAILED, or SKIPPED (not run: an earlier item on the node failed)
    detail: str = ""


def apply_items(conn, items: Sequence[Item], *, sudo: Sequence[str] = ()) -> list[Applied]:
    """Run each changing item's writes then commands, in order; stop at the first failure (later items
    report `not run`). Never raises for a failing command: the result says which item failed and why."""
    out: list[Applied] = []
    failed = False
    for item in items:
        if item.status != CHANGE:
            continue
        if failed:
            out.append(Applied(item.name, Status.SKIPPED, "not run: an earlier item failed"))
            continue
        try:
            for path, content, mode in item.writes:
                write_file(conn, path, content, mode, sudo=sudo)
            for argv in item.commands:
                res = conn.run([*sudo, *argv], check=False, timeout=900)
                if not res.ok:
                    tail = (res.stderr or res.stdout).strip().splitlines()[-2:]
                    raise RemoteError(f"`{shlex.join(argv)}` exited {res.rc}: {' | '.join(tail)}", node=conn.name)
            out.append(Applied(item.name, Status.CHANGED, "; ".join(item.what)))
        except RemoteError as err:
            failed = True
            out.append(Applied(item.name, Status.FAILED, str(err)))
    return out

