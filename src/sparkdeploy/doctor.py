"""Preflight: read each node once, then judge it with pure checks (verdict, reason, fix).

A *probe* is one fixed shell script run on a node (one SSH round trip); it prints sections
(`@@@ name` ... `@@@ rc=N`), one per fact. *Parsers* turn a section's text into data. A *check* is a pure
function of the node's spec (from the inventory) and the parsed facts that returns a `CheckResult`.
Nothing here touches a node: `gather()` in the CLI layer runs the probe and hands the text back, so every
check is unit-tested with captured output.

Honesty rules: a check that cannot be judged on this node says `not-present` and why (no GPU on a simulated
node, no RDMA devices in a container), never `ok`. Simulated nodes share the host's kernel and clock: the
kernel-module check says so instead of inventing a verdict, and the clock check says skew is zero by
construction there.
"""

from __future__ import annotations

import enum
import re
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

from sparkdeploy.errors import SparkdeployError

GIB = 1 << 30

#: earlyoom arguments the kit installs (also rendered by hostsetup into /etc/default/earlyoom).
EARLYOOM_PREFER = "^(vllm|VLLM|python|ray)"
EARLYOOM_AVOID = "^(sshd|dockerd|containerd|systemd)"

#: the reachability / MTU target on the CX-7 data plane
DATA_PLANE_MTU = 9000
#: clock skew between nodes: above WARN is a warning, above FAIL a failure (seconds)
CLOCK_SKEW_WARN_S = 0.5
CLOCK_SKEW_FAIL_S = 5.0
#: free space wanted under the docker root for the serving image (GB10 image ~15-20 GB; sim image ~3 GB)
DOCKER_FREE_GPU = 25 * GIB
DOCKER_FREE_SIM = 3 * GIB
#: headroom on top of the checkpoint's missing bytes (rsync writes each file to a temp beside it)
DISK_HEADROOM = 1 * GIB
#: the GPU a DGX Spark reports
GB10_NAME = "NVIDIA GB10"
#: kernels known to need `kho=off` on the command line for ibv_reg_mr under memory pressure
KHO_OFF_KERNELS = ("7.0.0-1019-nvidia",)


class ChecksFailed(SparkdeployError):
    """At least one doctor check failed (exit 1); the per-check lines were printed before."""


class Verdict(str, enum.Enum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    NOT_PRESENT = "not-present"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class CheckResult:
    check: str
    node: str  # node name, or "cluster" for checks across nodes
    verdict: Verdict
    reason: str
    fix: str = ""

    def as_dict(self) -> dict:
        d = asdict(self)
        d["verdict"] = self.verdict.value
        return d


@dataclass(frozen=True)
class NodeSpec:
    """What the inventory says about a node (the checks' expectations)."""

    name: str
    data_ip: str
    netdev: str
    hca: tuple[str, ...] = ()
    has_gpu: bool = True
    checkpoint_dir: str | None = None  # host directory of the checkpoint on this node
    role: str = "worker"


# ----------------------------------------------------------------------------------------------- probe
#: Each section: name -> shell text. Positional args of the script: $1 checkpoint dir ("" for none),
#: then the data-plane IPs of the other nodes. Read-only; never needs root except what a root login gives.
SECTIONS: dict[str, str] = {
    "uname": "uname -r",
    "virt": "systemd-detect-virt --container 2>/dev/null || true",
    "modules": (
        'k=$(uname -r); if [ -e "/lib/modules/$k/modules.dep" ]; then echo modules_dep=yes; else echo modules_dep=no; fi; '
        'v=$(modinfo -k "$k" -F version nvidia 2>/dev/null | head -1); echo "modinfo_nvidia=$v"; '
        'echo "loaded_nvidia=$(cat /sys/module/nvidia/version 2>/dev/null)"; '
        'echo "cmdline=$(cat /proc/cmdline 2>/dev/null)"'
    ),
    "gpu": (
        "if command -v nvidia-smi >/dev/null 2>&1; then "
        "nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; else echo 'nvidia-smi: not found'; exit 127; fi"
    ),
    "gpu_procs": (
        "command -v nvidia-smi >/dev/null 2>&1 || exit 127; "
        "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader"
    ),
    "links": "ip -o link show",
    "addrs": "ip -o -4 addr show",
    "rdma": (
        "for p in /sys/class/infiniband/*/ports/*; do [ -e \"$p\" ] || continue; "
        "d=${p#/sys/class/infiniband/}; d=${d%%/*}; n=${p##*/}; "
        "nd=$(ls /sys/class/infiniband/$d/device/net 2>/dev/null | head -1); "
        "echo \"port $d $n ${nd:--} $(cat $p/state 2>/dev/null)\"; "
        "for g in $p/gids/*; do i=${g##*/}; v=$(cat $g 2>/dev/null) || continue; "
        "case $v in 0000:0000:0000:0000:0000:0000:0000:0000|'') continue;; esac; "
        "t=$(cat $p/gid_attrs/types/$i 2>/dev/null); gn=$(cat $p/gid_attrs/ndevs/$i 2>/dev/null); "
        "echo \"gid $d $n $i $v ${gn:--} $t\"; done; done"
    ),
    "earlyoom": (
        'echo "bin=$(command -v earlyoom)"; '
        'echo "active=$(systemctl is-active earlyoom 2>/dev/null)"; '
        'echo "enabled=$(systemctl is-enabled earlyoom 2>/dev/null)"; '
        "pid=$(systemctl show -p MainPID --value earlyoom 2>/dev/null); "
        'if [ -n "$pid" ] && [ "$pid" != 0 ]; then echo "cmdline=$(tr \'\\0\' \' \' < /proc/$pid/cmdline)"; fi'
    ),
    "sshd": (
        "u=ssh; systemctl cat ssh.service >/dev/null 2>&1 || u=sshd; echo unit=$u; "
        'echo "unit_adj=$(systemctl show -p OOMScoreAdjust --value $u 2>/dev/null)"; '
        "pid=$(systemctl show -p MainPID --value $u 2>/dev/null); echo pid=$pid; "
        'echo "live_adj=$(cat /proc/$pid/oom_score_adj 2>/dev/null)"; '
        "echo \"capbnd=$(awk '/^CapBnd:/{print $2}' /proc/1/status 2>/dev/null)\""
    ),
    "disk": (
        'p=${1:-/}; while [ ! -e "$p" ]; do p=$(dirname "$p"); done; '
        'echo "ckpt_path=$p"; echo "ckpt_df=$(df -PB1 "$p" | tail -1)"; '
        'if [ -n "$1" ] && [ -d "$1" ]; then echo "ckpt_present=$(du -sb "$1" 2>/dev/null | cut -f1)"; fi; '
        "r=$(docker info --format '{{.DockerRootDir}}' 2>/dev/null); "
        'if [ -n "$r" ]; then while [ ! -e "$r" ]; do r=$(dirname "$r"); done; '
        'echo "docker_root=$r"; echo "docker_df=$(df -PB1 "$r" | tail -1)"; fi'
    ),
    "docker": (
        "command -v docker >/dev/null 2>&1 || { echo 'docker: not found'; exit 127; }; "
        "echo \"server=$(docker version --format '{{.Server.Version}}' 2>/dev/null)\"; "
        "echo \"runtimes=$(docker info --format '{{range $k, $v := .Runtimes}}{{$k}} {{end}}' 2>/dev/null)\"; "
        "echo \"default_runtime=$(docker info --format '{{.DefaultRuntime}}' 2>/dev/null)\""
    ),
    "units": (
        # enabled = linked into a .wants/.requires dir under /etc (what boots); `systemctl list-unit-files`
        # would say the same but takes seconds on a busy box
        "u=$(for f in /etc/systemd/system/*.wants/*.service /etc/systemd/system/*.requires/*.service; do "
        "[ -e \"$f\" ] || [ -L \"$f\" ] && echo \"${f##*/}\"; done | sort -u); "
        "[ -z \"$u\" ] || systemctl show --no-pager -p Id -p ExecStart -p ExecStartPre $u"
    ),
    "meminfo": "cat /proc/meminfo",
    "containers": "docker ps --format '{{.Names}}' 2>/dev/null",
    "timesync": (
        'echo "ntp=$(timedatectl show -p NTPSynchronized --value 2>/dev/null)"; '
        'for s in systemd-timesyncd chrony chronyd ntp ntpsec; do '
        'if [ "$(systemctl is-active $s 2>/dev/null)" = active ]; then echo "daemon=$s"; fi; done'
    ),
    "reach": (
        "shift; [ $# -gt 0 ] || exit 0; "
        "python3 - \"$@\" <<'PY'\n"
        "import socket, sys\n"
        "for ip in sys.argv[1:]:\n"
        "    try:\n"
        "        socket.create_connection((ip, 22), timeout=3).close(); print(ip, 'ok')\n"
        "    except OSError as e:\n"
        "        print(ip, 'err', e)\n"
        "PY"
    ),
}


def probe_script(sections: Mapping[str, str] = SECTIONS) -> str:
    """One POSIX sh script printing every section between markers; each runs in a subshell with `"$@"`."""
    parts = []
    for name, body in sections.items():
        parts.append(f"echo '@@@ {name}'; ( set -- \"$@\"; {body}\n) 2>&1; echo \"@@@ rc=$?\"")
    return "\n".join(parts) + "\n"


def probe_argv(checkpoint_dir: str | None, peer_ips: Sequence[str]) -> list[str]:
    return ["sh", "-c", probe_script(), "sparkdeploy-doctor", checkpoint_dir or "", *peer_ips]


@dataclass(frozen=True)
class Section:
    rc: int
    text: str


def split_sections(output: str) -> dict[str, Section]:
    """Parse the probe's output into {name: Section(rc, text)}."""
    out: dict[str, Section] = {}
    name, lines = None, []
    for line in output.splitlines():
        if line.startswith("@@@ rc=") and name is not None:
            try:
                rc = int(line[7:].strip())
            except ValueError:
                rc = -1
            out[name] = Section(rc, "\n".join(lines))
            name, lines = None, []
        elif line.startswith("@@@ ") and not line.startswith("@@@ rc="):
            name, lines = line[4:].strip(), []
        elif name is not None:
            lines.append(line)
    return out


# --------------------------------------------------------------------------------------------- parsers
def parse_kv(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key and " " not in key:
            out.setdefault(key.strip(), value.strip())
    return out


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo -> {field: bytes}."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(\w+(?:\(\w+\))?):\s+(\d+)(?:\s+kB)?", line)
        if m:
            out[m.group(1)] = int(m.group(2)) * (1024 if line.rstrip().endswith("kB") else 1)
    return out


@dataclass(frozen=True)
class Link:
    name: str
    mtu: int
    state: str  # UP, DOWN, UNKNOWN, LOWERLAYERDOWN...
    flags: tuple[str, ...] = ()

    @property
    def up(self) -> bool:
        return self.state == "UP" or (self.state == "UNKNOWN" and "LOWER_UP" in self.flags)


def parse_ip_link(text: str) -> dict[str, Link]:
    """`ip -o link show` -> {ifname: Link}; `eth0@if12` is reported as `eth0`."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^\d+:\s+([^:@\s]+)(?:@\S+)?:\s+<([^>]*)>.*?\bmtu\s+(\d+).*?\bstate\s+(\S+)", line)
        if m:
            out[m.group(1)] = Link(m.group(1), int(m.group(3)), m.group(4), tuple(m.group(2).split(",")))
    return out


def parse_ip_addr(text: str) -> dict[str, list[str]]:
    """`ip -o -4 addr show` -> {ifname: ["a.b.c.d/nn", ...]}."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        m = re.match(r"^\d+:\s+(\S+)\s+inet\s+(\S+)", line)
        if m:
            out.setdefault(m.group(1).split("@")[0], []).append(m.group(2))
    return out


@dataclass(frozen=True)
class RdmaPort:
    dev: str
    port: int
    netdev: str | None
    state: str  # e.g. "4: ACTIVE"
    gids: tuple[tuple[int, str, str | None, str], ...] = ()  # (index, gid, ndev, type)

    @property
    def active(self) -> bool:
        return "ACTIVE" in self.state.upper()


def parse_rdma(text: str) -> dict[str, RdmaPort]:
    """The probe's `port DEV N NETDEV STATE` / `gid DEV N IDX GID NDEV TYPE` lines -> {dev: port 1}."""
    ports: dict[tuple[str, int], dict] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[0] == "port":
            ports[(parts[1], int(parts[2]))] = {
                "netdev": None if parts[3] == "-" else parts[3], "state": " ".join(parts[4:]), "gids": []}
        elif len(parts) >= 6 and parts[0] == "gid":
            key = (parts[1], int(parts[2]))
            if key in ports:
                ndev = None if parts[5] == "-" else parts[5]
                ports[key]["gids"].append((int(parts[3]), parts[4], ndev, " ".join(parts[6:])))
    out = {}
    for (dev, port), p in sorted(ports.items()):
        if dev not in out:
            out[dev] = RdmaPort(dev, port, p["netdev"], p["state"], tuple(p["gids"]))
    return out


def ipv4_mapped(gid: str) -> str | None:
    """`0000:0000:0000:0000:0000:ffff:c0a8:b10b` -> `192.168.177.11`; None if not IPv4-mapped."""
    hexes = gid.replace(":", "").lower()
    if len(hexes) != 32 or not hexes.startswith("0" * 20 + "ffff"):
        return None
    tail = hexes[24:]
    return ".".join(str(int(tail[i:i + 2], 16)) for i in range(0, 8, 2))


def roce_v2_gid_index(port: RdmaPort, ipv4: str | None = None) -> int | None:
    """The lowest GID index of type RoCE v2 whose GID is IPv4-mapped (and equal to `ipv4` when given)."""
    for idx, gid, _ndev, kind in sorted(port.gids):
        mapped = ipv4_mapped(gid)
        if mapped and "v2" in kind.lower() and (ipv4 is None or mapped == ipv4):
            return idx
    return None


@dataclass(frozen=True)
class Gpu:
    name: str
    driver: str


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """`nvidia-smi --query-gpu=name,driver_version --format=csv,noheader` -> [Gpu]."""
    out = []
    for line in text.splitlines():
        if "," in line and "not found" not in line:
            name, _, driver = line.rpartition(",")
            out.append(Gpu(name.strip(), driver.strip()))
    return out


@dataclass(frozen=True)
class DiskFree:
    path: str
    size: int
    avail: int


def parse_df_line(line: str, path: str = "") -> DiskFree | None:
    """One data line of `df -PB1`: `fs size used avail use% mount`."""
    parts = line.split()
    if len(parts) < 6 or not parts[1].isdigit():
        return None
    return DiskFree(path or parts[5], int(parts[1]), int(parts[3]))


def parse_units(text: str) -> dict[str, list[str]]:
    """`systemctl show -p Id -p ExecStart -p ExecStartPre UNIT...` (blocks split by blank lines) ->
    {unit: ["ExecStart=...", ...]}."""
    out: dict[str, list[str]] = {}
    for block in re.split(r"\n\s*\n", text.strip()):
        unit, execs = None, []
        for line in block.splitlines():
            key, _, value = line.partition("=")
            if key == "Id":
                unit = value.strip()
            elif key.startswith("Exec") and value.strip():
                # keep the command only: `{ path=... ; argv[]=CMD ; ... pid=N ; status=... }` carries numbers
                # (pids) that must not be mistaken for our ports
                argvs = re.findall(r"argv\[\]=([^;]*)", value)
                execs.extend(f"{key}={a.strip()}" for a in argvs) if argvs else execs.append(line.strip())
        if unit:
            out[unit] = execs
    return out


# ------------------------------------------------------------------------------------------------ facts
@dataclass
class HostFacts:
    """Everything the checks read about one node, parsed from its probe (or given directly in tests)."""

    node: str
    sections: dict[str, Section] = field(default_factory=dict)
    overrides: dict[str, object] = field(default_factory=dict)  # from a facts file: gpu_name, driver, ...
    error: str | None = None  # the probe could not run (SSH failed): every check reports it

    def text(self, name: str) -> str:
        s = self.sections.get(name)
        return s.text if s else ""

    def rc(self, name: str) -> int | None:
        s = self.sections.get(name)
        return s.rc if s else None

    def kv(self, name: str) -> dict[str, str]:
        return parse_kv(self.text(name))

    @property
    def in_container(self) -> str | None:
        v = self.text("virt").strip()
        return v if v and v != "none" else None

    @property
    def gpus(self) -> list[Gpu]:
        if "gpu_name" in self.overrides or "driver" in self.overrides:
            return [Gpu(str(self.overrides.get("gpu_name", "")), str(self.overrides.get("driver", "")))]
        return parse_nvidia_smi(self.text("gpu")) if self.rc("gpu") == 0 else []

    @classmethod
    def from_output(cls, node: str, output: str, overrides: Mapping[str, object] | None = None) -> "HostFacts":
        return cls(node, split_sections(output), dict(overrides or {}))


# ----------------------------------------------------------------------------------------------- checks
Check = Callable[[NodeSpec, HostFacts], CheckResult]


def _r(check: str, node: str, verdict: Verdict, reason: str, fix: str = "") -> CheckResult:
    return CheckResult(check, node, verdict, reason, fix)


def check_ssh(spec: NodeSpec, facts: HostFacts) -> CheckResult:
    if facts.error:
        return _r("ssh", spec.name, Verdict.FAIL, facts.error,
                  "make key login work: `ssh-copy-id -i KEY USER@HOST`, check the host key in known_hosts "
                  "(or --trust-new-hosts once), and that sshd runs")
    return _r("ssh", spec.name, Verdict.OK, "logged in by key with host-key checking on; probe ran")


def check_gpu(spec: NodeSpec, facts: HostFacts) -> CheckResult:
    if not spec.has_gpu:
        return _r("gpu", spec.name, Verdict.NOT_PRESENT,
                  "inventory says gpu: none (simulated node); a GB10 cannot be checked here")
    gpus = facts.gpus
    if not gpus:
        return _r("gpu", spec.name, Verdict.FAIL,
                  f"nvidia-smi gave no GPU ({facts.text('gpu').strip()[:120] or 'no output'})",
                  "install the NVIDIA driver matching the kernel (DGX OS: `apt install nvidia-driver-580-open` "
                  "or the DGX OS update), then reboot")
    names = {g.name for g in gpus}
    if names != {GB10_NAME}:
        return _r("gpu", spec.name, Verdict.FAIL, f"GPU is {', '.join(sorted(names))}, expected {GB10_NAME}",
                  "this kit targets DGX Spark (GB10); set gpu: none in the inventory for other nodes")
    return _r("gpu", spec.name, Verdict.OK, f"{GB10_NAME}, driver {gpus[0].driver}")


def check_kernel_modules(spec: NodeSpec, facts: HostFacts) -> CheckResult:
    kernel = facts.text("uname").strip() or "?"
    kv = facts.kv("modules")
    container = facts.in_container
    cmdline = kv.get("cmdline", "")
    if container:
        return _r("kernel-modules", spec.name, Verdict.NOT_PRESENT,
                  f"node runs in a {container} container: kernel {kernel} is the host's and "
                  f"/lib/modules/{kernel} is {'visible' if kv.get('modules_dep') == 'yes' else 'not visible'} here, "
                  "so kernel/module drift can only be checked on a real host")
    if kv.get("modules_dep") != "yes":
        return _r("kernel-modules", spec.name, Verdict.FAIL,
                  f"no /lib/modules/{kernel}/modules.dep: the running kernel has no installed modules",
                  f"install linux-modules for {kernel} (DGX OS: `apt install linux-modules-nvidia-*-{kernel}`) "
                  "or boot the kernel the modules belong to")
    if spec.has_gpu:
        have, loaded = kv.get("modinfo_nvidia", ""), kv.get("loaded_nvidia", "")
        if not have:
            return _r("kernel-modules", spec.name, Verdict.FAIL,
                      f"no nvidia module for the running kernel {kernel}",
                      f"install linux-modules-nvidia-<branch>-{kernel} matching the driver, then reboot")
        driver = next((g.driver for g in facts.gpus), "")
        if loaded and driver and loaded != driver:
            return _r("kernel-modules", spec.name, Verdict.FAIL,
                      f"loaded nvidia module {loaded} differs from the user-space driver {driver}",
                      "reboot so the installed module loads; keep driver and module packages in step")
    if kernel in KHO_OFF_KERNELS and "kho=off" not in cmdline.split():
        return _r("kernel-modules", spec.name, Verdict.WARN,
                  f"kernel {kernel} without kho=off: ibv_reg_mr fails with ENOMEM under memory pressure",
                  "add kho=off to GRUB_CMDLINE_LINUX_DEFAULT, `update-grub`, reboot")
    return _r("kernel-modules", spec.name, Verdict.OK,
              f"modules for {kernel} present" + (f", nvidia {kv.get('modinfo_nvidia')}" if spec.has_gpu else ""))


def check_roce_twins(spec: NodeSpec, facts: HostFacts) -> CheckResult:
    if not spec.hca:
        return _r("roce-twins", spec.name, Verdict.NOT_PRESENT, "inventory lists no RoCE devices (hca: [])")
    ports = parse_rdma(facts.text("rdma"))
    if not ports:
        where = f" (a {facts.in_container} container has no /sys/class/infiniband)" if facts.in_container else ""
        return _r("roce-twins", spec.name, Verdict.FAIL, f"no RDMA devices found{where}",
                  "load the mlx5 drivers (DGX OS ships them); check `ibdev2netdev`")
    missing = [d for d in spec.hca if d not in ports]
    down = [d for d in spec.hca if d in ports and not ports[d].active]
    if missing or down:
        bits = ([f"missing: {', '.join(missing)}"] if missing else []) + \
               ([f"not ACTIVE: {', '.join(f'{d} ({ports[d].state})' for d in down)}"] if down else [])
        return _r("roce-twins", spec.name, Verdict.FAIL, "; ".join(bits),
                  "a warm reboot can leave one twin down: cold-boot the node (power off, wait, on); "
                  "check the cable and `ibdev2netdev`")
    return _r("roce-twins", spec.name, Verdict.OK, f"{', '.join(spec.hca)} ACTIVE")


def check_mtu(spec: NodeSpec, facts: HostFacts) -> CheckResult:
    links = parse_ip_link(facts.text("links"))
    want = [spec.netdev] + [p.netdev for d, p in parse_rdma(facts.text("rdma")).items()
                            if d in spec.hca and p.netdev and p.netdev != spec.netdev]
    missing = [n for n in want if n not in links]
    if missing:
        return _r("mtu", spec.name, Verdict.FAIL, f"data-plane interface {', '.join(missing)} not found",
                  "fix netdev in the inventory (see `ip link`), or `sparkdeploy host setup --apply-network`")
    bad = [f"{n} mtu {links[n].mtu}" for n in want if links[n].mtu != DATA_PLANE_MTU]
    down = [n for n in want if not links[n].up]
    if bad or down:
        reason = "; ".join(([", ".join(bad) + f" (want {DATA_PLANE_MTU})"] if bad else []) +
                           ([f"{', '.join(down)} not up"] if down else []))
        return _r("mtu", spec.name, Verdict.FAIL, reason,
                  f"set mtu: {DATA_PLANE_MTU} for the CX-7 twins in /etc/netplan/40-cx7.yaml "
                  "(`sparkdeploy host setup --apply-network`), then check both ends; firmware updates reset it")
    addrs = parse_ip_addr(facts.text("addrs")).get(spec.netdev, [])
    if not any(a.split("/")[0] == spec.data_ip for a in addrs):
        return _r("mtu", spec.name, Verdict.FAIL,
                  f"{spec.netdev} mtu {links[spec.netdev].mtu} but data_ip {spec.data_ip} is not on it "
                  f"(has {', '.join(addrs) or 'no IPv4'})",
                  "fix data_ip/netdev in the inventory or the netplan addresses")
    return _r("mtu", spec.name, Verdict.OK, ", ".join(f"{n} mtu {links[n].mtu} up" for n in want))


def check_roce_gid(spec: NodeSpec, facts: HostFacts) -> CheckResult:
    if not spec.hca:
        return _r("roce-gid", spec.name, Verdict.NOT_PRESENT, "inventory lists no RoCE devices (hca: [])")
    ports = parse_rdma(facts.text("rdma"))
    found, missing = [], []
    for dev in spec.hca:
        port = ports.get(dev)
        idx = roce_v2_gid_index(port) if port else None
        (found if idx is not None else missing).append(f"{dev}={idx}" if idx is not None else dev)
    if missing:
        return _r("roce-gid", spec.name, Verdict.FAIL,
                  f"no RoCE v2 IPv4-mapped GID on {', '.join(missing)}",
                  "give the twin an IPv4 address (netplan) so the ::ffff:a.b.c.d GID appears; never pin "
                  "NCCL_IB_GID_INDEX to one literal for both nodes")
    return _r("roce-gid", spec.name, Verdict.OK, "RoCE v2 GID index " + ", ".join(found))


def _earlyoom_args_ok(cmdline: str) -> list[str]:
    problems = []
    if EARLYOOM_PREFER not in cmdline:
        problems.append(f"--prefer {EARLYOOM_PREFER} missing")
    if EARLYOOM_AVOID not in cmdline:
        problems.append(f"--avoid {EARLYOOM_AVOID} missing")
    return problems


def check_earlyoom(spec: NodeSpec, facts: HostFacts) -> CheckResult:
    kv = facts.kv("earlyoom")
    fix = "`sparkdeploy host setup` (installs earlyoom with the kit's prefer/avoid lists and enables it)"
    if not kv.get("bin"):
        return _r("earlyoom", spec.name, Verdict.FAIL, "earlyoom is not installed", fix)
    if kv.get("active") != "active":
        return _r("earlyoom", spec.name, Verdict.FAIL,
                  f"earlyoom is {kv.get('active') or 'unknown'} (enabled: {kv.get('enabled') or '?'})",
                  "`systemctl enable --now earlyoom`, or " + fix)
    problems = _earlyoom_args_ok(kv.get("cmdline", ""))
    if problems:
        return _r("earlyoom", spec.name, Verdict.FAIL,
                  f"earlyoom runs without the kit's lists ({'; '.join(problems)})", fix)
    if kv.get("enabled") != "enabled":
        return _r("earlyoom", spec.name, Verdict.WARN, "earlyoom active but not enabled at boot",
                  "`systemctl enable earlyoom`")
    return _r("earlyoom", spec.name, Verdict.OK, "installed, enabled, active with the kit's prefer/avoid lists")


def check_sshd_oom(spec: NodeSpec, facts: HostFacts) -> CheckResult:
    kv = facts.kv("sshd")
    fix = "`sparkdeploy host setup` (drop-in OOMScoreAdjust=-1000 for ssh.service, then restart sshd)"
    unit, live, unit_adj = kv.get("unit", "ssh"), kv.get("live_adj", ""), kv.get("unit_adj", "")
    if not live:
        return _r("sshd-oom", spec.name, Verdict.FAIL, f"{unit}.service has no running main process", fix)
    if live != "-1000" and unit_adj == "-1000" and not _cap_sys_resource(kv.get("capbnd", "")):
        return _r("sshd-oom", spec.name, Verdict.NOT_PRESENT,
                  f"{unit}.service pins OOMScoreAdjust=-1000 but the running sshd has {live}: this node has no "
                  "CAP_SYS_RESOURCE (a container), so no process here can go below 0; a real host applies it")
    if live != "-1000":
        return _r("sshd-oom", spec.name, Verdict.FAIL,
                  f"sshd (pid {kv.get('pid')}) oom_score_adj {live}: an OOM cascade can kill SSH and strand the box",
                  fix)
    if unit_adj != "-1000":
        return _r("sshd-oom", spec.name, Verdict.WARN,
                  f"sshd protects itself at run time (oom_score_adj -1000) but {unit}.service does not pin "
                  f"OOMScoreAdjust (is {unit_adj or 'unset'})", fix)
    return _r("sshd-oom", spec.name, Verdict.OK, f"{unit}.service OOMScoreAdjust=-1000, live sshd -1000")


def _cap_sys_resource(capbnd_hex: str) -> bool:
    try:
        return bool(int(capbnd_hex, 16) >> 24 & 1)
    except ValueError:
        return True


def check_disk(spec: NodeSpec, facts: HostFacts, *, checkpoint_bytes: int = 0) -> CheckResult:
    kv = facts.kv("disk")
    fix_ckpt = "free space on that file system, or point model.host_dir at a larger one"
    ck = parse_df_line(kv.get("ckpt_df", ""), kv.get("ckpt_path", ""))
    present = int(kv.get("ckpt_present") or 0)
    problems, seen = [], []
    if spec.checkpoint_dir:
        if ck is None:
            return _r("disk", spec.name, Verdict.FAIL, f"cannot read free space for {spec.checkpoint_dir}",
                      "check the path exists and `df` works")
        need = max(0, checkpoint_bytes - present) + (DISK_HEADROOM if checkpoint_bytes > present else 0)
        seen.append(f"{ck.path}: {ck.avail / GIB:.1f} GiB free, checkpoint needs {need / GIB:.1f} GiB more")
        if ck.avail < need:
            problems.append(("checkpoint", f"{ck.path} has {ck.avail / GIB:.2f} GiB free, the checkpoint needs "
                             f"{need / GIB:.2f} GiB more ({present / GIB:.2f} of {checkpoint_bytes / GIB:.2f} GiB present)"))
    dk = parse_df_line(kv.get("docker_df", ""), kv.get("docker_root", ""))
    want = DOCKER_FREE_GPU if spec.has_gpu else DOCKER_FREE_SIM
    if dk is not None:
        seen.append(f"docker root {dk.path}: {dk.avail / GIB:.1f} GiB free")
        if dk.avail < want:
            problems.append(("image", f"docker root {dk.path} has {dk.avail / GIB:.2f} GiB free, the serving image "
                             f"wants {want / GIB:.0f} GiB"))
    if problems:
        fixes = {"checkpoint": fix_ckpt, "image": "`docker system prune` old images, or move docker's data-root"}
        return _r("disk", spec.name, Verdict.FAIL, "; ".join(p for _, p in problems),
                  "; ".join(fixes[k] for k, _ in problems))
    if not seen:
        return _r("disk", spec.name, Verdict.NOT_PRESENT, "no checkpoint dir and no docker root to check")
    return _r("disk", spec.name, Verdict.OK, "; ".join(seen))


def check_docker(spec: NodeSpec, facts: HostFacts) -> CheckResult:
    kv = facts.kv("docker")
    if facts.rc("docker") == 127 or not kv.get("server"):
        return _r("docker", spec.name, Verdict.FAIL,
                  "docker CLI missing" if facts.rc("docker") == 127 else "docker daemon not answering",
                  "install docker (DGX OS ships it) and `systemctl enable --now docker`; add the SSH user to "
                  "the docker group or log in as root")
    runtimes = kv.get("runtimes", "").split()
    if not spec.has_gpu:
        return _r("docker", spec.name, Verdict.OK,
                  f"docker {kv['server']} answering; NVIDIA runtime not needed (gpu: none)")
    if "nvidia" not in runtimes:
        return _r("docker", spec.name, Verdict.FAIL,
                  f"docker {kv['server']} has no nvidia runtime (runtimes: {', '.join(runtimes) or 'none'})",
                  "install nvidia-container-toolkit and `nvidia-ctk runtime configure --runtime=docker`, "
                  "then `systemctl restart docker`")
    return _r("docker", spec.name, Verdict.OK, f"docker {kv['server']} with the nvidia runtime")


def check_gpu_processes(spec: NodeSpec, facts: HostFacts, *, ours: Iterable[str] = ()) -> CheckResult:
    if not spec.has_gpu:
        return _r("gpu-processes", spec.name, Verdict.NOT_PRESENT, "inventory says gpu: none; nothing to list")
    if facts.rc("gpu_procs") != 0:
        return _r("gpu-processes", spec.name, Verdict.FAIL,
                  f"cannot list GPU processes ({facts.text('gpu_procs').strip()[:120] or 'nvidia-smi failed'})",
                  "install the NVIDIA driver (nvidia-smi)")
    ours = set(ours)
    others = []
    for line in facts.text("gpu_procs").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2 and parts[0].isdigit() and parts[0] not in ours:
            others.append(f"pid {parts[0]} {parts[1]}" + (f" ({parts[2]})" if len(parts) > 2 else ""))
    if others:
        return _r("gpu-processes", spec.name, Verdict.FAIL,
                  f"other processes hold the GPU (and unified memory): {'; '.join(others[:5])}",
                  "stop them (a desktop session: `systemctl set-default multi-user.target`; another server: "
                  "`sparkdeploy down` or its own unit)")
    return _r("gpu-processes", spec.name, Verdict.OK, "no other process on the GPU")


_STALE_RE = re.compile(r"vllm|sglang|llama[-_.]?server|tensorrt|trtllm|\bray start\b", re.I)


def check_stale_units(spec: NodeSpec, facts: HostFacts, *, own_prefix: str = "sparkdeploy",
                      ports: Iterable[int] = ()) -> CheckResult:
    units = parse_units(facts.text("units"))
    port_res = [re.compile(rf"(?<![0-9]){p}(?![0-9])") for p in ports]
    stale = []
    for unit, execs in units.items():
        if unit.startswith(own_prefix):
            continue
        text = " ".join(execs)
        if _STALE_RE.search(text) or any(r.search(text) for r in port_res):
            stale.append(unit)
    if stale:
        return _r("stale-units", spec.name, Verdict.FAIL,
                  f"enabled at boot and would start another inference stack: {', '.join(stale)}",
                  f"`systemctl disable --now {' '.join(stale)}` (or `sparkdeploy up`, which disables them and says so)")
    return _r("stale-units", spec.name, Verdict.OK, f"{len(units)} enabled services, none runs another stack")


def check_memory(spec: NodeSpec, facts: HostFacts, *, need_bytes: int = 0, reserve_bytes: int = 0) -> CheckResult:
    mem = parse_meminfo(facts.text("meminfo"))
    avail, total = mem.get("MemAvailable"), mem.get("MemTotal")
    if avail is None:
        return _r("memory", spec.name, Verdict.FAIL, "no MemAvailable in /proc/meminfo", "")
    return memory_margin("memory", spec.name, avail, need_bytes, reserve_bytes, total=total)


def memory_margin(check: str, node: str, avail: int, need_bytes: int, reserve_bytes: int,
                  *, total: int | None = None) -> CheckResult:
    """The memory guard: MemAvailable against weights + KV (`need_bytes`) + the host reserve.

    Below need + reserve: fail (starting would eat the reserve and risk an OOM cascade).
    Within 10% of it: warn. Used before start (after the checkpoint's page cache is evicted) and by health.
    """
    want = need_bytes + reserve_bytes
    seen = f"MemAvailable {avail / GIB:.1f} GiB" + (f" of {total / GIB:.1f}" if total else "")
    if want == 0:
        return _r(check, node, Verdict.OK, seen + " (no budget given)")
    margin = avail - want
    detail = (f"{seen}; weights+KV {need_bytes / GIB:.1f} + reserve {reserve_bytes / GIB:.1f} = "
              f"{want / GIB:.1f} GiB; margin {margin / GIB:+.1f} GiB")
    if margin < 0:
        return _r(check, node, Verdict.FAIL, detail,
                  "free memory (stop other processes, `sparkdeploy weights evict`, boot to multi-user.target) "
                  "or lower gpu_memory_utilization / max_model_len")
    if margin < 0.1 * want:
        return _r(check, node, Verdict.WARN, detail, "little headroom: a compile or load spike may hit earlyoom")
    return _r(check, node, Verdict.OK, detail)


def check_timesync(spec: NodeSpec, facts: HostFacts) -> CheckResult:
    kv = facts.kv("timesync")
    daemon = kv.get("daemon")
    if facts.in_container:
        return _r("timesync", spec.name, Verdict.NOT_PRESENT,
                  f"node runs in a {facts.in_container} container: its clock is the host kernel's; "
                  f"NTP {'reported synchronized' if kv.get('ntp') == 'yes' else 'state not visible'} here")
    if kv.get("ntp") == "yes":
        return _r("timesync", spec.name, Verdict.OK, f"NTP synchronized ({daemon or 'timedatectl'})")
    return _r("timesync", spec.name, Verdict.WARN,
              f"clock not NTP-synchronized ({'daemon ' + daemon if daemon else 'no time daemon active'})",
              "`timedatectl set-ntp true` (systemd-timesyncd) or configure chrony")


NODE_CHECKS: tuple[Check, ...] = (
    check_ssh, check_gpu, check_kernel_modules, check_roce_twins, check_mtu, check_roce_gid, check_earlyoom,
    check_sshd_oom, check_disk, check_docker, check_gpu_processes, check_stale_units, check_memory,
    check_timesync,
)


# ----------------------------------------------------------------------------------- checks across nodes
def check_driver_match(specs: Sequence[NodeSpec], facts: Mapping[str, HostFacts]) -> CheckResult:
    drivers = {}
    for s in specs:
        f = facts.get(s.name)
        if f is None or f.error:
            continue
        gpus = f.gpus if (s.has_gpu or "driver" in f.overrides) else []
        if gpus and gpus[0].driver:
            drivers[s.name] = gpus[0].driver
    if not drivers:
        return _r("driver-match", "cluster", Verdict.NOT_PRESENT,
                  "no node reports a GPU driver (inventory gpu: none and no facts file)")
    if len(set(drivers.values())) > 1:
        seen = ", ".join(f"{n} {d}" for n, d in sorted(drivers.items()))
        return _r("driver-match", "cluster", Verdict.FAIL, f"driver versions differ: {seen}",
                  "install the same driver branch on every node (DGX OS: same nvidia-driver-<branch> and "
                  "linux-modules-nvidia-<branch> packages), reboot, re-run doctor; 580.x is the tested branch")
    only = "" if len(drivers) == len(specs) else f" (only {', '.join(sorted(drivers))} report one)"
    return _r("driver-match", "cluster", Verdict.OK, f"driver {next(iter(drivers.values()))} on all nodes{only}")


def check_reach(specs: Sequence[NodeSpec], facts: Mapping[str, HostFacts]) -> CheckResult:
    if len(specs) < 2:
        return _r("data-plane-reach", "cluster", Verdict.NOT_PRESENT, "one node: nothing to reach")
    bad, good = [], 0
    for s in specs:
        f = facts.get(s.name)
        if f is None or f.error:
            continue
        for line in f.text("reach").splitlines():
            parts = line.split(None, 2)
            if len(parts) >= 2:
                if parts[1] == "ok":
                    good += 1
                else:
                    bad.append(f"{s.name} -> {parts[0]}: {parts[2] if len(parts) > 2 else parts[1]}")
    if bad:
        return _r("data-plane-reach", "cluster", Verdict.FAIL, "; ".join(bad),
                  "check cables, the data_ip addresses and netplan on both ends, and that no firewall blocks "
                  "the data plane (TCP 22 and the ephemeral ports)")
    if good == 0:
        return _r("data-plane-reach", "cluster", Verdict.FAIL, "no node could report reachability",
                  "check SSH to the nodes first")
    return _r("data-plane-reach", "cluster", Verdict.OK, f"{good} node-to-node data-plane paths reach TCP 22")


def check_clock_skew(offsets: Mapping[str, tuple[float, float]], *, shared_kernel: bool = False) -> CheckResult:
    """`offsets`: {node: (offset_s vs this machine, uncertainty_s = half the round trip)}."""
    if len(offsets) < 2:
        return _r("clock-skew", "cluster", Verdict.NOT_PRESENT, "fewer than two nodes answered the clock probe")
    vals = {n: o for n, (o, _) in offsets.items()}
    skew = max(vals.values()) - min(vals.values())
    unc = max(u for _, u in offsets.values()) * 2
    seen = f"max skew {skew * 1000:.0f} ms (+/- {unc * 1000:.0f} ms): " + ", ".join(
        f"{n} {o * 1000:+.0f} ms" for n, o in sorted(vals.items()))
    note = " (simulated nodes share the host kernel's clock: zero skew by construction; this only shows the probe works)" \
        if shared_kernel else ""
    fix = "enable NTP on every node (`timedatectl set-ntp true` or chrony) against the same server"
    if skew - unc > CLOCK_SKEW_FAIL_S:
        return _r("clock-skew", "cluster", Verdict.FAIL, seen + note, fix)
    if skew - unc > CLOCK_SKEW_WARN_S:
        return _r("clock-skew", "cluster", Verdict.WARN, seen + note, fix)
    return _r("clock-skew", "cluster", Verdict.OK, seen + note)


def run_checks(specs: Sequence[NodeSpec], facts: Mapping[str, HostFacts], *,
               checkpoint_bytes: int = 0, need_bytes: int = 0, reserve_bytes: int = 0,
               ports: Iterable[int] = (), clock: Mapping[str, tuple[float, float]] | None = None
               ) -> list[CheckResult]:
    """Every check on every node, then the checks across nodes. A node whose probe failed gets its SSH
    failure as the one result per check ("cannot judge: no SSH"), never a made-up verdict."""
    ports = tuple(ports)
    results: list[CheckResult] = []
    for s in specs:
        f = facts.get(s.name) or HostFacts(s.name, error="not probed")
        for chk in NODE_CHECKS:
            if f.error and chk is not check_ssh:
                results.append(_r(chk.__name__[6:].replace("_", "-"), s.name, Verdict.FAIL,
                                  "not checked: the node could not be probed", "fix ssh first"))
                continue
            if chk is check_disk:
                results.append(check_disk(s, f, checkpoint_bytes=checkpoint_bytes))
            elif chk is check_memory:
                results.append(check_memory(s, f, need_bytes=need_bytes, reserve_bytes=reserve_bytes))
            elif chk is check_stale_units:
                results.append(check_stale_units(s, f, ports=ports))
            else:
                results.append(chk(s, f))
    results.append(check_driver_match(specs, facts))
    results.append(check_reach(specs, facts))
    if clock is not None:
        shared = all((facts.get(s.name) and facts[s.name].in_container) for s in specs)
        results.append(check_clock_skew(clock, shared_kernel=shared))
    return results


def worst(results: Iterable[CheckResult]) -> Verdict:
    order = [Verdict.OK, Verdict.NOT_PRESENT, Verdict.WARN, Verdict.FAIL]
    return max((r.verdict for r in results), key=order.index, default=Verdict.OK)


def serving_margin(node: str, avail: int, reserve_bytes: int, *, low_factor: float = 1.25) -> CheckResult:
    """While serving (for health): MemAvailable below the reserve fails; below `low_factor` x reserve warns."""
    seen = f"MemAvailable {avail / GIB:.1f} GiB, reserve {reserve_bytes / GIB:.1f} GiB, margin {(avail - reserve_bytes) / GIB:+.1f} GiB"
    if avail < reserve_bytes:
        return _r("memory-margin", node, Verdict.FAIL, seen,
                  "the host is eating its reserve: lower gpu_memory_utilization or max_num_seqs, stop other processes")
    if avail < reserve_bytes * low_factor:
        return _r("memory-margin", node, Verdict.WARN, seen, "watch it: a spike may trigger earlyoom")
    return _r("memory-margin", node, Verdict.OK, seen)


# ------------------------------------------------------------------------------------- reading the nodes
# The only I/O in this module: connect, run the probe and the clock samples, read the planner's facts.
def spec_of(node, checkpoint_dir: str | None) -> NodeSpec:
    return NodeSpec(node.name, node.data_ip, node.netdev, tuple(node.hca), node.has_gpu, checkpoint_dir, node.role)


def clock_offset(conn, samples: int = 3) -> tuple[float, float]:
    """(offset of the node's clock vs this machine, half the round trip) from the sample with the least RTT."""
    import time

    best = None
    for _ in range(samples):
        t0 = time.time()
        out = conn.run(["date", "+%s.%N"], timeout=30).stdout.strip()
        t1 = time.time()
        try:
            remote = float(out)
        except ValueError:
            continue
        cand = (remote - (t0 + t1) / 2, (t1 - t0) / 2)
        if best is None or cand[1] < best[1]:
            best = cand
    if best is None:
        raise ValueError("date printed no number")
    return best


def planner_facts(node, hf: HostFacts):
    """The planner's NodeFacts from the probe's /proc/meminfo (memory only: the other checks judge the rest)."""
    from sparkdeploy.facts import NodeFacts

    mem = parse_meminfo(hf.text("meminfo"))
    if "MemTotal" not in mem:
        return None
    return NodeFacts(node.name, mem["MemTotal"], mem.get("MemAvailable"), node.has_gpu, source="ssh")


@dataclass
class Examination:
    results: list[CheckResult]
    facts: dict[str, HostFacts]
    seconds: float = 0.0

    @property
    def verdict(self) -> Verdict:
        return worst(self.results)

    def to_dict(self) -> dict:
        return {"verdict": self.verdict.value, "seconds": round(self.seconds, 2),
                "results": [r.as_dict() for r in self.results]}


def examine(inv, *, facts_file: str | None = None, checkpoint_dir: str | None = None,
            trust_new_hosts: bool = False, pool=None) -> Examination:
    """Probe every node of the inventory (in parallel) and run every check."""
    import time

    from sparkdeploy import facts as facts_mod
    from sparkdeploy import plan as plan_mod
    from sparkdeploy.errors import SparkdeployError
    from sparkdeploy.remote import Pool
    from sparkdeploy.remote import target_of

    t0 = time.monotonic()
    ckpt = checkpoint_dir or inv.profile.host_dir
    specs = [spec_of(n, ckpt) for n in inv.nodes]
    given = facts_mod.load_facts_file(facts_file) if facts_file else {}
    own = pool is None
    pool = pool or Pool([target_of(n.name, n.ssh) for n in inv.nodes], trust_new_hosts=trust_new_hosts)
    try:
        errors = pool.open()
        up = [n.name for n in inv.nodes if n.name in pool.conns]
        peers = {n.name: [m.data_ip for m in inv.nodes if m.name != n.name] for n in inv.nodes}
        outs = pool.map(lambda c: c.run(probe_argv(ckpt, peers[c.name]), check=False, timeout=180), up)
        clocks = pool.map(clock_offset, up)
    finally:
        if own:
            pool.close()
    facts: dict[str, HostFacts] = {}
    for n in inv.nodes:
        over = {}
        if n.name in given:
            g = given[n.name]
            over = {k: v for k, v in (("gpu_name", g.gpu_name), ("driver", g.driver)) if v is not None}
        if n.name in errors:
            facts[n.name] = HostFacts(n.name, overrides=over, error=str(errors[n.name]))
        elif isinstance(outs.get(n.name), Exception):
            facts[n.name] = HostFacts(n.name, overrides=over, error=f"probe failed: {outs[n.name]}")
        else:
            facts[n.name] = HostFacts.from_output(n.name, outs[n.name].stdout, over)

    # memory: the planner's own budget on the measured facts (never recomputed here)
    measured = {n.name: planner_facts(n, facts[n.name]) for n in inv.nodes if not facts[n.name].error}
    measured = {k: v for k, v in measured.items() if v is not None}
    budget_error = None
    budgets, engines = {}, {}
    if measured:
        try:
            pl = plan_mod.plan(inv, measured)
            budgets = {np.name: np.memory for np in pl.nodes}
            engines = {np.name: np.container_name for np in pl.nodes}
        except SparkdeployError as err:
            budget_error = str(err)
    head_present = int(facts[inv.head.name].kv("disk").get("ckpt_present") or 0) if not facts[inv.head.name].error else 0
    checkpoint_bytes = max(head_present, int(inv.profile.weights_gib * GIB)) if ckpt else 0
    ports = (inv.ports.api, inv.ports.master)
    results: list[CheckResult] = []
    per_node = run_checks(specs, facts, checkpoint_bytes=checkpoint_bytes, ports=ports,
                          clock={k: v for k, v in clocks.items() if not isinstance(v, Exception)})
    for r in per_node:
        if r.check == "memory" and not facts[r.node].error:
            mem = parse_meminfo(facts[r.node].text("meminfo"))
            b = budgets.get(r.node)
            if budget_error and f"node {r.node}:" not in budget_error and re.search(r"\bnode \S+:", budget_error):
                r = _r("memory", r.node, Verdict.NOT_PRESENT,
                       "budget not computed here: the plan stopped at another node (see its memory line)")
            elif budget_error:
                r = _r("memory", r.node, Verdict.FAIL, budget_error,
                       "free memory on the node, or lower memory.reserve_gib / gpu_memory_utilization only if the "
                       "host really has the room")
            elif b is not None and "MemAvailable" in mem and \
                    engines.get(r.node) in facts[r.node].text("containers").split():
                # the engine already holds its budget: judge the serving margin, not a fresh start
                r = serving_margin(r.node, mem["MemAvailable"], int(b.reserve_gib * GIB))
                r = _r("memory", r.node, r.verdict, "engine running: " + r.reason, r.fix)
            elif b is not None and "MemAvailable" in mem:
                r = memory_margin("memory", r.node, mem["MemAvailable"], int(b.engine_gib * GIB),
                                  int(b.reserve_gib * GIB), total=mem.get("MemTotal"))
        results.append(r)
    results.append(check_api_key(inv))
    return Examination(results, facts, time.monotonic() - t0)


def check_api_key(inv) -> CheckResult:
    """Rank 0 serves on every interface of the head: without a key anyone on the LAN can use the model."""
    if inv.auth.api_key_file is not None:
        return _r("api-key", "cluster", Verdict.OK, f"API key from {inv.auth.api_key_file} (0600)")
    return _r("api-key", "cluster", Verdict.WARN,
              f"the API on {inv.head.data_ip}:{inv.ports.api} (all interfaces of {inv.head.name}) takes requests "
              "without a key", "set auth.api_key_file in the inventory (README: Real Sparks, step by step)")
