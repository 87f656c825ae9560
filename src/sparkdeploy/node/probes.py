"""Reading a node: the probe scripts (shell text run in one SSH round trip) and one pure parser per fact.

Nothing here touches a node. The callers run the scripts and hand the text back:
  - `probe_argv()` (doctor's full probe: sections `@@@ name` ... `@@@ rc=N`, split by `split_sections`),
    run by `doctor.examine()`;
  - `gather_argv()` (the planner's facts, the same sections), run by `gather.gather()`; `init_probe_argv()`
    (what `init` reads of a box, the same sections where they overlap);
  - `host_state_argv()` (what host setup reads: doctor's sections and its tools), run by
    `hostsetup.read_state()`;
  - `bandwidth_receive_argv()` / `bandwidth_send_argv()` (one pair's TCP stream over the data plane, read by
    `parse_bandwidth`), run by `doctor.measure_bandwidth()`.

One parser per fact, shared by all three: `parse_meminfo` (/proc/meminfo), `parse_ip_link` / `parse_ip_addr`
(`ip -o link` / `ip -o -4 addr`, together `parse_netdevs`), `parse_rdma` (the probe's port/GID
lines), `parse_nvidia_smi`, `parse_df_line`, `parse_unit_states` (every `systemctl show`, run as
`unit_show_argv`), `parse_kv`, `has_cap_sys_resource`; and ONE GID rule, `roce_v2_ipv4_gid_index` (the index the planner puts in NCCL_IB_GID_INDEX, which doctor checks).
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

# ----------------------------------------------------------------------------------------------- probe
#: What the clock/thermal check reads (GB10 reports these; `[N/A]` where a field is not supported).
GPU_CLOCK_FIELDS = ("clocks.sm,clocks.max.sm,utilization.gpu,temperature.gpu,"
                    "clocks_event_reasons.hw_thermal_slowdown,clocks_event_reasons.sw_thermal_slowdown")
#: Every probe script starts with this: file reads under /sys and /proc take the root prefix
#: $SPARKDEPLOY_PROBE_ROOT (unset on a real node; a test points it at a recorded tree).
ROOT_PREAMBLE = 'R="${SPARKDEPLOY_PROBE_ROOT-}"\n'
#: Each section: name -> shell text. Positional args of the script: $1 checkpoint dir ("" for none), $2 the
#: running release's engine.env ("" for none), then the targets to reach (IP for its SSH port, or IP:PORT). Read-only; never needs root except what a root login gives.
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
        "for p in $R/sys/class/infiniband/*/ports/*; do [ -e \"$p\" ] || continue; "
        "d=${p#$R/sys/class/infiniband/}; d=${d%%/*}; n=${p##*/}; "
        "nd=$(ls $R/sys/class/infiniband/$d/device/net 2>/dev/null | head -1); "
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
    "enabled_units": (
        # enabled = linked into a .wants/.requires dir under /etc (what boots); `systemctl list-unit-files`
        # would say the same but takes seconds on a busy box
        "u=$(for f in /etc/systemd/system/*.wants/*.service /etc/systemd/system/*.requires/*.service; do "
        "[ -e \"$f\" ] || [ -L \"$f\" ] && echo \"${f##*/}\"; done | sort -u); "
        "[ -z \"$u\" ] || systemctl show --no-pager -p Id -p ExecStart -p ExecStartPre $u"
    ),
    "meminfo": "cat $R/proc/meminfo",
    "containers": "docker ps --format '{{.Names}}' 2>/dev/null",
    "gpu_clocks": (
        "command -v nvidia-smi >/dev/null 2>&1 || exit 127; "
        f"nvidia-smi --query-gpu={GPU_CLOCK_FIELDS} --format=csv,noheader,nounits"
    ),
    # negotiated link speed per netdev in Mbit/s (-1: down or not reported)
    "speed": 'for d in $R/sys/class/net/*; do echo "${d##*/} $(cat $d/speed 2>/dev/null || echo -1)"; done',
    "tools": 'echo "ib_write_bw=$(command -v ib_write_bw)"',
    # the NCCL_IB_GID_INDEX the running release was planned with ($2: its engine.env; absent before `up`)
    "deployed": '[ -n "$2" ] && [ -r "$2" ] && grep -E "^NCCL_IB_GID_INDEX=" "$2"; exit 0',
    "timesync": (
        'echo "ntp=$(timedatectl show -p NTPSynchronized --value 2>/dev/null)"; '
        'for s in systemd-timesyncd chrony chronyd ntp ntpsec; do '
        'if [ "$(systemctl is-active $s 2>/dev/null)" = active ]; then echo "daemon=$s"; fi; done'
    ),
    "reach": (
        # each target is IP (its SSH port) or IP:PORT; a refused connection still proves the path (nothing
        # listens there before `up`), a timeout or no route does not
        "shift 2; [ $# -gt 0 ] || exit 0; "
        "python3 - \"$@\" <<'PY'\n"
        "import socket, sys\n"
        "for target in sys.argv[1:]:\n"
        "    ip, _, port = target.partition(':')\n"
        "    try:\n"
        "        socket.create_connection((ip, int(port or 22)), timeout=3).close(); print(target, 'ok')\n"
        "    except ConnectionRefusedError:\n"
        "        print(target, 'refused')\n"
        "    except OSError as e:\n"
        "        print(target, 'err', e)\n"
        "PY"
    ),
}


# ------------------------------------------------------------------------------------------------ init
#: What `sparkdeploy init` reads from a box (the doctor probe's grammar and, where they overlap, its sections).
#: `network` lists the files that configured the interfaces: netplan (NVIDIA Sync's Cluster Assistant or host
#: setup write there), NetworkManager keyfiles, and those under /run (nmcli edits that vanish at reboot).
INIT_SECTIONS: dict[str, str] = {
    "hostname": "hostname",
    "uname": SECTIONS["uname"],
    "meminfo": SECTIONS["meminfo"],
    "gpu": SECTIONS["gpu"],
    "links": SECTIONS["links"],
    "addrs": SECTIONS["addrs"],
    "rdma": SECTIONS["rdma"],
    "speed": SECTIONS["speed"],
    "network": (
        "for f in $R/etc/netplan/*.yaml; do [ -e \"$f\" ] || continue; "
        "echo \"netplan /etc/netplan/${f##*/} $(grep -Eo '^ +[A-Za-z0-9_.-]+:' \"$f\" | tr -d ' :' | tr '\\n' ' ')\"; done; "
        "for d in /etc/NetworkManager/system-connections /run/NetworkManager/system-connections; do "
        "for f in $R$d/*; do [ -e \"$f\" ] || continue; "
        "echo \"nm $d/${f##*/} $(sed -n 's/^interface-name=//p' \"$f\" | head -1)\"; done; done"
    ),
}


def init_probe_argv() -> list[str]:
    return ["sh", "-c", probe_script(INIT_SECTIONS), "sparkdeploy-init"]


# ------------------------------------------------------------------------------------ pairwise bandwidth
#: TCP port of doctor's bandwidth measurement, on the receiving node's data_ip, only while doctor runs.
BANDWIDTH_PORT = 29481
#: How long each sender streams. One second tells a CX-7 path from one that takes the management network or a
#: 10GbE port, and a degraded CX-7 (~13 Gbit/s on a 200G link, dgx-spark-playbooks#108) from a healthy one.
BANDWIDTH_SECONDS = 1.0
#: Parallel TCP streams where ib_write_bw is not installed: one Python stream is CPU-bound far below 200G, so a
#: single stream cannot tell a degraded CX-7 from a healthy one.
BANDWIDTH_STREAMS = 4
_BANDWIDTH_RECEIVE = """
import socket, sys, threading, time
ip, port, wait, streams = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((ip, port))
srv.listen(streams)
srv.settimeout(wait)
counts, starts, ends, peer = [], [], [], None
def drain(conn):
    buf, n = bytearray(1 << 20), 0
    while True:
        k = conn.recv_into(buf)
        if not k:
            break
        if not n:
            starts.append(time.monotonic())
        n += k
    ends.append(time.monotonic())
    counts.append(n)
threads = []
for _ in range(streams):
    conn, peer = srv.accept()
    threads.append(threading.Thread(target=drain, args=(conn,)))
    threads[-1].start()
for t in threads:
    t.join()
seconds = max(ends) - min(starts) if starts else 0.0
print("received", sum(counts), seconds, peer[0])
"""
_BANDWIDTH_SEND = """
import socket, sys, threading, time
src, dst, port, seconds, wait, streams = (sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]),
                                          float(sys.argv[5]), int(sys.argv[6]))
give_up = time.monotonic() + wait
socks = []
while len(socks) < streams:
    try:
        socks.append(socket.create_connection((dst, port), timeout=5, source_address=(src, 0)))
    except ConnectionRefusedError:
        if time.monotonic() > give_up:
            raise
        time.sleep(0.05)
sent = []
def stream(s, end):
    buf, n = bytes(4 << 20), 0
    while time.monotonic() < end:
        s.sendall(buf)
        n += len(buf)
    s.shutdown(socket.SHUT_WR)
    s.recv(1)
    sent.append(n)
end = time.monotonic() + seconds
threads = [threading.Thread(target=stream, args=(s, end)) for s in socks]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("sent", sum(sent))
"""


def bandwidth_receive_argv(data_ip: str, wait_s: float) -> list[str]:
    return ["python3", "-c", _BANDWIDTH_RECEIVE, data_ip, str(BANDWIDTH_PORT), str(wait_s), str(BANDWIDTH_STREAMS)]


def bandwidth_send_argv(src_ip: str, dst_ip: str, wait_s: float) -> list[str]:
    return ["python3", "-c", _BANDWIDTH_SEND, src_ip, dst_ip, str(BANDWIDTH_PORT), str(BANDWIDTH_SECONDS),
            str(wait_s), str(BANDWIDTH_STREAMS)]


def parse_bandwidth(received: str) -> float:
    """Gbit/s from the receiver's `received BYTES SECONDS PEER` line; ValueError if there is none."""
    for line in received.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == "received":
            n, seconds = int(parts[1]), float(parts[2])
            if n == 0 or seconds <= 0:
                raise ValueError("no bytes arrived")
            return n * 8 / seconds / 1e9
    raise ValueError("the receiver printed no result")


def ib_write_bw_argv(hca: str, gid_index: int | None, server_ip: str | None = None) -> list[str]:
    """perftest's RDMA write test on one HCA: the server without `server_ip`, the client with it (Debian's
    `perftest` package; the server waits for the client on TCP 18515)."""
    argv = ["ib_write_bw", "-d", hca, "-F", "--report_gbits", "-D", str(int(max(BANDWIDTH_SECONDS, 1)))]
    if gid_index is not None:
        argv += ["-x", str(gid_index)]
    return argv + ([server_ip] if server_ip else [])


def parse_ib_write_bw(out: str) -> float:
    """Gbit/s (the `BW average[Gb/sec]` column) from ib_write_bw's result table; ValueError if there is none."""
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if "BW average[Gb/sec]" in line:
            column = [w for w in line.split() if w != "BW"].index("average[Gb/sec]")  # "BW peak[...]" is one column
            for row in lines[i + 1:]:
                cells = row.split()
                if len(cells) >= column + 1 and cells[0].isdigit():
                    return float(cells[column])
    raise ValueError("ib_write_bw printed no result table")


def parse_speeds(text: str) -> dict[str, int]:
    """The probe's `NETDEV MBIT` lines (/sys/class/net/*/speed) -> {netdev: Mbit/s}; down or unknown left out."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit() and int(parts[1]) > 0:
            out[parts[0]] = int(parts[1])
    return out


# ------------------------------------------------------------------------------------ the image's NCCL, Ray
#: Run inside the serving image: the NCCL that torch links (pip's nvidia/nccl/lib, followed through symlinks)
#: and the image's own system library (ldconfig). torch loads its pip copy first and vLLM's dlopen of
#: libnccl.so.2 then gets the same one, so pip's copy is the one the engine uses when it is there. Also Ray's
#: version (a `backend: ray` service's ranks start with `ray start`).
IMAGE_SCRIPT = r"""
import glob, os, shutil, site, subprocess
from importlib import metadata
pip = sorted({os.path.realpath(p) for d in site.getsitepackages()
              for p in glob.glob(os.path.join(d, "nvidia", "nccl", "lib", "libnccl.so*"))})
cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout if shutil.which("ldconfig") else ""
system = next((l.split("=>")[-1].strip() for l in cache.splitlines() if "libnccl.so" in l), "")
print("image_pip=" + (pip[0] if pip else ""))
print("image_system=" + (os.path.realpath(system) if system else ""))
try:
    print("image_ray=" + metadata.version("ray"))
except metadata.PackageNotFoundError:
    print("image_ray=")
"""


IMAGE_LIBS_SECTIONS = {
    "host": "h=$(ldconfig -p 2>/dev/null | awk '/libnccl\\.so/ {print $NF; exit}'); echo host=${h:+$(readlink -f \"$h\")}",
    "image": ('if docker image inspect "$tag" >/dev/null 2>&1; then '
              f'docker run --rm --network none --entrypoint python3 "$tag" -c {shlex.quote(IMAGE_SCRIPT)}; '
              "else echo image=absent; fi"),
}


def image_libs_argv(image_tag: str) -> list[str]:
    """On a node: its own libnccl (ldconfig), then what the serving image holds: its NCCL libraries and its Ray
    (`image=absent` if the node does not have the image yet). One container for both."""
    return named_probe_argv("image-libs", IMAGE_LIBS_SECTIONS, {"tag": image_tag})


def nccl_version(path: str) -> str:
    """`2.27.7` from `/usr/lib/aarch64-linux-gnu/libnccl.so.2.27.7`; the file name when it carries none."""
    m = re.search(r"libnccl\.so\.(\d+\.\d+\.\d+)", path)
    return m[1] if m else path.rsplit("/", 1)[-1]


def parse_image_libs(out: str) -> dict[str, str]:
    """{host, image_pip, image_system, image_ray, image}: NCCL paths and Ray's version ("" for none); image is
    "absent" when the node lacks it."""
    sec = split_sections(out)
    got = {**parse_kv(section_text(sec, "host")), **parse_kv(section_text(sec, "image"))}
    return {"host": got.get("host", ""), "image_pip": got.get("image_pip", ""),
            "image_system": got.get("image_system", ""), "image_ray": got.get("image_ray", ""),
            "image": got.get("image", "present")}


def probe_script(sections: Mapping[str, str] = SECTIONS) -> str:
    """One POSIX sh script printing every section between markers; each runs in a subshell with `"$@"`."""
    parts = []
    for name, body in sections.items():
        parts.append(f"echo '@@@ {name}'; ( set -- \"$@\"; {body}\n) 2>&1; echo \"@@@ rc=$?\"")
    return ROOT_PREAMBLE + "\n".join(parts) + "\n"


def named_probe_argv(label: str, sections: Mapping[str, str], values: Mapping[str, str],
                     rest: Sequence[str] = ()) -> list[str]:
    """A probe whose sections read shell variables named by `values`' keys. The values travel as arguments,
    never spliced into the script; "$@" in each section holds `rest`."""
    assert all(k.isidentifier() for k in values), list(values)
    names = "".join(f'{k}="${{{i}}}"; ' for i, k in enumerate(values, 1))
    return ["sh", "-c", f"{names}shift {len(values)}\n" + probe_script(sections), label, *values.values(), *rest]


def probe_argv(checkpoint_dir: str | None, targets: Sequence[str], deployed_env: str = "") -> list[str]:
    """Doctor's probe: `targets` are the IPs (SSH port) or IP:PORTs this node must reach."""
    return ["sh", "-c", probe_script(), "sparkdeploy-doctor", checkpoint_dir or "", deployed_env, *targets]


def reach_argv(targets: Sequence[str]) -> list[str]:
    """Only the probe's `reach` section (for a node doctor does not examine: the router's, outside the service)."""
    return ["sh", "-c", probe_script({"reach": SECTIONS["reach"]}), "sparkdeploy-doctor", "", "", *targets]


@dataclass(frozen=True)
class Section:
    rc: int
    text: str


def split_sections(output: str) -> dict[str, Section]:
    """Parse the probe's output into {name: Section(rc, text)}. A section whose output does not end in a newline
    (`cat` of a file written without one, e.g. the watchdog's JSON state) leaves its last line and the end
    marker on one line: the marker is split off, so the section keeps that line."""
    out: dict[str, Section] = {}
    name, lines = None, []
    for raw in output.splitlines():
        glued = raw.find("@@@ rc=") if name is not None else -1
        for line in ((raw[:glued], raw[glued:]) if glued > 0 else (raw,)):
            name, lines = _take(out, name, lines, line)
    return out


def _take(out: dict[str, Section], name: str | None, lines: list[str], line: str) -> tuple[str | None, list[str]]:
    """One line of probe output: a section's start, its end (with its exit status) or a line of its text."""
    if line.startswith("@@@ rc=") and name is not None:
        try:
            rc = int(line[7:].strip())
        except ValueError:
            rc = -1
        out[name] = Section(rc, "\n".join(lines))
        return None, []
    if line.startswith("@@@ ") and not line.startswith("@@@ rc="):
        return line[4:].strip(), []
    if name is not None:
        lines.append(line)
    return name, lines


def section_text(sections: Mapping[str, Section], name: str) -> str:
    """A section's text; "" when the probe's output lacks it (cut short)."""
    return sections[name].text if name in sections else ""


# --------------------------------------------------------------------------------------------- parsers
def parse_kv(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key and " " not in key:
            out.setdefault(key.strip(), value.strip())
    return out


def parse_meminfo(text: str) -> dict[str, int]:
    """`/proc/meminfo` -> {field: bytes} ("MemTotal: 125000000 kB" -> 128000000000)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        m = re.match(r"^\s*([A-Za-z0-9_()]+):\s+(\d+)(?:\s+(kB))?\s*$", line)
        if m:
            out[m.group(1)] = int(m.group(2)) * (1024 if m.group(3) else 1)
    return out


def has_cap_sys_resource(capbnd_hex: str) -> bool:
    """CAP_SYS_RESOURCE (bit 24) in a CapBnd mask; unknown counts as present (a real host has it)."""
    try:
        return bool(int(capbnd_hex, 16) >> 24 & 1)
    except ValueError:
        return True


@dataclass(frozen=True)
class NetDev:
    """One interface as the planner and init see it (`ip -o link` and `ip -o -4 addr`, `parse_netdevs`)."""

    name: str
    ipv4: tuple[str, ...] = ()  # "a.b.c.d/prefix"
    mtu: int | None = None
    up: bool | None = None

    def addresses(self) -> tuple[str, ...]:
        return tuple(a.split("/", 1)[0] for a in self.ipv4)


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


def parse_netdevs(links_text: str, addrs_text: str) -> tuple[NetDev, ...]:
    """The `links` and `addrs` sections -> every interface with its IPv4/prefix, MTU and state (loopback kept;
    callers pick by name)."""
    addrs = parse_ip_addr(addrs_text)
    return tuple(NetDev(name, tuple(addrs.get(name, ())), link.mtu, link.up)
                 for name, link in parse_ip_link(links_text).items())


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


def parse_gid(text: str) -> ipaddress.IPv6Address | None:
    """One `gids/<i>` file ("0000:0000:0000:0000:0000:ffff:c0a8:b10b") -> address, None if empty/invalid."""
    try:
        addr = ipaddress.IPv6Address(text.strip())
    except ValueError:
        return None
    return None if addr == ipaddress.IPv6Address(0) else addr


def roce_v2_ipv4_gid_index(gids: Mapping[int, str], types: Mapping[int, str],
                           ipv4: str | Iterable[str] | None = None) -> int | None:
    """THE GID rule: the index of the RoCE v2 GID that is an IPv4-mapped address (of `ipv4`, or of one of
    the addresses in `ipv4`, when given), else None.

    `gids` and `types` map GID index -> the text of `ports/1/gids/<i>` and `ports/1/gid_attrs/types/<i>`
    ("RoCE v2", "IB/RoCE v1"). The lowest matching index wins. Never guess: None means leave
    NCCL_IB_GID_INDEX unset (an empty value would parse as 0, the link-local fe80 GID).
    """
    if isinstance(ipv4, str):
        ipv4 = [ipv4] if ipv4 else []
    want = {ipaddress.IPv4Address(a) for a in ipv4} if ipv4 is not None else set()
    for index in sorted(gids):
        kind = types.get(index, "").strip().lower()
        if kind != "roce v2":
            continue
        addr = parse_gid(gids[index])
        if addr is None or addr.ipv4_mapped is None:
            continue
        if not want or addr.ipv4_mapped in want:
            return index
    return None


def twin_addresses(netdev: str | None, ipv4_of: Mapping[str, Sequence[str]], data_ip: str | None) -> tuple[str, ...]:
    """The IPv4 addresses a RoCE twin's GID must map: those on the twin's own netdev (`ipv4_of`: netdev ->
    ["a.b.c.d/nn" or "a.b.c.d", ...]); the node's data_ip when the twin's netdev or its addresses are unknown.
    Each CX-7 twin has its own /24 (host setup's netplan), so the second twin's GID maps its own address, not
    the data_ip; NCCL uses the same NCCL_IB_GID_INDEX on every HCA it is given."""
    own = tuple(a.split("/", 1)[0] for a in ipv4_of.get(netdev or "", ()))
    return own or ((data_ip,) if data_ip else ())


def port_gid_index(port: "RdmaPort", ipv4: str | Iterable[str] | None = None) -> int | None:
    """`roce_v2_ipv4_gid_index` on a port parsed by `parse_rdma` (doctor's probe lines)."""
    return roce_v2_ipv4_gid_index({i: g for i, g, _, _ in port.gids}, {i: t for i, _, _, t in port.gids}, ipv4)


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
class GpuClocks:
    """One line of the `gpu_clocks` query (GPU_CLOCK_FIELDS); None where nvidia-smi says [N/A]/[Not Supported]."""

    sm_mhz: float | None
    max_sm_mhz: float | None
    util_pct: float | None
    temp_c: float | None
    hw_thermal: bool | None  # clocks_event_reasons.hw_thermal_slowdown Active
    sw_thermal: bool | None


def parse_gpu_clocks(text: str) -> GpuClocks | None:
    """The first GPU's line of `nvidia-smi --query-gpu=GPU_CLOCK_FIELDS --format=csv,noheader,nounits`."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 6:
            continue

        def number(c: str) -> float | None:
            try:
                return float(c)
            except ValueError:
                return None

        def active(c: str) -> bool | None:
            return {"active": True, "not active": False}.get(c.lower())

        return GpuClocks(*(number(c) for c in cells[:4]), active(cells[4]), active(cells[5]))
    return None


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


@dataclass(frozen=True)
class UnitState(Mapping[str, str]):
    """One unit's block of `systemctl show` output, read as {property: value}. A property printed more than
    once (ExecStartPre with two commands) reads as its first value; `commands()` sees every one."""

    pairs: tuple[tuple[str, str], ...]

    def __getitem__(self, key: str) -> str:
        for k, v in self.pairs:
            if k == key:
                return v
        raise KeyError(key)

    def __iter__(self):
        return iter(dict(self.pairs))

    def __len__(self) -> int:
        return len(dict(self.pairs))

    def commands(self) -> list[str]:
        """The Exec* lines as `ExecStart=CMD`: only the command, because `{ path=... ; argv[]=CMD ; ... pid=N ;
        status=... }` carries numbers (pids) that must not be mistaken for our ports."""
        out: list[str] = []
        for key, value in self.pairs:
            if key.startswith("Exec") and value:
                argvs = re.findall(r"argv\[\]=([^;]*)", value)
                out.extend(f"{key}={a.strip()}" for a in argvs) if argvs else out.append(f"{key}={value}")
        return out


def unit_show_argv(units: Sequence[str], properties: Sequence[str]) -> list[str]:
    """The one command that reads unit states; `parse_unit_states` reads its output."""
    return ["systemctl", "show", "--no-pager", *(arg for p in properties for arg in ("-p", p)), *units]


def parse_unit_states(text: str) -> list[UnitState]:
    """`systemctl show [-p P ...] UNIT...` -> one UnitState per unit, in order (blocks split by blank lines)."""
    states = []
    for block in re.split(r"\n\s*\n", text.strip()):
        pairs = tuple((k.strip(), v.strip()) for k, sep, v in (line.partition("=") for line in block.splitlines())
                      if sep and k.strip())
        if pairs:
            states.append(UnitState(pairs))
    return states


def unit_state(text: str) -> UnitState:
    """One unit's state (the first block; empty when systemctl printed nothing)."""
    return next(iter(parse_unit_states(text)), UnitState(()))


def parse_units(text: str) -> dict[str, list[str]]:
    """`systemctl show -p Id -p ExecStart -p ExecStartPre UNIT...` -> {unit: ["ExecStart=...", ...]}."""
    return {u["Id"]: u.commands() for u in parse_unit_states(text) if u.get("Id")}


#: The commands of another inference stack (or of a Ray of its own) in an enabled unit.
OTHER_STACK = re.compile(r"vllm|sglang|llama[-_.]?server|tensorrt|trtllm|\bray start\b", re.I)


def stale_units(units: Mapping[str, Sequence[str]], ports: Iterable[int], ours: Callable[[str], bool]) -> list[str]:
    """THE stale-unit rule (doctor reports, `up` disables, health fails on the same units): an enabled unit, not
    ours, whose commands run another inference stack or publish or serve one of our ports (`:8000`,
    `--port 8000`; a pid or a length that happens to be 8000 is not a port)."""
    port = re.compile("|".join(rf"(?::|--port[= ]){p}(?![0-9])" for p in ports) or "(?!)")
    return sorted(u for u, execs in units.items()
                  if not ours(u) and (OTHER_STACK.search(" ".join(execs)) or port.search(" ".join(execs))))


# ----------------------------------------------------------------------------------- one node, parsed
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


# ------------------------------------------------------------------------------------ the planner's gather
#: What the planner reads (`facts.from_probe`): doctor's own sections, so `up` and `doctor` plan on the same facts.
GATHER_SECTIONS: dict[str, str] = {k: SECTIONS[k]
                                   for k in ("meminfo", "links", "addrs", "gpu", "rdma", "docker", "enabled_units")}


def gather_argv() -> list[str]:
    return ["sh", "-c", probe_script(GATHER_SECTIONS), "gather"]


# ------------------------------------------------------------------------------------------- host setup
#: What `host setup` reads: the tools it may install or use, and doctor's own earlyoom, sshd and rdma sections.
HOST_STATE_SECTIONS: dict[str, str] = {
    "pkg": ("for t in earlyoom rsync apt-get netplan; do "
            "if command -v $t >/dev/null 2>&1; then echo \"$t=yes\"; else echo \"$t=no\"; fi; done"),
    **{k: SECTIONS[k] for k in ("earlyoom", "sshd", "rdma")},
}


def host_state_argv() -> list[str]:
    return ["sh", "-c", probe_script(HOST_STATE_SECTIONS), "host-state"]
