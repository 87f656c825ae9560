"""The doctor's checks: pure functions of a node's spec (from the inventory) and its `HostFacts` (one probe
round trip, parsed by `probes`) that return a `verdict.Result` with reason and fix; `run_checks` runs them all.
No I/O here, so every check is unit-tested with captured output; `doctor.examine` does the reading.

Honesty rules: a check that cannot be judged on this node says `skipped` and why (no GPU on a simulated
node, no RDMA devices in a container), never `ok`. Simulated nodes share the host's kernel and clock: the
kernel-module check says so instead of inventing a verdict, and the clock check says skew is zero by
construction there. The RoCE GID check applies the planner's own rule (`probes.roce_v2_ipv4_gid_index` on
each twin's addresses), so doctor passes exactly the NCCL_IB_GID_INDEX the plan will set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

from sparkdeploy.model.topology import LinkPair
from sparkdeploy.node.memguard import memory_margin
from sparkdeploy.node.probes import (
    HostFacts,
    has_cap_sys_resource,
    nccl_version,
    parse_df_line,
    parse_gpu_clocks,
    parse_ip_addr,
    parse_ip_link,
    parse_kv,
    parse_meminfo,
    parse_rdma,
    parse_speeds,
    parse_units,
    port_gid_index,
    stale_units,
    twin_addresses,
)
from sparkdeploy.ops.hostsetup import DATA_PLANE_MTU, EARLYOOM_AVOID, EARLYOOM_PREFER
from sparkdeploy.verdict import Result, Status

GIB = 1 << 30

#: clock skew between nodes: above WARN is a warning, above FAIL a failure (seconds)
CLOCK_SKEW_WARN_S = 0.5
CLOCK_SKEW_FAIL_S = 5.0
#: A pair is FAILED below this share of its ports' negotiated speed: RDMA (ib_write_bw) reaches most of the link;
#: parallel Python TCP streams are CPU-bound, so their share is lower. A degraded CX-7 (~13 Gbit/s on a link that
#: reports 200G, dgx-spark-playbooks#108) is far under both.
BANDWIDTH_SHARE = {"ib_write_bw": 0.5, "tcp": 0.1}
#: Where the speed is not reported: Gbit/s below which a pair is judged slow (WARN). GB10 pairs: a CX-7 path
#: carries tens of Gbit/s, while the management network or a 10GbE port cannot pass 10. CPU-only (sim) nodes
#: share a bridge, not a NIC: there only a path that barely works is judged.
BANDWIDTH_FLOOR_GBIT_GPU = 10.0
BANDWIDTH_FLOOR_GBIT_CPU = 1.0
#: SM clock at or below this while the GPU is busy is the stuck low-power state (~702 MHz, eugr/spark-vllm-docker#334)
STUCK_SM_MHZ = 800.0
#: utilization from which the SM clock must have ramped up
BUSY_UTIL_PCT = 50.0
#: free space wanted under the docker root for the serving image (GB10 image ~15-20 GB; sim image ~3 GB)
DOCKER_FREE_GPU = 25 * GIB
DOCKER_FREE_SIM = 3 * GIB
#: headroom on top of the checkpoint's missing bytes (rsync writes each file to a temp beside it)
DISK_HEADROOM = 1 * GIB
#: the GPU a DGX Spark reports
GB10_NAME = "NVIDIA GB10"
#: the kernel builds known to break a multi-node Spark, with their source and fix (data, not code)
BAD_KERNELS_FILE = "deploy/host/bad-kernels.yaml"


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


# ----------------------------------------------------------------------------------------------- checks
Check = Callable[[NodeSpec, HostFacts], Result]


def _r(check: str, node: str, status: Status, reason: str, fix: str = "") -> Result:
    return Result(check, node, status, reason, fix)


def check_ssh(spec: NodeSpec, facts: HostFacts) -> Result:
    if facts.error:
        return _r("ssh", spec.name, Status.FAILED, facts.error,
                  "make key login work: `ssh-copy-id -i KEY USER@HOST`, check the host key in known_hosts "
                  "(or --trust-new-hosts once), and that sshd runs")
    return _r("ssh", spec.name, Status.OK, "logged in by key with host-key checking on; probe ran")


def check_gpu(spec: NodeSpec, facts: HostFacts) -> Result:
    if not spec.has_gpu:
        return _r("gpu", spec.name, Status.SKIPPED,
                  "inventory says gpu: none (simulated node); a GB10 cannot be checked here")
    gpus = facts.gpus
    if not gpus:
        return _r("gpu", spec.name, Status.FAILED,
                  f"nvidia-smi gave no GPU ({facts.text('gpu').strip()[:120] or 'no output'})",
                  "install the NVIDIA driver matching the kernel (DGX OS: `apt install nvidia-driver-580-open` "
                  "or the DGX OS update), then reboot")
    names = {g.name for g in gpus}
    if names != {GB10_NAME}:
        return _r("gpu", spec.name, Status.FAILED, f"GPU is {', '.join(sorted(names))}, expected {GB10_NAME}",
                  "this kit targets DGX Spark (GB10); set gpu: none in the inventory for other nodes")
    return _r("gpu", spec.name, Status.OK, f"{GB10_NAME}, driver {gpus[0].driver}")


def check_kernel_modules(spec: NodeSpec, facts: HostFacts) -> Result:
    kernel = facts.text("uname").strip() or "?"
    kv = facts.kv("modules")
    container = facts.in_container
    if container:
        return _r("kernel-modules", spec.name, Status.SKIPPED,
                  f"node runs in a {container} container: kernel {kernel} is the host's and "
                  f"/lib/modules/{kernel} is {'visible' if kv.get('modules_dep') == 'yes' else 'not visible'} here, "
                  "so kernel/module drift can only be checked on a real host")
    if kv.get("modules_dep") != "yes":
        return _r("kernel-modules", spec.name, Status.FAILED,
                  f"no /lib/modules/{kernel}/modules.dep: the running kernel has no installed modules",
                  f"install linux-modules for {kernel} (DGX OS: `apt install linux-modules-nvidia-*-{kernel}`) "
                  "or boot the kernel the modules belong to")
    if spec.has_gpu:
        have, loaded = kv.get("modinfo_nvidia", ""), kv.get("loaded_nvidia", "")
        if not have:
            return _r("kernel-modules", spec.name, Status.FAILED,
                      f"no nvidia module for the running kernel {kernel}",
                      f"install linux-modules-nvidia-<branch>-{kernel} matching the driver, then reboot")
        driver = next((g.driver for g in facts.gpus), "")
        if loaded and driver and loaded != driver:
            return _r("kernel-modules", spec.name, Status.FAILED,
                      f"loaded nvidia module {loaded} differs from the user-space driver {driver}",
                      "reboot so the installed module loads; keep driver and module packages in step")
    return _r("kernel-modules", spec.name, Status.OK,
              f"modules for {kernel} present" + (f", nvidia {kv.get('modinfo_nvidia')}" if spec.has_gpu else ""))


@dataclass(frozen=True)
class BadKernel:
    kernel: str
    breaks: str
    source: str
    fix: str
    cured_by: str | None = None


def load_bad_kernels(path=None) -> dict[str, BadKernel]:
    """{uname -r: entry} from deploy/host/bad-kernels.yaml (or `path`); a malformed entry names its field."""
    from sparkdeploy import paths, yamlfile
    from sparkdeploy.errors import InventoryError

    file = path or paths.repo_root() / BAD_KERNELS_FILE
    raw = yamlfile.load(file, "bad-kernel list")
    entries = raw.get("kernels") if isinstance(raw, dict) else None
    if not isinstance(entries, list):
        raise InventoryError("expected `kernels:` with a list of entries", file=str(file), field="kernels")
    out = {}
    for i, e in enumerate(entries):
        keys = {"kernel", "breaks", "source", "fix", "cured_by"}
        if not isinstance(e, dict) or not {"kernel", "breaks", "source", "fix"} <= set(e) <= keys or \
                not all(isinstance(v, str) for v in e.values()):
            raise InventoryError(f"expected text fields kernel, breaks, source, fix (and optional cured_by)",
                                 file=str(file), field=f"kernels[{i}]")
        out[e["kernel"]] = BadKernel(**e)
    return out


def check_kernel(spec: NodeSpec, facts: HostFacts, *, bad: Mapping[str, BadKernel] | None = None) -> Result:
    """The running kernel against the list of builds known to break NCCL over RoCE (the field's Sep 2026 reports)."""
    kernel = facts.text("uname").strip()
    if not kernel:
        return _r("kernel", spec.name, Status.FAILED, "uname -r printed nothing", "check the node's shell")
    entry = (load_bad_kernels() if bad is None else bad).get(kernel)
    whose = f" (the host's kernel: the node runs in a {facts.in_container} container)" if facts.in_container else ""
    if entry is None:
        return _r("kernel", spec.name, Status.OK, f"kernel {kernel}{whose} is not on the known-bad list "
                  f"({BAD_KERNELS_FILE})")
    cmdline = facts.kv("modules").get("cmdline", "").split()
    if entry.cured_by and entry.cured_by in cmdline:
        return _r("kernel", spec.name, Status.OK, f"kernel {kernel}{whose} is on the known-bad list but boots with "
                  f"{entry.cured_by}, the reported workaround ({entry.source})")
    return _r("kernel", spec.name, Status.FAILED, f"kernel {kernel}{whose}: {entry.breaks} ({entry.source})", entry.fix)


def check_gpu_clocks(spec: NodeSpec, facts: HostFacts) -> Result:
    """A GB10 stuck in its ~702 MHz low-power state (only a busy GPU shows it) and thermal slowdown."""
    if not spec.has_gpu:
        return _r("gpu-clocks", spec.name, Status.SKIPPED, "inventory says gpu: none; no clocks to read")
    got = parse_gpu_clocks(facts.text("gpu_clocks")) if facts.rc("gpu_clocks") == 0 else None
    if got is None:
        return _r("gpu-clocks", spec.name, Status.WARN,
                  f"nvidia-smi gave no clocks ({facts.text('gpu_clocks').strip()[:120] or 'no output'})",
                  "check the NVIDIA driver (`nvidia-smi -q -d CLOCK`)")
    seen = (f"SM {got.sm_mhz:.0f} MHz" if got.sm_mhz is not None else "SM clock n/a") + \
        (f" at {got.util_pct:.0f} % busy" if got.util_pct is not None else "") + \
        (f", {got.temp_c:.0f} C" if got.temp_c is not None else "")
    if got.hw_thermal or got.sw_thermal:
        kind = " and ".join(k for k, on in (("hardware", got.hw_thermal), ("software", got.sw_thermal)) if on)
        return _r("gpu-clocks", spec.name, Status.FAILED, f"{seen}: {kind} thermal slowdown active",
                  "cap the clock (`nvidia-smi -lgc 0,2000`: about 10 C cooler with no reported speed loss, "
                  "MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark#146) and clear the box's air intake")
    if got.sm_mhz is not None and got.util_pct is not None and got.util_pct >= BUSY_UTIL_PCT \
            and got.sm_mhz <= STUCK_SM_MHZ:
        return _r("gpu-clocks", spec.name, Status.FAILED,
                  f"{seen}: the GPU is stuck in its low-power state (throughput halves)",
                  "remove AC power for a minute, then power on: a reboot does not clear it "
                  "(eugr/spark-vllm-docker#334)")
    idle = got.util_pct is not None and got.util_pct < BUSY_UTIL_PCT
    return _r("gpu-clocks", spec.name, Status.OK, seen + ", no thermal slowdown" +
              ("; idle, so a stuck clock would not show: doctor judges it while the engine serves" if idle else ""))


def check_roce_twins(spec: NodeSpec, facts: HostFacts) -> Result:
    if not spec.hca:
        return _r("roce-twins", spec.name, Status.SKIPPED, "inventory lists no RoCE devices (hca: [])")
    ports = parse_rdma(facts.text("rdma"))
    if not ports:
        where = f" (a {facts.in_container} container has no /sys/class/infiniband)" if facts.in_container else ""
        return _r("roce-twins", spec.name, Status.FAILED, f"no RDMA devices found{where}",
                  "load the mlx5 drivers (DGX OS ships them); check `ibdev2netdev`")
    missing = [d for d in spec.hca if d not in ports]
    down = [d for d in spec.hca if d in ports and not ports[d].active]
    if missing or down:
        bits = ([f"missing: {', '.join(missing)}"] if missing else []) + \
               ([f"not ACTIVE: {', '.join(f'{d} ({ports[d].state})' for d in down)}"] if down else [])
        return _r("roce-twins", spec.name, Status.FAILED, "; ".join(bits),
                  "a warm reboot can leave one twin down: cold-boot the node (power off, wait, on); "
                  "check the cable and `ibdev2netdev`")
    return _r("roce-twins", spec.name, Status.OK, f"{', '.join(spec.hca)} ACTIVE")


def check_mtu(spec: NodeSpec, facts: HostFacts) -> Result:
    links = parse_ip_link(facts.text("links"))
    want = [spec.netdev] + [p.netdev for d, p in parse_rdma(facts.text("rdma")).items()
                            if d in spec.hca and p.netdev and p.netdev != spec.netdev]
    missing = [n for n in want if n not in links]
    if missing:
        return _r("mtu", spec.name, Status.FAILED, f"data-plane interface {', '.join(missing)} not found",
                  "fix netdev in the inventory (see `ip link`), or `sparkdeploy host setup --apply-network`")
    bad = [f"{n} mtu {links[n].mtu}" for n in want if links[n].mtu != DATA_PLANE_MTU]
    down = [n for n in want if not links[n].up]
    if bad or down:
        reason = "; ".join(([", ".join(bad) + f" (want {DATA_PLANE_MTU})"] if bad else []) +
                           ([f"{', '.join(down)} not up"] if down else []))
        return _r("mtu", spec.name, Status.FAILED, reason,
                  f"set mtu: {DATA_PLANE_MTU} for the CX-7 twins in /etc/netplan/40-cx7.yaml "
                  "(`sparkdeploy host setup --apply-network`), then check both ends; firmware updates reset it")
    addrs = parse_ip_addr(facts.text("addrs")).get(spec.netdev, [])
    if not any(a.split("/")[0] == spec.data_ip for a in addrs):
        return _r("mtu", spec.name, Status.FAILED,
                  f"{spec.netdev} mtu {links[spec.netdev].mtu} but data_ip {spec.data_ip} is not on it "
                  f"(has {', '.join(addrs) or 'no IPv4'})",
                  "fix data_ip/netdev in the inventory or the netplan addresses")
    return _r("mtu", spec.name, Status.OK, ", ".join(f"{n} mtu {links[n].mtu} up" for n in want))


def check_roce_gid(spec: NodeSpec, facts: HostFacts) -> Result:
    """The planner's GID rule on each twin (the RoCE v2 GID mapping the twin's own IPv4 address, the data_ip
    where that is unknown); NCCL takes one NCCL_IB_GID_INDEX for all HCAs, so differing indices warn."""
    if not spec.hca:
        return _r("roce-gid", spec.name, Status.SKIPPED, "inventory lists no RoCE devices (hca: [])")
    ports, addrs = parse_rdma(facts.text("rdma")), parse_ip_addr(facts.text("addrs"))
    found, missing = {}, []
    for dev in spec.hca:
        port = ports.get(dev)
        idx = port_gid_index(port, twin_addresses(port.netdev, addrs, spec.data_ip)) if port else None
        if idx is None:
            missing.append(dev)
        else:
            found[dev] = idx
    if missing:
        return _r("roce-gid", spec.name, Status.FAILED,
                  f"no RoCE v2 IPv4-mapped GID on {', '.join(missing)}",
                  "give the twin an IPv4 address (netplan) so the ::ffff:a.b.c.d GID appears; never pin "
                  "NCCL_IB_GID_INDEX to one literal for both nodes")
    seen = "RoCE v2 GID index " + ", ".join(f"{d}={i}" for d, i in found.items())
    if len(set(found.values())) > 1:
        return _r("roce-gid", spec.name, Status.WARN, seen + ": differs across HCAs, so the plan leaves "
                  "NCCL_IB_GID_INDEX unset", "give every twin the same GID layout (an IPv4 address on each, "
                  "`sparkdeploy host setup --apply-network`)")
    return _r("roce-gid", spec.name, Status.OK, seen)


def _earlyoom_args_ok(cmdline: str) -> list[str]:
    problems = []
    if EARLYOOM_PREFER not in cmdline:
        problems.append(f"--prefer {EARLYOOM_PREFER} missing")
    if EARLYOOM_AVOID not in cmdline:
        problems.append(f"--avoid {EARLYOOM_AVOID} missing")
    return problems


def check_earlyoom(spec: NodeSpec, facts: HostFacts) -> Result:
    kv = facts.kv("earlyoom")
    fix = "`sparkdeploy host setup` (installs earlyoom with the kit's prefer/avoid lists and enables it)"
    if not kv.get("bin"):
        return _r("earlyoom", spec.name, Status.FAILED, "earlyoom is not installed", fix)
    if kv.get("active") != "active":
        return _r("earlyoom", spec.name, Status.FAILED,
                  f"earlyoom is {kv.get('active') or 'unknown'} (enabled: {kv.get('enabled') or '?'})",
                  "`systemctl enable --now earlyoom`, or " + fix)
    problems = _earlyoom_args_ok(kv.get("cmdline", ""))
    if problems:
        return _r("earlyoom", spec.name, Status.FAILED,
                  f"earlyoom runs without the kit's lists ({'; '.join(problems)})", fix)
    if kv.get("enabled") != "enabled":
        return _r("earlyoom", spec.name, Status.WARN, "earlyoom active but not enabled at boot",
                  "`systemctl enable earlyoom`")
    return _r("earlyoom", spec.name, Status.OK, "installed, enabled, active with the kit's prefer/avoid lists")


def check_sshd_oom(spec: NodeSpec, facts: HostFacts) -> Result:
    kv = facts.kv("sshd")
    fix = "`sparkdeploy host setup` (drop-in OOMScoreAdjust=-1000 for ssh.service, then restart sshd)"
    unit, live, unit_adj = kv.get("unit", "ssh"), kv.get("live_adj", ""), kv.get("unit_adj", "")
    if not live:
        return _r("sshd-oom", spec.name, Status.FAILED, f"{unit}.service has no running main process", fix)
    if live != "-1000" and unit_adj == "-1000" and not has_cap_sys_resource(kv.get("capbnd", "")):
        return _r("sshd-oom", spec.name, Status.SKIPPED,
                  f"{unit}.service pins OOMScoreAdjust=-1000 but the running sshd has {live}: this node has no "
                  "CAP_SYS_RESOURCE (a container), so no process here can go below 0; a real host applies it")
    if live != "-1000":
        return _r("sshd-oom", spec.name, Status.FAILED,
                  f"sshd (pid {kv.get('pid')}) oom_score_adj {live}: an OOM cascade can kill SSH and strand the box",
                  fix)
    if unit_adj != "-1000":
        return _r("sshd-oom", spec.name, Status.WARN,
                  f"sshd protects itself at run time (oom_score_adj -1000) but {unit}.service does not pin "
                  f"OOMScoreAdjust (is {unit_adj or 'unset'})", fix)
    return _r("sshd-oom", spec.name, Status.OK, f"{unit}.service OOMScoreAdjust=-1000, live sshd -1000")


def check_disk(spec: NodeSpec, facts: HostFacts, *, checkpoint_bytes: int = 0) -> Result:
    kv = facts.kv("disk")
    fix_ckpt = "free space on that file system, or point model.host_dir at a larger one"
    ck = parse_df_line(kv.get("ckpt_df", ""), kv.get("ckpt_path", ""))
    present = int(kv.get("ckpt_present") or 0)
    problems, seen = [], []
    if spec.checkpoint_dir:
        if ck is None:
            return _r("disk", spec.name, Status.FAILED, f"cannot read free space for {spec.checkpoint_dir}",
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
        return _r("disk", spec.name, Status.FAILED, "; ".join(p for _, p in problems),
                  "; ".join(fixes[k] for k, _ in problems))
    if not seen:
        return _r("disk", spec.name, Status.SKIPPED, "no checkpoint dir and no docker root to check")
    return _r("disk", spec.name, Status.OK, "; ".join(seen))


def check_docker(spec: NodeSpec, facts: HostFacts) -> Result:
    kv = facts.kv("docker")
    if facts.rc("docker") == 127 or not kv.get("server"):
        return _r("docker", spec.name, Status.FAILED,
                  "docker CLI missing" if facts.rc("docker") == 127 else "docker daemon not answering",
                  "install docker (DGX OS ships it) and `systemctl enable --now docker`; add the SSH user to "
                  "the docker group or log in as root")
    runtimes = kv.get("runtimes", "").split()
    if not spec.has_gpu:
        return _r("docker", spec.name, Status.OK,
                  f"docker {kv['server']} answering; NVIDIA runtime not needed (gpu: none)")
    if "nvidia" not in runtimes:
        return _r("docker", spec.name, Status.FAILED,
                  f"docker {kv['server']} has no nvidia runtime (runtimes: {', '.join(runtimes) or 'none'})",
                  "install nvidia-container-toolkit and `nvidia-ctk runtime configure --runtime=docker`, "
                  "then `systemctl restart docker`")
    return _r("docker", spec.name, Status.OK, f"docker {kv['server']} with the nvidia runtime")


def check_gpu_processes(spec: NodeSpec, facts: HostFacts, *, ours: Iterable[str] = ()) -> Result:
    if not spec.has_gpu:
        return _r("gpu-processes", spec.name, Status.SKIPPED, "inventory says gpu: none; nothing to list")
    if facts.rc("gpu_procs") != 0:
        return _r("gpu-processes", spec.name, Status.FAILED,
                  f"cannot list GPU processes ({facts.text('gpu_procs').strip()[:120] or 'nvidia-smi failed'})",
                  "install the NVIDIA driver (nvidia-smi)")
    ours = set(ours)
    others = []
    for line in facts.text("gpu_procs").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2 and parts[0].isdigit() and parts[0] not in ours:
            others.append(f"pid {parts[0]} {parts[1]}" + (f" ({parts[2]})" if len(parts) > 2 else ""))
    if others:
        return _r("gpu-processes", spec.name, Status.FAILED,
                  f"other processes hold the GPU (and unified memory): {'; '.join(others[:5])}",
                  "stop them (a desktop session: `systemctl set-default multi-user.target`; another server: "
                  "`sparkdeploy down` or its own unit)")
    return _r("gpu-processes", spec.name, Status.OK, "no other process on the GPU")


def check_stale_units(spec: NodeSpec, facts: HostFacts, *, own_prefix: str = "sparkdeploy",
                      ports: Iterable[int] = ()) -> Result:
    units = parse_units(facts.text("enabled_units"))
    stale = stale_units(units, ports, lambda u: u.startswith(own_prefix))
    if stale:
        return _r("stale-units", spec.name, Status.FAILED,
                  f"enabled at boot and would start another inference stack: {', '.join(stale)}",
                  f"`systemctl disable --now {' '.join(stale)}` (or `sparkdeploy up`, which disables them and says so)")
    return _r("stale-units", spec.name, Status.OK, f"{len(units)} enabled services, none runs another stack")


def check_memory(spec: NodeSpec, facts: HostFacts, *, need_bytes: int = 0, reserve_bytes: int = 0) -> Result:
    mem = parse_meminfo(facts.text("meminfo"))
    avail, total = mem.get("MemAvailable"), mem.get("MemTotal")
    if avail is None:
        return _r("memory", spec.name, Status.FAILED, "no MemAvailable in /proc/meminfo", "")
    return memory_margin("memory", spec.name, avail, need_bytes, reserve_bytes, total=total)


def check_timesync(spec: NodeSpec, facts: HostFacts) -> Result:
    kv = facts.kv("timesync")
    daemon = kv.get("daemon")
    if facts.in_container:
        return _r("timesync", spec.name, Status.SKIPPED,
                  f"node runs in a {facts.in_container} container: its clock is the host kernel's; "
                  f"NTP {'reported synchronized' if kv.get('ntp') == 'yes' else 'state not visible'} here")
    if kv.get("ntp") == "yes":
        return _r("timesync", spec.name, Status.OK, f"NTP synchronized ({daemon or 'timedatectl'})")
    return _r("timesync", spec.name, Status.WARN,
              f"clock not NTP-synchronized ({'daemon ' + daemon if daemon else 'no time daemon active'})",
              "`timedatectl set-ntp true` (systemd-timesyncd) or configure chrony")


NODE_CHECKS: tuple[Check, ...] = (
    check_ssh, check_gpu, check_gpu_clocks, check_kernel, check_kernel_modules, check_roce_twins, check_mtu, check_roce_gid, check_earlyoom,
    check_sshd_oom, check_disk, check_docker, check_gpu_processes, check_stale_units, check_memory,
    check_timesync,
)


# ----------------------------------------------------------------------------------- checks across nodes
def check_driver_match(specs: Sequence[NodeSpec], facts: Mapping[str, HostFacts]) -> Result:
    drivers = {}
    for s in specs:
        f = facts.get(s.name)
        if f is None or f.error:
            continue
        gpus = f.gpus if (s.has_gpu or "driver" in f.overrides) else []
        if gpus and gpus[0].driver:
            drivers[s.name] = gpus[0].driver
    if not drivers:
        return _r("driver-match", "cluster", Status.SKIPPED,
                  "no node reports a GPU driver (inventory gpu: none and no facts file)")
    if len(set(drivers.values())) > 1:
        seen = ", ".join(f"{n} {d}" for n, d in sorted(drivers.items()))
        return _r("driver-match", "cluster", Status.FAILED, f"driver versions differ: {seen}",
                  "install the same driver branch on every node (DGX OS: same nvidia-driver-<branch> and "
                  "linux-modules-nvidia-<branch> packages), reboot, re-run doctor; 580.x is the tested branch")
    only = "" if len(drivers) == len(specs) else f" (only {', '.join(sorted(drivers))} report one)"
    return _r("driver-match", "cluster", Status.OK, f"driver {next(iter(drivers.values()))} on all nodes{only}")


def check_reach(specs: Sequence[NodeSpec], facts: Mapping[str, HostFacts],
                also: Mapping[str, HostFacts] | None = None, paths: Mapping[tuple[str, str], str] | None = None
                ) -> Result:
    """Every path a node tried (its probe's `reach` lines); `also`: nodes outside the service that must reach it
    (the router's node, a ring's third node), probed for their paths only; `paths`: {(node, address): 'node
    netdev -> peer netdev'}, so a broken link is named by both its ports."""
    also, paths = also or {}, paths or {}
    if len(specs) < 2 and not also:
        return _r("data-plane-reach", "cluster", Status.SKIPPED, "one node: nothing to reach")
    bad, good = [f"{n} (outside the service): not reached: {f.error}" for n, f in also.items() if f.error], 0
    for name, f in [(s.name, facts.get(s.name)) for s in specs] + list(also.items()):
        if f is None or f.error:
            continue
        for line in f.text("reach").splitlines():
            parts = line.split(None, 2)
            if len(parts) >= 2:
                if parts[1] in ("ok", "refused"):  # refused: the path works, nothing listens there yet
                    good += 1
                else:
                    via = paths.get((name, parts[0].split(":")[0]), f"{name} ->")
                    bad.append(f"{via} {parts[0]}: {parts[2] if len(parts) > 2 else parts[1]}")
    if bad:
        return _r("data-plane-reach", "cluster", Status.FAILED, "; ".join(bad),
                  "check cables, the data_ip addresses and netplan on both ends, and that no firewall blocks "
                  "the data plane (TCP 22, the service ports named, and the ephemeral ports)")
    if good == 0:
        return _r("data-plane-reach", "cluster", Status.FAILED, "no node could report reachability",
                  "check SSH to the nodes first")
    return _r("data-plane-reach", "cluster", Status.OK,
              f"{good} node-to-node data-plane paths answer (SSH port, and the ports each pair must use)")


@dataclass(frozen=True)
class Measured:
    """One pair's measured data-plane bandwidth and how: `ib_write_bw` (RDMA) or `tcp` (parallel streams)."""

    gbit: float
    method: str = "tcp"


def check_bandwidth(specs: Sequence[NodeSpec], measured: Mapping[LinkPair, "Measured | float | str"],
                    speeds: Mapping[tuple[str, str], int] | None = None) -> Result:
    """`measured`: {link pair: Measured (a bare float is a TCP figure), or why the link could not be measured};
    `speeds`: {(node, netdev): negotiated Mbit/s}. A link far below the slower port's speed is FAILED naming both
    ports; where no speed is known, the absolute floors give a warning."""
    if len(specs) < 2 and not measured:
        return _r("data-plane-bandwidth", "cluster", Status.SKIPPED, "one node: no pair to measure")
    if not measured:
        return _r("data-plane-bandwidth", "cluster", Status.FAILED, "no pair could be measured",
                  "check SSH to the nodes first")
    gpu, speeds = {s.name: s.has_gpu for s in specs}, speeds or {}
    seen, failed, far_below, slow = [], [], [], []
    for pair, got in sorted(measured.items(), key=lambda kv: (kv[0].a, kv[0].b, kv[0].a_link.netdev)):
        ports = pair.describe()
        if isinstance(got, str):
            failed.append(f"{ports}: {got}")
            continue
        got = got if isinstance(got, Measured) else Measured(float(got))
        link = min((speeds[end] for end in ((pair.a, pair.a_link.netdev), (pair.b, pair.b_link.netdev))
                    if end in speeds), default=None)
        seen.append(f"{ports} {got.gbit:.1f} Gbit/s ({got.method}" + (f", link {link / 1000:g}G)" if link else ")"))
        if link:
            want = BANDWIDTH_SHARE[got.method] * link / 1000
            if got.gbit < want:
                far_below.append(f"{ports}: {got.gbit:.2f} Gbit/s ({got.method}) on a link negotiated at "
                                 f"{link / 1000:g} Gbit/s, below {want:g}")
            continue
        # a node outside the service (a ring's third node) is taken to be like the service's end of the link
        floor = BANDWIDTH_FLOOR_GBIT_GPU if all(gpu[n] for n in (pair.a, pair.b) if n in gpu) \
            else BANDWIDTH_FLOOR_GBIT_CPU
        if got.gbit < floor:
            slow.append(f"{ports} {got.gbit:.2f} Gbit/s, below {floor:g}")
    fix = ("the pair's traffic takes a slow or broken path: on each end check that data_ip sits on the CX-7 netdev "
           "(`ip route get <peer data_ip>` names it), its link speed (`ethtool <netdev>`), the MTU, and that no "
           "firewall drops TCP between the data_ips")
    degraded = ("a CX-7 that negotiates its speed but moves a fraction of it came up degraded (dgx-spark-playbooks#108): "
                "cold-boot the node that owns the port (power off, wait, on), reseat the cable, then re-run doctor; "
                "also check `ethtool <netdev>` and that no `tc` qdisc shapes the port")
    if failed:
        return _r("data-plane-bandwidth", "cluster", Status.FAILED, "; ".join(failed + seen), fix)
    if far_below:
        return _r("data-plane-bandwidth", "cluster", Status.FAILED, "; ".join(far_below), degraded)
    if slow:
        return _r("data-plane-bandwidth", "cluster", Status.WARN, "; ".join(slow), fix)
    return _r("data-plane-bandwidth", "cluster", Status.OK, "; ".join(seen))


def check_gid_plan(specs: Sequence[NodeSpec], facts: Mapping[str, HostFacts],
                   pinned: str | None = None) -> Result:
    """Each HCA's RoCE v2 IPv4 GID index now, across nodes and against the NCCL_IB_GID_INDEX the node will run
    with: the running release's (its engine.env, planned at `up`), else the profile's literal (`pinned`), else the
    plan sets the live value at `up`. The index moves after interface or firmware events (tonyd2wild/...#38,
    FujitsuPolycom/sparkring#186): a stale value hangs the TP handshake silently."""
    live: dict[str, dict[str, int]] = {}
    for s in specs:
        f = facts.get(s.name)
        if not s.hca or f is None or f.error:
            continue
        ports, addrs = parse_rdma(f.text("rdma")), parse_ip_addr(f.text("addrs"))
        live[s.name] = {dev: idx for dev in s.hca if (port := ports.get(dev)) is not None and
                        (idx := port_gid_index(port, twin_addresses(port.netdev, addrs, s.data_ip))) is not None}
    if not live:
        return _r("roce-gid-plan", "cluster", Status.SKIPPED, "no node lists RoCE devices (hca: [])")
    wrong = []
    for node, found in sorted(live.items()):
        deployed = parse_kv(facts[node].text("deployed")).get("NCCL_IB_GID_INDEX")
        expected, whence = (deployed, "the running release sets") if deployed is not None else (pinned, "the profile pins")
        for dev, idx in found.items():
            if expected is not None and expected != str(idx):
                wrong.append((node, dev, idx, f"{node} {dev}: RoCE v2 IPv4 GID is at index {idx}, "
                              f"{whence} NCCL_IB_GID_INDEX={expected or '(empty: GID 0, link-local)'}"))
    seen = "; ".join(f"{n} " + ", ".join(f"{d}={i}" for d, i in found.items()) for n, found in sorted(live.items()))
    if wrong:
        values = ", ".join(f"{n}: NCCL_IB_GID_INDEX={i}" for n, _, i, _ in wrong)
        return _r("roce-gid-plan", "cluster", Status.FAILED, "; ".join(w for *_, w in wrong) + f" (live: {seen})",
                  f"set {values} (per node): re-run `sparkdeploy up`, which plans each node's own index from the "
                  "live table; drop a literal NCCL_IB_GID_INDEX from the profile's env (one value for every node "
                  "breaks when the indices differ or move)")
    across = {i for found in live.values() for i in found.values()}
    note = "; differs across nodes: each node's engine gets its own" if len(across) > 1 else ""
    return _r("roce-gid-plan", "cluster", Status.OK, f"RoCE v2 IPv4 GID index {seen}{note}")


def check_nccl(node: str, probed: Mapping[str, str] | str, image_tag: str) -> Result:
    """The NCCL the engine will load (the image's pip copy if it has one, else the image's system library)
    against the host's. vllm#42354: a TP=2 hang at 20-26 minutes on Sparks ended by loading the system libnccl
    instead of the pip one."""
    if isinstance(probed, str):
        return _r("nccl-library", node, Status.WARN, f"not read: {probed}", "check docker on the node")
    if probed["image"] == "absent":
        return _r("nccl-library", node, Status.SKIPPED, f"{image_tag} is not on the node yet (`up` delivers it)")
    host, pip, system = probed["host"], probed["image_pip"], probed["image_system"]
    on_host = f"host has {nccl_version(host)}" if host else "no libnccl on the host"
    if not (pip or system):
        return _r("nccl-library", node, Status.OK, f"no NCCL in the serving image (a CPU engine); {on_host}")
    if pip and system and pip != system:
        return _r("nccl-library", node, Status.WARN,
                  f"the engine loads pip's NCCL {nccl_version(pip)} ({pip}), not the image's system library "
                  f"{nccl_version(system)}; {on_host}",
                  "vllm#42354: a TP=2 hang at 20-26 min on Sparks ended when the engine loaded the system libnccl: "
                  "make the image's pip libnccl.so.2 a link to its system one (or set VLLM_NCCL_SO_PATH), re-run up")
    loaded = f"pip's NCCL {nccl_version(pip)}" if pip and not system else f"the system NCCL {nccl_version(system)}"
    return _r("nccl-library", node, Status.OK, f"the engine loads {loaded}; {on_host}")


def check_ray(node: str, probed: Mapping[str, str] | str, image_tag: str) -> Result:
    """A `backend: ray` service's ranks start with `ray start` from the serving image: without Ray in it the head
    fails at its first line and `up` rolls back."""
    if isinstance(probed, str):
        return _r("ray", node, Status.WARN, f"not read: {probed}", "check docker on the node")
    if probed["image"] == "absent":
        return _r("ray", node, Status.SKIPPED, f"{image_tag} is not on the node yet (`up` delivers it)")
    if not probed["image_ray"]:
        return _r("ray", node, Status.FAILED, f"no Ray in the serving image {image_tag}: `ray start` would fail",
                  "use a base image with Ray (NVIDIA's vLLM images have it), or backend: mp")
    return _r("ray", node, Status.OK, f"Ray {probed['image_ray']} in the serving image")


def check_clock_skew(offsets: Mapping[str, tuple[float, float]], *, shared_kernel: bool = False) -> Result:
    """`offsets`: {node: (offset_s vs this machine, uncertainty_s = half the round trip)}."""
    if len(offsets) < 2:
        return _r("clock-skew", "cluster", Status.SKIPPED, "fewer than two nodes answered the clock probe")
    vals = {n: o for n, (o, _) in offsets.items()}
    skew = max(vals.values()) - min(vals.values())
    unc = max(u for _, u in offsets.values()) * 2
    seen = f"max skew {skew * 1000:.0f} ms (+/- {unc * 1000:.0f} ms): " + ", ".join(
        f"{n} {o * 1000:+.0f} ms" for n, o in sorted(vals.items()))
    note = " (simulated nodes share the host kernel's clock: zero skew by construction; this only shows the probe works)" \
        if shared_kernel else ""
    fix = "enable NTP on every node (`timedatectl set-ntp true` or chrony) against the same server"
    if skew - unc > CLOCK_SKEW_FAIL_S:
        return _r("clock-skew", "cluster", Status.FAILED, seen + note, fix)
    if skew - unc > CLOCK_SKEW_WARN_S:
        return _r("clock-skew", "cluster", Status.WARN, seen + note, fix)
    return _r("clock-skew", "cluster", Status.OK, seen + note)


def run_checks(specs: Sequence[NodeSpec], facts: Mapping[str, HostFacts], *,
               checkpoint_bytes: int = 0, need_bytes: int = 0, reserve_bytes: int = 0,
               ports: Iterable[int] = (), clock: Mapping[str, tuple[float, float]] | None = None,
               bandwidth: Mapping[tuple[str, str], Measured | float | str] | None = None,
               pinned_gid: str | None = None, outside: Mapping[str, HostFacts] | None = None,
               paths: Mapping[tuple[str, str], str] | None = None) -> list[Result]:
    """Every check on every node, then the checks across nodes. A node whose probe failed gets its SSH
    failure as the one result per check ("cannot judge: no SSH"), never a made-up verdict."""
    ports = tuple(ports)
    results: list[Result] = []
    for s in specs:
        f = facts.get(s.name) or HostFacts(s.name, error="not probed")
        for chk in NODE_CHECKS:
            if f.error and chk is not check_ssh:
                results.append(_r(chk.__name__[6:].replace("_", "-"), s.name, Status.FAILED,
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
    results.append(check_reach(specs, facts, outside, paths))
    results.append(check_gid_plan(specs, facts, pinned_gid))
    if bandwidth is not None:
        speeds = {(s.name, netdev): mbit for s in specs if (f := facts.get(s.name)) and not f.error
                  for netdev, mbit in parse_speeds(f.text("speed")).items()}
        results.append(check_bandwidth(specs, bandwidth, speeds))
    if clock is not None:
        shared = all((facts.get(s.name) and facts[s.name].in_container) for s in specs)
        results.append(check_clock_skew(clock, shared_kernel=shared))
    return results



def check_api_key(inv) -> Result:
    """Rank 0 serves on every interface of the head: without a key anyone on the LAN can use the model."""
    if inv.auth.api_key_file is not None:
        return _r("api-key", "cluster", Status.OK, f"API key from {inv.auth.api_key_file} (0600)")
    return _r("api-key", "cluster", Status.WARN,
              f"the API on {inv.head.data_ip}:{inv.ports.api} (all interfaces of {inv.head.name}) takes requests "
              "without a key", "set auth.api_key_file in the inventory (README: Real Sparks, step by step)")
