"""Init probe outputs of DGX Sparks in the `@@@` grammar, built from the formats a GB10 prints (DGX OS 7: `ip -o
link`, `ip -o -4 addr`, /sys/class/infiniband GID tables, /sys/class/net/*/speed); shared by test_init and its sshd
test."""

from __future__ import annotations

import ipaddress

# The CX-7's four netdevs and their RoCE devices: two ports, each seen twice (a twin per PCIe root).
TWINS = {"enp1s0f0np0": "rocep1s0f0", "enP2p1s0f0np0": "roceP2p1s0f0",
         "enp1s0f1np1": "rocep1s0f1", "enP2p1s0f1np1": "roceP2p1s0f1"}
MGMT = ("enP7s7", "10.0.0.{n}/24")


def gid_of(ip: str) -> str:
    """The IPv4-mapped GID text of `ip` (as in /sys/class/infiniband/*/ports/1/gids/N)."""
    h = ipaddress.IPv4Address(ip).packed.hex()
    return f"0000:0000:0000:0000:0000:ffff:{h[:4]}:{h[4:]}"


def ip_sections(entries: list[dict]) -> dict[str, str]:
    """The `links` and `addrs` sections (`ip -o link show`, `ip -o -4 addr show`) of interfaces given as
    {ifname, mtu, operstate, addr_info: [{family, local, prefixlen}]}."""
    links, addrs = [], []
    for i, e in enumerate(entries, 1):
        flags = "LOOPBACK,UP,LOWER_UP" if e["ifname"] == "lo" else \
            "BROADCAST,MULTICAST,UP,LOWER_UP" if e["operstate"] == "UP" else "NO-CARRIER,BROADCAST,MULTICAST,UP"
        links.append(f"{i}: {e['ifname']}: <{flags}> mtu {e['mtu']} qdisc mq state {e['operstate']} mode DEFAULT "
                     "group default qlen 1000\\    link/ether 4c:bb:47:00:00:01")
        addrs += [f"{i}: {e['ifname']}    inet {a['local']}/{a['prefixlen']} scope global {e['ifname']}\\       "
                  "valid_lft forever" for a in e["addr_info"] if a["family"] == "inet"]
    return {"links": "\n".join(links), "addrs": "\n".join(addrs)}


def sections(hostname: str, n: int, ports: dict[str, str], *, gpu: str = "NVIDIA GB10, 580.95.05",
             mem_kb: int = 125_000_000, down: tuple[str, ...] = (), network: str = "", gid_index: int = 3,
             speed: int = 200000) -> dict[str, str]:
    """`ports`: {CX-7 netdev: "ip/prefix"} for the ports that are addressed; every twin is listed as a netdev."""
    ip_json, rdma, speeds = [], [], []
    mgmt, addr = MGMT
    ip_json.append({"ifname": "lo", "mtu": 65536, "operstate": "UNKNOWN",
                    "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8}]})
    ip_json.append({"ifname": mgmt, "mtu": 1500, "operstate": "UP", "addr_info": [
        {"family": "inet", "local": addr.format(n=n).split("/")[0], "prefixlen": 24}]})
    speeds.append(f"{mgmt} 1000")
    for netdev, hca in TWINS.items():
        up = netdev in ports and netdev not in down
        info = [{"family": "inet", "local": "169.254.3.%d" % n, "prefixlen": 16}]  # DGX OS's link-local default
        if netdev in ports:
            ip, prefix = ports[netdev].split("/")
            info.append({"family": "inet", "local": ip, "prefixlen": int(prefix)})
        ip_json.append({"ifname": netdev, "mtu": 9000, "operstate": "UP" if up else "DOWN", "addr_info": info})
        speeds.append(f"{netdev} {speed if up else -1}")
        rdma.append(f"port {hca} 1 {netdev} {'4: ACTIVE' if up else '1: DOWN'}")
        rdma.append(f"gid {hca} 1 0 fe80:0000:0000:0000:4ebb:47ff:fe00:000{n} {netdev} IB/RoCE v1")
        rdma.append(f"gid {hca} 1 1 fe80:0000:0000:0000:4ebb:47ff:fe00:000{n} {netdev} RoCE v2")
        if netdev in ports:
            g = gid_of(ports[netdev].split("/")[0])
            rdma.append(f"gid {hca} 1 {gid_index - 1} {g} {netdev} IB/RoCE v1")
            rdma.append(f"gid {hca} 1 {gid_index} {g} {netdev} RoCE v2")
    return {"hostname": hostname, "uname": "6.17.0-1032-nvidia",
            "meminfo": f"MemTotal:       {mem_kb} kB\nMemAvailable:   {mem_kb - 5_000_000} kB",
            "gpu": gpu, **ip_sections(ip_json), "rdma": "\n".join(rdma), "speed": "\n".join(speeds),
            "network": network}


def output(secs: dict[str, str]) -> str:
    return "".join(f"@@@ {k}\n{v}\n@@@ rc=0\n" for k, v in secs.items())


def write_root(root, n: int, ports: dict[str, str], netplan: str = "") -> None:
    """A Spark's files as init's probe reads them, under `root` (the probe's $SPARKDEPLOY_PROBE_ROOT), with
    `root/bin` holding stand-ins for the commands the probe runs that read no file: `ip -o link show` and
    `ip -o -4 addr show` (the recorded lines of `sections`) and GB10's `nvidia-smi`."""
    import os

    secs = sections(f"spark{n}", n, ports)
    (root / "proc").mkdir(parents=True)
    (root / "proc" / "meminfo").write_text(secs["meminfo"] + "\n")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    (root / "ip-link").write_text(secs["links"] + "\n")
    (root / "ip-addr").write_text(secs["addrs"] + "\n")
    for name, body in (("ip", f'case "$*" in "-o link show") cat {root}/ip-link;; "-o -4 addr show") '
                              f'cat {root}/ip-addr;; *) exit 9;; esac'),
                       ("nvidia-smi", f"echo '{secs['gpu']}'")):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        os.chmod(bin_dir / name, 0o755)
    for line in secs["speed"].splitlines():
        netdev, mbit = line.split()
        (root / "sys/class/net" / netdev).mkdir(parents=True)
        if int(mbit) > 0:
            (root / "sys/class/net" / netdev / "speed").write_text(mbit + "\n")
    for line in secs["rdma"].splitlines():
        parts = line.split()
        dev_dir = root / "sys/class/infiniband" / parts[1]
        port = dev_dir / "ports" / parts[2]
        if parts[0] == "port":
            (dev_dir / "device" / "net" / parts[3]).mkdir(parents=True)
            for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
                (port / sub).mkdir(parents=True)
            (port / "state").write_text(" ".join(parts[4:]) + "\n")
        else:
            (port / "gids" / parts[3]).write_text(parts[4] + "\n")
            (port / "gid_attrs/ndevs" / parts[3]).write_text(parts[5] + "\n")
            (port / "gid_attrs/types" / parts[3]).write_text(" ".join(parts[6:]) + "\n")
    if netplan:
        (root / "etc/netplan").mkdir(parents=True)
        (root / "etc/netplan/60-nvsync-cx7.yaml").write_text(netplan)
