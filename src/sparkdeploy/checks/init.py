"""`sparkdeploy init HOST...`: read each box once over SSH and write the inventory that describes it.

Per box one round trip (`probes.INIT_SECTIONS`, the doctor probe's own sections where they overlap): MemTotal,
GPU and driver, kernel, every interface with its IPv4/prefix, MTU and state (`ip -o link`, `ip -o -4 addr`, read
by `probes.parse_netdevs` as for `up` and doctor), link speed, the RDMA devices on each
netdev and their RoCE v2 IPv4 GID index (the planner's rule, `probes.roce_v2_ipv4_gid_index`), and which netplan
or NetworkManager files configured the data ports (NVIDIA Sync's Cluster Assistant writes them: read and reported,
never rewritten).

The data ports are the up CX-7 netdevs (those with an RDMA device) that carry an IPv4 address (link-local
169.254/16 ignored); a box without RDMA devices (the sim) offers its other up interfaces. The layout follows
from the subnets the ports share:
  - direct cable: two boxes on one subnet (each CX-7 twin its own subnet: both end up in `hca`);
  - switch: every box on one subnet;
  - ring: each subnet joins exactly two boxes and each box has links to two peers (3 boxes: every pair).
Where the boxes do not say which layout is meant (two up ports of one box on one subnet, no shared subnet, a
mixed layout, no box linked to every other to be head), `InitError` lists the choices and the flag that picks
one (exit 2). Everything but the SSH read is pure and tested on recorded probe outputs.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Mapping, Sequence

from sparkdeploy.checks.preflight import GB10_NAME
from sparkdeploy.errors import InputError
from sparkdeploy.model.profile import find_profile, load_profile
from sparkdeploy.model.schema import NAME_RE
from sparkdeploy.node import probes
from sparkdeploy.node.facts import GIB

LINK_LOCAL = ipaddress.IPv4Network("169.254.0.0/16")
#: interfaces of a box without RDMA devices that never carry the data plane (container and VM plumbing)
NOT_DATA = ("lo", "docker", "br-", "veth", "virbr", "cni", "flannel", "tailscale", "wg", "ifb")
DEFAULT_PROFILE = {"gb10": "qwen3.8-flash-next-nvfp4", "none": "sim-tiny"}
#: The serving image's base for GB10 boxes, as in the shipped inventory.yaml (the sim profiles name their own).
GB10_IMAGE = ("image:   # pin the NGC vLLM image you tested (name@sha256:...)",
              "  base: nvcr.io/nvidia/vllm@sha256:3f1c7a9e5b2d8c4f6a0e9b7d5c3a1f8e6d4b2a0c9e7f5d3b1a8c6e4f2d0b9a7c",
              "  vllm_version: 0.34.0",
              "  repository: sparkdeploy/serving")


class InitError(InputError):
    """The boxes do not say which layout is meant (or cannot form one): the message lists the choices and the
    flag that picks one (exit 2)."""


@dataclass(frozen=True)
class Port:
    """One up interface with one IPv4 address: a candidate data link."""

    netdev: str
    ip: str
    prefix: int
    mtu: int | None = None
    speed_mbit: int | None = None
    hca: tuple[str, ...] = ()
    gid_index: int | None = None

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Interface(f"{self.ip}/{self.prefix}").network

    def describe(self) -> str:
        bits = [f"{self.ip}/{self.prefix}"]
        if self.speed_mbit:
            bits.append(f"{self.speed_mbit / 1000:g}G")
        if self.mtu:
            bits.append(f"MTU {self.mtu}")
        if self.hca:
            gid = "unknown" if self.gid_index is None else self.gid_index
            bits.append(f"{', '.join(self.hca)} RoCE v2 IPv4 GID {gid}")
        return f"{self.netdev} " + ", ".join(bits)


@dataclass(frozen=True)
class Box:
    host: str  # as given on the command line (an address or an ~/.ssh/config alias)
    name: str
    kernel: str
    mem_total: int
    gpu_name: str | None
    driver: str | None
    ports: tuple[Port, ...]
    network_files: tuple[str, ...] = ()  # "netplan /etc/netplan/40-cx7.yaml (enp1s0f1np1)" ...
    other_ports: tuple[Port, ...] = ()  # up, addressed, not CX-7 (the management port): a lone box's address

    @property
    def gpu(self) -> str:
        return "gb10" if self.gpu_name == GB10_NAME else "none"


def parse_box(host: str, output: str, reached_at: str | None = None) -> Box:
    """One box's init probe output -> Box (pure). `reached_at`: the address SSH reached the box on; on a box
    without RDMA devices that port is the management network, a data port only where the box has no other."""
    hf = probes.HostFacts.from_output(host, output)
    gpus = probes.parse_nvidia_smi(hf.text("gpu")) if hf.rc("gpu") == 0 else []
    rdma = probes.parse_rdma(hf.text("rdma"))
    speeds = probes.parse_speeds(hf.text("speed"))
    hca_of: dict[str, list[probes.RdmaPort]] = {}
    for port in rdma.values():
        if port.netdev:
            hca_of.setdefault(port.netdev, []).append(port)
    ports, others = [], []
    for dev in probes.parse_netdevs(hf.text("links"), hf.text("addrs")):
        if not dev.up or dev.name.startswith(NOT_DATA):
            continue
        for addr in dev.ipv4:
            iface = ipaddress.IPv4Interface(addr)
            if iface.ip in LINK_LOCAL or iface.ip.is_loopback:
                continue
            mine = hca_of.get(dev.name, [])
            gids = {probes.port_gid_index(p, str(iface.ip)) for p in mine} - {None}
            port = Port(dev.name, str(iface.ip), iface.network.prefixlen, dev.mtu, speeds.get(dev.name),
                        tuple(p.dev for p in mine), gids.pop() if len(gids) == 1 else None)
            (ports if mine or not rdma else others).append(port)
    if not rdma and len(ports) > 1:
        others += [p for p in ports if p.ip == reached_at]
        ports = [p for p in ports if p.ip != reached_at]
    data_netdevs = {p.netdev for p in ports}
    files = []
    for line in hf.text("network").splitlines():
        kind, _, rest = line.partition(" ")
        path, _, names = rest.partition(" ")
        touched = [n for n in names.split() if n in data_netdevs]
        if touched and kind in ("netplan", "nm"):
            where = "NetworkManager" if kind == "nm" else "netplan"
            lost = " (under /run: lost at reboot)" if path.startswith("/run/") else ""
            files.append(f"{where} {path} ({', '.join(touched)}){lost}")
    hostname = hf.text("hostname").strip().split(".")[0]
    name = host if NAME_RE.fullmatch(host) and not _is_address(host) else hostname
    if not NAME_RE.fullmatch(name):
        raise InitError(f"{host}: the box reports hostname {hostname!r}, which is no node name (letters, digits, "
                        "'.', '_', '-'): name it by an ~/.ssh/config Host alias instead of its address")
    return Box(host=host, name=name, kernel=hf.text("uname").strip(),
               mem_total=probes.parse_meminfo(hf.text("meminfo")).get("MemTotal", 0),
               gpu_name=gpus[0].name if gpus else None, driver=gpus[0].driver if gpus else None,
               ports=tuple(sorted(ports, key=lambda p: (p.netdev, p.ip))), network_files=tuple(files),
               other_ports=tuple(others))


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


# ---------------------------------------------------------------------------------------------- layout
@dataclass(frozen=True)
class NodeLinks:
    """What one node gets in the inventory: its data port, its HCAs, and per peer the link (ring)."""

    box: Box
    data: Port  # carries data_ip
    hca: tuple[str, ...]
    links: tuple[tuple[str, Port, tuple[str, ...]], ...] = ()  # (peer, port, hca) for a ring


@dataclass(frozen=True)
class Layout:
    kind: str  # direct | switch | ring
    nodes: tuple[NodeLinks, ...]  # the head first
    why: str


def _choose_ports(box: Box, pick: Mapping[str, str]) -> list[Port]:
    """The box's ports, one per subnet: two up ports on one subnet are ambiguous unless --netdev picks one."""
    by_net: dict[ipaddress.IPv4Network, list[Port]] = {}
    for p in box.ports:
        by_net.setdefault(p.network, []).append(p)
    out = []
    for net, ports in sorted(by_net.items(), key=lambda kv: kv[0]):
        if len(ports) > 1:
            chosen = [p for p in ports if p.netdev == pick.get(box.name)]
            if len(chosen) != 1:
                raise InitError(
                    f"node {box.name} has {len(ports)} up ports on {net}: "
                    + "; ".join(p.describe() for p in ports)
                    + f". Pick the one that carries data: --netdev {box.name}=" + "|".join(p.netdev for p in ports))
            ports = chosen
        out.append(ports[0])
    return out


def work_out(boxes: Sequence[Box], *, head: str | None = None, netdev: Mapping[str, str] | None = None) -> Layout:
    """The layout the boxes' subnets describe (pure). `head`: the head's name (default: the first box that has
    a link to every other, GB10s first); `netdev`: {node: netdev} where a box has two up ports on one subnet."""
    names = [b.name for b in boxes]
    if len(set(names)) != len(names):
        raise InitError(f"two hosts are the same box or share a hostname ({', '.join(names)}): give each box once, "
                        "by an ~/.ssh/config Host alias (its name in the inventory)")
    if not boxes:
        raise InitError("no host given: name each box (an address or an ~/.ssh/config alias)")
    ports = {b.name: _choose_ports(b, netdev or {}) for b in boxes}
    for b in boxes:
        if not ports[b.name] and len(boxes) > 1:
            raise InitError(f"node {b.name} has no up data port with an IPv4 address"
                            f"{' (CX-7 netdevs: none up)' if not b.ports else ''}: cable it and give the port an "
                            "address (NVIDIA Sync's Cluster Assistant, or `sparkdeploy host setup --apply-network`)")
    members: dict[ipaddress.IPv4Network, dict[str, Port]] = {}
    for name, mine in ports.items():
        for p in mine:
            members.setdefault(p.network, {})[name] = p
    shared = {net: m for net, m in members.items() if len(m) > 1}
    by = {b.name: b for b in boxes}
    if len(boxes) == 1:
        only = boxes[0]
        mine = ports[only.name] or list(only.other_ports)
        if not mine:
            raise InitError(f"node {only.name} has no up interface with an IPv4 address to serve on")
        return Layout("single", (NodeLinks(only, mine[0], mine[0].hca),), "one box: no data network needed")
    if not shared:
        seen = "; ".join(f"{n}: " + ", ".join(f"{p.netdev} {p.network}" for p in ports[n]) for n in names)
        raise InitError(f"no two nodes share a subnet ({seen}): the data ports are not cabled or addressed to each "
                        "other; set the network up with NVIDIA Sync's Cluster Assistant (direct, ring or switch) "
                        "and run init again")
    common = sorted(net for net, m in shared.items() if len(m) == len(boxes))
    peers = {n: sorted({o for m in shared.values() if n in m for o in m if o != n}) for n in names}
    alone = [n for n in names if not peers[n]]
    if alone:
        raise InitError(f"node(s) {', '.join(alone)} share no subnet with any other node; cable them or leave them "
                        f"out of the host list (linked: {', '.join(n for n in names if peers[n])})")
    if common:
        kind = "direct" if len(boxes) == 2 else "switch"
        why = (f"{'both' if len(boxes) == 2 else 'all'} nodes on {', '.join(map(str, common))}"
               + (" (one subnet per CX-7 twin)" if len(common) > 1 else ""))
        made = {n: NodeLinks(by[n], members[common[0]][n],
                             tuple(dict.fromkeys(h for net in common for h in members[net][n].hca))) for n in names}
    elif all(len(m) == 2 for m in shared.values()) and all(len(peers[n]) == 2 for n in names) and _one_cycle(peers):
        kind, why = "ring", "each subnet joins two nodes, each node links to two peers"
        made = {}
        for n in names:
            links = []
            for o in peers[n]:
                nets = sorted(net for net, m in shared.items() if set(m) == {n, o})
                links.append((o, members[nets[0]][n], tuple(dict.fromkeys(h for net in nets for h in members[net][n].hca))))
            made[n] = NodeLinks(by[n], links[0][1], tuple(dict.fromkeys(h for _, _, hs in links for h in hs)),
                                tuple(links))
    else:
        seen = "; ".join(f"{net}: {', '.join(sorted(m))}" for net, m in sorted(shared.items()))
        raise InitError(f"the subnets form neither a direct cable, a ring nor a switch ({seen}); leave out the "
                        "hosts that do not belong to this cluster, or fix the addressing and run init again")
    candidates = [n for n in names if len(peers[n]) == len(boxes) - 1]
    if head is not None:
        if head not in names:
            raise InitError(f"--head {head}: no such node; choose one of {', '.join(names)}")
        if head not in candidates:
            raise InitError(f"--head {head}: it has no link to {', '.join(sorted(set(names) - set(peers[head]) - {head}))}"
                            f"; choose one of {', '.join(candidates) or '(none: add links)'}")
    else:
        gb10 = [n for n in candidates if by[n].gpu == "gb10"] or candidates
        if not gb10:
            raise InitError(f"no node has a link to every other, so none can be head ({kind}: "
                            + "; ".join(f"{n} -> {', '.join(peers[n])}" for n in names)
                            + "); add the missing links, or list fewer hosts")
        head = gb10[0]
    order = [head] + [n for n in names if n != head]
    return Layout(kind, tuple(made[n] for n in order), why)


def _one_cycle(peers: Mapping[str, Sequence[str]]) -> bool:
    start = next(iter(peers))
    seen, prev, at = {start}, None, start
    while True:
        nxt = next(o for o in peers[at] if o != prev)
        if nxt == start:
            return len(seen) == len(peers)
        if nxt in seen:
            return False
        seen.add(nxt)
        prev, at = at, nxt


# ---------------------------------------------------------------------------------------------- writing
def render(layout: Layout, *, user: str | None, profile: str | None, hosts: Sequence[str], cluster: str = "spark",
           out: Path | None = None, now: datetime | None = None, key: str | None = None,
           known_hosts: str | None = None) -> str:
    """The commented inventory.yaml. Multi-link nodes (ring) get `links:`; one data link keeps the shorthand
    data_ip, netdev, hca. More boxes than the profile's tp x pp x dp: one service per group of that many (in
    the layout's order, the head's group first); a count the profile cannot split is an InitError naming both."""
    head = layout.nodes[0].box
    profile = profile or DEFAULT_PROFILE[head.gpu]
    world = load_profile(find_profile(profile, out or Path("inventory.yaml")))[0].world_size
    count = len(layout.nodes)
    if 1 < count < world:
        raise InitError(f"profile {profile} needs {world} node(s) (tp x pp x dp), the boxes are {count}: pass "
                        f"--profile with a profile for {count} node(s), or list {world} hosts")
    groups = [layout.nodes[i:i + world] for i in range(0, count - count % world, world)] if count > world \
        else [layout.nodes]
    spare = [n.box.name for n in layout.nodes[len(groups) * world:]] if count > world else []
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# Written by `sparkdeploy init {' '.join(hosts)}` on {stamp}, from what the boxes report.",
             f"# Layout: {layout.kind} ({layout.why}).",
             "# The network below is read, never rewritten: the files that configure it are named per node.",
             "# Check with `sparkdeploy plan` and `sparkdeploy doctor`; then `sparkdeploy up`.",
             f"cluster: {cluster}"]
    services = count > world
    if not services:
        lines.append(f"profile: {profile}   # deploy/profiles/<name>.yaml: the model you serve (plan shows if it fits)")
    lines += ["", "nodes:"]
    for i, nl in enumerate(layout.nodes):
        lines += _node_lines(nl, {"user": user, "key": key, "known_hosts": known_hosts},
                             role=None if services else ("head" if i == 0 else "worker"))
    lines.append("")
    if head.gpu == "gb10":
        lines += [*GB10_IMAGE, ""]
    per_service = ["patches: {shortlist: false, skinny_gemm: true, fp8_gdn: true, prefix_align: true}"]
    if head.gpu != "gb10":
        per_service.append("memory: {reserve_gib: 4}   # CPU-only nodes (the sim) share this machine's memory")
    lines.append("# The shortlisted draft head needs a draft vocab list (vocabs/): set `vocab:` and shortlist: true.")
    if not services:
        lines += per_service + [""]
        return "\n".join(lines)
    lines.append(f"services:   # {count} boxes, {world} per {profile} service (its first node is its head)")
    for g, members in enumerate(groups, 1):
        lines += [f"  - name: s{g}", f"    profile: {profile}", f"    nodes: [{', '.join(n.box.name for n in members)}]"]
        lines += [f"    {line}" for line in per_service]
    if spare:
        lines.append(f"# in no service yet: {', '.join(spare)} (add a service for it, or list it elsewhere)")
    lines.append("")
    return "\n".join(lines)


def _node_lines(nl: NodeLinks, login: Mapping[str, str | None], role: str | None) -> list[str]:
    """`login`: the ssh keys given on init's command line (user, key, known_hosts), written where set."""
    b = nl.box
    ssh = {"host": b.host} | {k: v for k, v in login.items() if v}
    out = [f"  - name: {b.name}"]
    if role:
        out.append(f"    role: {role}" + ("   # rank 0: serves the API" if role == "head" else ""))
    out.append("    ssh: {" + ", ".join(f"{k}: {v}" for k, v in ssh.items()) + "}")
    if nl.links:
        out.append("    links:   # one per peer (ring): each its own subnet")
        for peer, port, hca in nl.links:
            out.append(f"      - {{netdev: {port.netdev}, ip: {port.ip}, prefix: {port.prefix}, "
                       f"hca: [{', '.join(hca)}], peer: {peer}}}   # {_speed(port)}")
    else:
        out += [f"    data_ip: {nl.data.ip}   # {nl.data.describe()}",
                f"    netdev: {nl.data.netdev}",
                f"    hca: [{', '.join(nl.hca)}]" + ("   # every RoCE twin on the data subnets" if nl.hca else "")]
    gpu = f"{b.gpu_name}, driver {b.driver}" if b.gpu_name else "no NVIDIA GPU"
    out.append(f"    gpu: {b.gpu}   # {gpu}; MemTotal {b.mem_total / GIB:.1f} GiB; kernel {b.kernel}")
    out += [f"    # network: {f}" for f in b.network_files or ("no netplan or NetworkManager file names these ports",)]
    return out


def _speed(port: Port) -> str:
    return port.describe().split(" ", 1)[1]


# ---------------------------------------------------------------------------------------------- reading
def read_boxes(hosts: Sequence[str], *, user: str | None, trust_new_hosts: bool, key: str | None = None,
               known_hosts: str | None = None) -> list[Box]:
    """One SSH round trip per box, in parallel; a box that cannot be read fails the command naming it. `key`
    and `known_hosts` as in an inventory's ssh block (default: ~/.ssh/config's IdentityFile, the kit's file)."""
    from sparkdeploy.errors import RemoteError
    from sparkdeploy.model.inventory import SshTarget
    from sparkdeploy.model.sshconfig import identity_of, ssh_config
    from sparkdeploy.remote.ssh import Pool, target_of

    targets, addresses = [], {}
    for h in hosts:
        cfg = ssh_config(h)
        addresses[h] = cfg["hostname"]
        targets.append(target_of(h, SshTarget(host=cfg["hostname"], user=user or cfg.get("user") or "root",
                                              port=int(cfg.get("port", 22)), key=key or identity_of(cfg),
                                              known_hosts=known_hosts, proxy_jump=cfg.get("proxyjump"))))
    pool = Pool(targets, trust_new_hosts=trust_new_hosts)
    try:
        errors = pool.open()
        if errors:
            raise RemoteError("; ".join(f"{h}: {e}" for h, e in errors.items()) +
                              " (init reads each box over SSH: make key login work, or --trust-new-hosts once)")
        outs = pool.map(lambda c: c.run(probes.init_probe_argv(), check=False, timeout=120))
    finally:
        pool.close()
    bad = {h: o for h, o in outs.items() if isinstance(o, Exception)}
    if bad:
        raise RemoteError("; ".join(f"{h}: probe failed: {e}" for h, e in bad.items()))
    return [parse_box(h, outs[h].stdout, reached_at=addresses[h]) for h in hosts]
