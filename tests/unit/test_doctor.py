"""doctor: parsers and checks on captured probe output; a planted problem turns exactly one check red."""

from __future__ import annotations

import json
import subprocess

import pytest

from sparkdeploy.checks import doctor as d
from sparkdeploy.checks import preflight as pf
from sparkdeploy.checks.preflight import NodeSpec
from sparkdeploy.model.topology import Link, LinkPair
from sparkdeploy.node import memguard, probes
from sparkdeploy.node.probes import HostFacts
from sparkdeploy.ops import hostsetup
from sparkdeploy.verdict import Result, Status

GIB = 1 << 30

# A healthy DGX Spark as the probe prints it (values as seen on DGX OS 7 / GB10).
HEALTHY = {
    "uname": "6.11.0-1016-nvidia",
    "virt": "none",
    "modules": "modules_dep=yes\nmodinfo_nvidia=580.95.05\nloaded_nvidia=580.95.05\n"
               "cmdline=BOOT_IMAGE=/boot/vmlinuz-6.11.0-1016-nvidia root=UUID=x ro quiet splash",
    "gpu": "NVIDIA GB10, 580.95.05",
    "gpu_procs": "",
    "links": (
        "1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN mode DEFAULT group default qlen 1000\\    link/loopback 00:00:00:00:00:00\n"
        "2: enP7s7: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc mq state UP mode DEFAULT group default qlen 1000\\    link/ether 4c:bb:47:00:00:01\n"
        "3: enp1s0f1np1: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 9000 qdisc mq state UP mode DEFAULT group default qlen 1000\\    link/ether 4c:bb:47:00:00:02\n"
        "4: enP2p1s0f1np1: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 9000 qdisc mq state UP mode DEFAULT group default qlen 1000\\    link/ether 4c:bb:47:00:00:03\n"
    ),
    "addrs": (
        "2: enP7s7    inet 10.0.0.11/24 brd 10.0.0.255 scope global enP7s7\\       valid_lft forever\n"
        "3: enp1s0f1np1    inet 192.168.177.11/24 brd 192.168.177.255 scope global enp1s0f1np1\\       valid_lft forever\n"
        "4: enP2p1s0f1np1    inet 192.168.178.11/24 brd 192.168.178.255 scope global enP2p1s0f1np1\\       valid_lft forever\n"
    ),
    "rdma": (
        "port rocep1s0f1 1 enp1s0f1np1 4: ACTIVE\n"
        "gid rocep1s0f1 1 0 fe80:0000:0000:0000:4ebb:47ff:fe00:0002 enp1s0f1np1 IB/RoCE v1\n"
        "gid rocep1s0f1 1 1 fe80:0000:0000:0000:4ebb:47ff:fe00:0002 enp1s0f1np1 RoCE v2\n"
        "gid rocep1s0f1 1 2 0000:0000:0000:0000:0000:ffff:c0a8:b10b enp1s0f1np1 IB/RoCE v1\n"
        "gid rocep1s0f1 1 3 0000:0000:0000:0000:0000:ffff:c0a8:b10b enp1s0f1np1 RoCE v2\n"
        "port roceP2p1s0f1 1 enP2p1s0f1np1 4: ACTIVE\n"
        "gid roceP2p1s0f1 1 0 fe80:0000:0000:0000:4ebb:47ff:fe00:0003 enP2p1s0f1np1 IB/RoCE v1\n"
        "gid roceP2p1s0f1 1 1 fe80:0000:0000:0000:4ebb:47ff:fe00:0003 enP2p1s0f1np1 RoCE v2\n"
        "gid roceP2p1s0f1 1 2 0000:0000:0000:0000:0000:ffff:c0a8:b20b enP2p1s0f1np1 IB/RoCE v1\n"
        "gid roceP2p1s0f1 1 3 0000:0000:0000:0000:0000:ffff:c0a8:b20b enP2p1s0f1np1 RoCE v2\n"
    ),
    "earlyoom": f"bin=/usr/bin/earlyoom\nactive=active\nenabled=enabled\n"
                f"cmdline=/usr/bin/earlyoom -m 4,2 -s 100,100 --prefer {hostsetup.EARLYOOM_PREFER} --avoid {hostsetup.EARLYOOM_AVOID} ",
    "sshd": "unit=ssh\nunit_adj=-1000\npid=1234\nlive_adj=-1000",
    "disk": (
        "ckpt_path=/srv/models/qwen\n"
        "ckpt_df=/dev/nvme0n1p2 3936818905088 1000000000000 2936818905088 26% /\n"
        "ckpt_present=0\n"
        "docker_root=/var/lib/docker\n"
        "docker_df=/dev/nvme0n1p2 3936818905088 1000000000000 2936818905088 26% /\n"
    ),
    "docker": "server=28.3.3\nruntimes=io.containerd.runc.v2 nvidia runc \ndefault_runtime=runc",
    "enabled_units": "ExecStart={ path=/usr/bin/dockerd ; argv[]=/usr/bin/dockerd -H fd:// ; ignore_errors=no }\nId=docker.service\n\n"
             "ExecStartPre={ path=/usr/sbin/sshd ; argv[]=/usr/sbin/sshd -t ; ignore_errors=no }\n"
             "ExecStart={ path=/usr/sbin/sshd ; argv[]=/usr/sbin/sshd -D $SSHD_OPTS ; ignore_errors=no }\nId=ssh.service\n\n"
             "ExecStartPre=\nExecStart={ path=/usr/bin/docker ; argv[]=/usr/bin/docker run --name sparkdeploy-vllm img "
             "vllm serve ; ignore_errors=no }\nId=sparkdeploy-engine.service\n",
    "meminfo": "MemTotal:       127535896 kB\nMemFree:        100000000 kB\nMemAvailable:   120000000 kB\n",
    "timesync": "ntp=yes\ndaemon=systemd-timesyncd",
    "reach": "192.168.177.12 ok",
    "gpu_clocks": "2405, 3003, 3, 41, Not Active, Not Active",  # idle, cool
    "speed": "enP7s7 1000\nenp1s0f1np1 200000\nenP2p1s0f1np1 200000\nlo -1",
    "tools": "ib_write_bw=",
    "deployed": "",  # nothing deployed yet
}

SPEC = NodeSpec("spark1", "192.168.177.11", "enp1s0f1np1", ("rocep1s0f1", "roceP2p1s0f1"), True,
                "/srv/models/qwen", "head")


def render(sections: dict[str, str], rcs: dict[str, int] | None = None) -> str:
    rcs = rcs or {}
    return "".join(f"@@@ {k}\n{v.rstrip(chr(10))}\n@@@ rc={rcs.get(k, 0)}\n" for k, v in sections.items())


def facts(node="spark1", **changes) -> HostFacts:
    rcs = changes.pop("_rcs", {})
    overrides = changes.pop("_overrides", {})
    return HostFacts.from_output(node, render({**HEALTHY, **changes}, rcs), overrides)


def results(f: HostFacts, spec: NodeSpec = SPEC, **kw) -> dict[str, Result]:
    kw.setdefault("checkpoint_bytes", 60 * GIB)
    kw.setdefault("ports", (8000, 29501))
    return {r.check: r for r in pf.run_checks([spec], {spec.name: f}, **kw)}


def test_healthy_gb10_is_all_green():
    res = results(facts())
    bad = {k: (r.status, r.reason) for k, r in res.items() if r.status not in (Status.OK, Status.SKIPPED)}
    assert not bad
    # one node: reach and clock are not judged, and say so
    assert res["data-plane-reach"].status is Status.SKIPPED


PLANTED = [
    ("gpu", {"gpu": "NVIDIA H100 80GB HBM3, 580.95.05"}, "GB10"),
    ("kernel-modules", {"modules": "modules_dep=no\nmodinfo_nvidia=\nloaded_nvidia=\ncmdline=ro"}, "linux-modules"),
    ("kernel-modules", {"modules": "modules_dep=yes\nmodinfo_nvidia=580.95.05\nloaded_nvidia=575.1\ncmdline=ro"}, "reboot"),
    ("roce-twins", {"rdma": HEALTHY["rdma"].replace("port roceP2p1s0f1 1 enP2p1s0f1np1 4: ACTIVE",
                                                     "port roceP2p1s0f1 1 enP2p1s0f1np1 1: DOWN")}, "cold-boot"),
    ("mtu", {"links": HEALTHY["links"].replace("enp1s0f1np1: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 9000",
                                               "enp1s0f1np1: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500")}, "mtu: 9000"),
    ("roce-gid", {"rdma": "\n".join(l for l in HEALTHY["rdma"].splitlines() if "ffff:c0a8:b20b" not in l)}, "IPv4"),
    ("earlyoom", {"earlyoom": "bin=/usr/bin/earlyoom\nactive=inactive\nenabled=enabled"}, "enable --now earlyoom"),
    ("earlyoom", {"earlyoom": "bin=\nactive=inactive\nenabled="}, "host setup"),
    ("earlyoom", {"earlyoom": "bin=/usr/bin/earlyoom\nactive=active\nenabled=enabled\ncmdline=/usr/bin/earlyoom -m 10"},
     "host setup"),
    ("sshd-oom", {"sshd": "unit=ssh\nunit_adj=0\npid=1234\nlive_adj=0"}, "OOMScoreAdjust=-1000"),
    ("disk", {"disk": HEALTHY["disk"].replace("2936818905088 26% /\nckpt_present", "1048576 100% /srv/models\nckpt_present")},
     "free space"),
    ("docker", {"docker": "server=28.3.3\nruntimes=io.containerd.runc.v2 runc \ndefault_runtime=runc"}, "nvidia-ctk"),
    ("gpu-processes", {"gpu_procs": "4242, /usr/bin/python3, 30000 MiB"}, "stop them"),
    ("stale-units", {"enabled_units": HEALTHY["enabled_units"] + "\nExecStart={ path=/usr/local/bin/start-vllm.sh ; argv[]=/usr/local/bin/start-vllm.sh }\nId=old-vllm.service\n"},
     "systemctl disable --now old-vllm.service"),
    ("stale-units", {"enabled_units": HEALTHY["enabled_units"] + "\nExecStart={ path=/usr/bin/docker ; argv[]=/usr/bin/docker run -p 8000:8000 x }\nExecStartPre=\nId=api.service\n"},
     "api.service"),
    ("memory", {"meminfo": "MemTotal: 127535896 kB\nMemAvailable: 20000000 kB\n"}, "gpu_memory_utilization"),
    ("timesync", {"timesync": "ntp=no"}, "set-ntp"),
]


@pytest.mark.parametrize("check,change,fix_word", PLANTED, ids=[f"{c}-{i}" for i, (c, _, _) in enumerate(PLANTED)])
def test_planted_problem_turns_exactly_that_check_red(check, change, fix_word):
    res = results(facts(**change), need_bytes=70 * GIB, reserve_bytes=28 * GIB)
    red = {k for k, r in res.items() if r.status in (Status.FAILED, Status.WARN)}
    assert red == {check}, {k: res[k].reason for k in red}
    assert fix_word in res[check].fix


def test_ssh_failure_marks_every_check_unjudged_not_ok():
    f = HostFacts("spark1", error="ssh nvidia@10.0.0.11:22: Authentication failed")
    res = pf.run_checks([SPEC], {"spark1": f})
    mine = [r for r in res if r.node == "spark1"]
    assert mine[0].check == "ssh" and mine[0].status is Status.FAILED and "ssh-copy-id" in mine[0].fix
    assert all(r.status is Status.FAILED for r in mine)


SIM_SPEC = NodeSpec("node1", "172.30.99.11", "eth0", (), False, "/srv/models/tiny", "head")


def test_sim_node_gpu_checks_not_present_and_container_honest():
    f = facts("node1", virt="docker", gpu="nvidia-smi: not found", gpu_procs="", rdma="",
              modules="modules_dep=no\nmodinfo_nvidia=\nloaded_nvidia=\ncmdline=console=ttyS0",
              links="9: eth0@if10: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 9000 qdisc noqueue state UP mode DEFAULT\\ x",
              addrs="9: eth0    inet 172.30.99.11/24 brd 172.30.99.255 scope global eth0",
              docker="server=20.10.24+dfsg1\nruntimes=runc io.containerd.runc.v2\ndefault_runtime=runc",
              _rcs={"gpu": 127, "gpu_procs": 127})
    res = results(f, SIM_SPEC, checkpoint_bytes=100 << 20)
    for name in ("gpu", "gpu-processes", "roce-twins", "roce-gid", "kernel-modules", "timesync", "driver-match"):
        assert res[name].status is Status.SKIPPED, (name, res[name].reason)
    assert "host's" in res["kernel-modules"].reason and "docker" in res["kernel-modules"].reason
    assert res["mtu"].status is Status.OK and res["docker"].status is Status.OK


def test_sshd_in_a_container_without_cap_sys_resource():
    no_cap = "unit=ssh\nunit_adj=-1000\npid=5\nlive_adj=0\ncapbnd=000001fffeffffff"
    r = pf.check_sshd_oom(SPEC, facts(sshd=no_cap))
    assert r.status is Status.SKIPPED and "CAP_SYS_RESOURCE" in r.reason
    # without the drop-in it is still a failure there: host setup has not run
    r = pf.check_sshd_oom(SPEC, facts(sshd=no_cap.replace("unit_adj=-1000", "unit_adj=0")))
    assert r.status is Status.FAILED and "host setup" in r.fix


def test_driver_mismatch_from_facts_file_on_sim_nodes():
    specs = [SIM_SPEC, NodeSpec("node2", "172.30.99.12", "eth0", (), False)]
    f1 = facts("node1", virt="docker", _overrides={"driver": "580.95.05"})
    f2 = facts("node2", virt="docker", _overrides={"driver": "590.44.01"})
    res = {r.check: r for r in pf.run_checks(specs, {"node1": f1, "node2": f2}) if r.node == "cluster"}
    assert res["driver-match"].status is Status.FAILED
    assert "node1 580.95.05" in res["driver-match"].reason and "node2 590.44.01" in res["driver-match"].reason
    assert "same driver" in res["driver-match"].fix
    # gpu stays not-present: the inventory says there is none, a facts file does not invent one
    assert [r for r in pf.run_checks(specs, {"node1": f1, "node2": f2}) if r.check == "gpu"][0].status is Status.SKIPPED


def test_reach_and_clock():
    specs = [SPEC, NodeSpec("spark2", "192.168.177.12", "enp1s0f1np1")]
    f1, f2 = facts(), facts("spark2", reach="192.168.177.11 err [Errno 113] No route to host")
    r = pf.check_reach(specs, {"spark1": f1, "spark2": f2})
    assert r.status is Status.FAILED and "spark2 -> 192.168.177.11" in r.reason
    assert pf.check_clock_skew({"a": (0.010, 0.002), "b": (0.012, 0.002)}).status is Status.OK
    assert pf.check_clock_skew({"a": (0.0, 0.001), "b": (2.0, 0.001)}).status is Status.WARN
    bad = pf.check_clock_skew({"a": (0.0, 0.001), "b": (30.0, 0.001)})
    assert bad.status is Status.FAILED and "NTP" in bad.fix
    assert "by construction" in pf.check_clock_skew({"a": (0, 0), "b": (0, 0)}, shared_kernel=True).reason



def test_bandwidth_is_measured_per_link_on_its_addresses():
    """The real scripts, run through local connections: parallel TCP streams per link (no ib_write_bw here), from
    the sender's address on the link to a receiver bound on the other's (127.0.0.x are all this machine's)."""
    from sparkdeploy.model.topology import Link, LinkPair
    from sparkdeploy.remote.connection import Target
    from sparkdeploy.remote.ssh import Pool

    pairs = [LinkPair(f"n{a}", Link("lo", f"127.0.0.{a}"), f"n{b}", Link("lo", f"127.0.0.{b}"))
             for a, b in ((1, 2), (1, 3), (2, 3))]
    pool = Pool([Target(f"n{i}", "localhost", local=True) for i in (1, 2, 3)])
    pool.open()
    got = d.measure_bandwidth(pool, pairs, ["n1", "n2", "n3"])
    assert set(got) == set(pairs), got
    assert all(isinstance(v, pf.Measured) and v.method == "tcp" and v.gbit > 0 for v in got.values()), got
    # a node that does not answer is left out of every link, not measured as zero
    assert set(d.measure_bandwidth(pool, pairs, ["n1", "n3"])) == {pairs[1]}


def _pair(specs) -> LinkPair:
    a, b = specs
    return LinkPair(a.name, Link(a.netdev, a.data_ip), b.name, Link(b.netdev, b.data_ip))


def test_bandwidth_verdicts():
    gpu = [SPEC, NodeSpec("spark2", "192.168.177.12", "enp1s0f1np1")]
    sim = [NodeSpec(n, ip, "eth0", (), False) for n, ip in (("node1", "172.30.0.11"), ("node2", "172.30.0.12"))]
    sparks, nodes = _pair(gpu), _pair(sim)
    ok = pf.check_bandwidth(gpu, {sparks: 38.5})
    assert ok.status is Status.OK and "spark1 enp1s0f1np1 -> spark2 enp1s0f1np1 38.5 Gbit/s" in ok.reason
    slow = pf.check_bandwidth(gpu, {sparks: 9.4})  # a 10GbE port, not the CX-7
    assert slow.status is Status.WARN and "below 10" in slow.reason and "ip route get" in slow.fix
    assert pf.check_bandwidth(sim, {nodes: 3.0}).status is Status.OK  # a bridge, judged only if broken
    assert pf.check_bandwidth(sim, {nodes: 0.05}).status is Status.WARN
    broken = pf.check_bandwidth(sim, {nodes: "172.30.0.12:29481: ConnectionRefusedError"})
    assert broken.status is Status.FAILED and "node1 eth0 -> node2 eth0: 172.30.0.12:29481" in broken.reason
    assert pf.check_bandwidth(sim[:1], {}).status is Status.SKIPPED
    # against the negotiated speed of the ports: a CX-7 that reports 200G and moves 13 Gbit/s is a failure naming them
    cx7 = {("spark1", "enp1s0f1np1"): 200000, ("spark2", "enp1s0f1np1"): 200000}
    degraded = pf.check_bandwidth(gpu, {sparks: pf.Measured(13.1, "tcp")}, cx7)
    assert degraded.status is Status.FAILED and "spark1 enp1s0f1np1 -> spark2 enp1s0f1np1: 13.10" in degraded.reason
    assert "negotiated at 200 Gbit/s" in degraded.reason and "cold-boot" in degraded.fix
    assert pf.check_bandwidth(gpu, {sparks: pf.Measured(38.5, "tcp")}, cx7).status is Status.OK
    # RDMA writes reach most of the link: the same figure from ib_write_bw is far below what the port should move
    assert pf.check_bandwidth(gpu, {sparks: pf.Measured(38.5, "ib_write_bw")}, cx7).status is Status.FAILED
    # the sim's tc-shaped port (100 Mbit/s on a 10G veth) fails the same way
    assert pf.check_bandwidth(sim, {nodes: 0.09}, {("node1", "eth0"): 10000}).status is Status.FAILED
    # the speed is the port's on that link: another port of the node at 200G does not make a 10G link slow
    assert pf.check_bandwidth(sim, {nodes: 3.0}, {("node1", "eth1"): 200000}).status is Status.OK
    assert pf.check_bandwidth(sim, {}).status is Status.FAILED
    assert probes.parse_bandwidth("received 1250000000 1.0 172.30.0.11\n") == pytest.approx(10.0)
    with pytest.raises(ValueError):
        probes.parse_bandwidth("Traceback ...\nOSError: [Errno 99] Cannot assign requested address")


def test_units_ignore_pids_that_look_like_ports():
    text = ("Id=web.service\nExecStart={ path=/usr/bin/nginx ; argv[]=/usr/bin/nginx -g daemon off; ; "
            "ignore_errors=no ; start_time=[n/a] ; pid=8000 ; code=(null) ; status=0/0 }\n")
    assert probes.parse_units(text) == {"web.service": ["ExecStart=/usr/bin/nginx -g daemon off"]}
    assert pf.check_stale_units(SPEC, facts(enabled_units=text), ports=(8000,)).status is Status.OK


def test_parsers():
    assert str(probes.parse_gid("0000:0000:0000:0000:0000:ffff:c0a8:b10b").ipv4_mapped) == "192.168.177.11"
    assert probes.parse_gid("fe80:0000:0000:0000:4ebb:47ff:fe00:0002").ipv4_mapped is None
    ports = probes.parse_rdma(HEALTHY["rdma"])
    assert probes.port_gid_index(ports["rocep1s0f1"]) == 3
    assert probes.port_gid_index(ports["rocep1s0f1"], "192.168.177.99") is None
    links = probes.parse_ip_link(HEALTHY["links"] + "7: eth0@if8: <BROADCAST,UP,LOWER_UP> mtu 1500 qdisc x state UP mode D\n")
    assert links["eth0"].mtu == 1500 and links["lo"].up and links["enP7s7"].mtu == 1500
    assert probes.parse_meminfo("MemAvailable:   1024 kB\nHugepagesize:  2048 kB\n")["MemAvailable"] == 1 << 20
    assert probes.parse_nvidia_smi("NVIDIA GB10, 580.95.05\n") == [probes.Gpu("NVIDIA GB10", "580.95.05")]
    assert probes.parse_df_line("tmpfs 1048576 1048576 0 100% /srv/m").avail == 0
    out = "@@@ a\nx=1\n@@@ rc=0\n@@@ b\n@@@ rc=127\n"
    assert probes.split_sections(out) == {"a": probes.Section(0, "x=1"), "b": probes.Section(127, "")}


def test_memory_margin_levels():
    assert memguard.memory_margin("m", "n", 100 * GIB, 60 * GIB, 28 * GIB).status is Status.OK
    assert memguard.memory_margin("m", "n", 90 * GIB, 60 * GIB, 28 * GIB).status is Status.WARN
    r = memguard.memory_margin("m", "n", 80 * GIB, 60 * GIB, 28 * GIB)
    assert r.status is Status.FAILED and "margin -8.0 GiB" in r.reason


def test_probe_script_runs_locally_and_parses():
    """The real script on this machine (read-only): every section comes back with an rc."""
    out = subprocess.run(probes.probe_argv("/nonexistent/ckpt", ["127.0.0.1"]), capture_output=True, text=True,
                         timeout=60).stdout
    secs = probes.split_sections(out)
    assert set(secs) == set(probes.SECTIONS)
    assert probes.parse_meminfo(secs["meminfo"].text)["MemTotal"] > 0
    assert "ckpt_path=/" in secs["disk"].text  # nearest existing parent
    assert "127.0.0.1" in secs["reach"].text
    json.dumps([r.to_dict() for r in pf.run_checks([SIM_SPEC], {"node1": HostFacts.from_output("node1", out)})])


def test_examine_end_to_end_on_local_connections():
    """examine() with both inventory nodes reached through local connections (the real probe runs here)."""
    from pathlib import Path

    from sparkdeploy.model import inventory
    from sparkdeploy.remote.connection import Target
    from sparkdeploy.remote.ssh import Pool

    inv = inventory.load(Path(__file__).parent / "fixtures" / "inventory.sim.yaml")
    pool = Pool([Target(n.name, "localhost", local=True) for n in inv.nodes])
    exam = d.examine(inv, checkpoint_dir="/nonexistent/ckpt", pool=pool)
    by = {(r.node, r.check): r for r in exam.results}
    names = [c.__name__[6:].replace("_", "-") for c in pf.NODE_CHECKS]
    assert all((n.name, c) in by for n in inv.nodes for c in names)
    assert {("cluster", "driver-match"), ("cluster", "data-plane-reach"), ("cluster", "clock-skew"),
            ("cluster", "data-plane-bandwidth")} <= set(by)
    mem = by[("node1", "memory")]
    assert "reserve 4.0" in mem.reason or "reserve_gib" in mem.reason  # the plan's budget, not a local guess
    # the plan runs on this machine's netdevs, which lack the sim's addresses: `up` would refuse, and says why
    assert by[("node1", "plan")].status is Status.FAILED and "nodes[0]." in by[("node1", "plan")].reason
    assert json.loads(json.dumps(exam.to_dict()))["status"] in ("ok", "warn", "failed")


def test_roce_gid_is_the_planners_choice_where_the_old_rules_disagreed():
    """Doctor used to pass the lowest RoCE v2 IPv4-mapped GID of *any* address; the planner (gather) takes the
    GID of the twin's own address. A stale GID (an old address still in the table at a lower index) passed
    doctor at index 3 while the plan would set 5: now doctor reports what the plan will use."""
    stale = HEALTHY["rdma"].replace(
        "gid roceP2p1s0f1 1 3 0000:0000:0000:0000:0000:ffff:c0a8:b20b enP2p1s0f1np1 RoCE v2\n",
        "gid roceP2p1s0f1 1 3 0000:0000:0000:0000:0000:ffff:0a0a:0a0a enP2p1s0f1np1 RoCE v2\n"
        "gid roceP2p1s0f1 1 5 0000:0000:0000:0000:0000:ffff:c0a8:b20b enP2p1s0f1np1 RoCE v2\n")
    r = pf.check_roce_gid(SPEC, facts(rdma=stale))
    assert r.status is Status.WARN and "roceP2p1s0f1=5" in r.reason and "unset" in r.reason
    # a twin whose only IPv4 GID is not its own address: the planner finds none, so doctor fails it
    r = pf.check_roce_gid(SPEC, facts(rdma=stale.replace(
        "gid roceP2p1s0f1 1 5 0000:0000:0000:0000:0000:ffff:c0a8:b20b enP2p1s0f1np1 RoCE v2\n", "")))
    assert r.status is Status.FAILED and "roceP2p1s0f1" in r.reason


def test_the_image_script_finds_pips_nccl_through_its_links_and_rays_version(tmp_path):
    """The script the doctor runs inside the serving image, run for real in a venv whose site-packages holds a
    pip-style nvidia/nccl/lib/libnccl.so.2 (a link to the versioned file, as the wheels ship it) and, later,
    Ray's distribution metadata."""
    import sys

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    lib = site / "nvidia" / "nccl" / "lib"
    lib.mkdir(parents=True)
    (lib / "libnccl.so.2.26.2").write_bytes(b"\x7fELF")
    (lib / "libnccl.so.2").symlink_to("libnccl.so.2.26.2")
    def run() -> dict:
        """The probe's image section, with the venv's python3 in place of `docker run` of the image."""
        image = probes.IMAGE_LIBS_SECTIONS["image"]
        sections = {"image": f"{venv}/bin/python3 -c " + image.split(" -c ", 1)[1].split("; else", 1)[0]}
        out = subprocess.run(probes.named_probe_argv("image-libs", sections, {"tag": "img:tag"}), capture_output=True,
                             text=True, check=True)
        return probes.parse_image_libs(out.stdout)

    got = run()
    assert got["image_pip"] == str((lib / "libnccl.so.2.26.2").resolve()) and got["image"] == "present", got
    assert probes.nccl_version(got["image_pip"]) == "2.26.2" and got["image_ray"] == "", got
    dist = site / "ray-2.60.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ray\nVersion: 2.60.0\n")
    assert run()["image_ray"] == "2.60.0"


SYSTEM = "/usr/lib/aarch64-linux-gnu/libnccl.so.2.27.7"
PIP = "/usr/local/lib/python3.12/dist-packages/nvidia/nccl/lib/libnccl.so.2.26.2"


@pytest.mark.parametrize("probed,status,words", [
    ({"host": "", "image_pip": "", "image_system": "", "image": "present"}, Status.OK, "no NCCL in the serving image"),
    ({"host": SYSTEM, "image_pip": PIP, "image_system": SYSTEM, "image": "present"}, Status.WARN,
     "loads pip's NCCL 2.26.2"),
    ({"host": SYSTEM, "image_pip": SYSTEM, "image_system": SYSTEM, "image": "present"}, Status.OK,
     "loads the system NCCL 2.27.7; host has 2.27.7"),  # pip's file is a link to the system one (the fix)
    ({"host": "", "image_pip": PIP, "image_system": "", "image": "present"}, Status.OK, "pip's NCCL 2.26.2"),
    ({"host": SYSTEM, "image_pip": "", "image_system": "", "image": "absent"}, Status.SKIPPED, "not on the node yet"),
    ("docker: permission denied", Status.WARN, "not read: docker"),
], ids=["cpu-image", "pip-beside-system", "pip-linked-to-system", "pip-only", "no-image", "unreadable"])
def test_nccl_verdicts(probed, status, words):
    r = pf.check_nccl("spark1", probed, "sparkdeploy/serving:x")
    assert (r.check, r.node, r.status) == ("nccl-library", "spark1", status) and words in r.reason, r
    if status is Status.WARN and "pip" in words:
        assert "vllm#42354" in r.fix


@pytest.mark.parametrize("probed,status,words", [
    ({"host": "", "image_pip": "", "image_system": "", "image_ray": "2.60.0", "image": "present"}, Status.OK,
     "Ray 2.60.0 in the serving image"),
    ({"host": "", "image_pip": "", "image_system": "", "image_ray": "", "image": "present"}, Status.FAILED,
     "no Ray in the serving image"),
    ({"host": "", "image_pip": "", "image_system": "", "image_ray": "", "image": "absent"}, Status.SKIPPED,
     "not on the node yet"),
    ("docker: permission denied", Status.WARN, "not read: docker"),
], ids=["ray", "no-ray", "no-image", "unreadable"])
def test_ray_verdicts(probed, status, words):
    r = pf.check_ray("spark3", probed, "sparkdeploy/serving:x")
    assert (r.check, r.node, r.status) == ("ray", "spark3", status) and words in r.reason, r


IB_WRITE_BW = """\
---------------------------------------------------------------------------------------
                    RDMA_Write BW Test
 Dual-port       : OFF\t\tDevice         : rocep1s0f1
 Number of qps   : 1\t\tTransport type : IB
 GID index       : 3
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
 65536      1045123          0.00               182.64     \t\t   0.348366
---------------------------------------------------------------------------------------
"""


def test_ib_write_bw_is_used_where_both_ends_have_it():
    assert probes.parse_ib_write_bw(IB_WRITE_BW) == pytest.approx(182.64)
    with pytest.raises(ValueError):
        probes.parse_ib_write_bw("Couldn't connect to 192.168.177.12:18515")
    node = Link("enp1s0f1np1", "192.168.177.11", hca=("rocep1s0f1", "roceP2p1s0f1"))
    assert d.rdma_path(node, facts()) is None  # perftest not installed: parallel TCP streams instead
    assert d.rdma_path(node, facts(tools="ib_write_bw=/usr/bin/ib_write_bw")) == ("rocep1s0f1", 3)
    assert probes.ib_write_bw_argv("rocep1s0f1", 3, "192.168.177.12")[-3:] == ["-x", "3", "192.168.177.12"]


BAD = {"7.0.0-1019-nvidia": pf.BadKernel("7.0.0-1019-nvidia", "NCCL RoCE ibv_reg_mr_iova2 ENOMEM", "eugr#392",
                                         "boot 6.17.0-1032-nvidia and hold it", "kho=off")}


def test_a_kernel_on_the_bad_list_fails_with_its_fix_and_source():
    bad = pf.check_kernel(SPEC, facts(uname="7.0.0-1019-nvidia"), bad=BAD)
    assert bad.status is Status.FAILED and "ENOMEM" in bad.reason and "eugr#392" in bad.reason
    assert "6.17.0-1032" in bad.fix
    cured = facts(uname="7.0.0-1019-nvidia", modules=HEALTHY["modules"].replace("quiet", "kho=off quiet"))
    assert pf.check_kernel(SPEC, cured, bad=BAD).status is Status.OK
    assert pf.check_kernel(SPEC, facts(), bad=BAD).status is Status.OK
    # the shipped list (deploy/host/bad-kernels.yaml) holds the field's entry, with its source
    shipped = pf.load_bad_kernels()
    assert "eugr/spark-vllm-docker/issues/392" in shipped["7.0.0-1019-nvidia"].source
    assert pf.check_kernel(SPEC, facts(uname="7.0.0-1019-nvidia")).status is Status.FAILED


def test_the_bad_kernel_list_names_a_malformed_entry(tmp_path):
    from sparkdeploy.errors import InventoryError

    f = tmp_path / "bad.yaml"
    f.write_text("kernels:\n  - {kernel: 7.0.0-1019-nvidia, breaks: x}\n")
    with pytest.raises(InventoryError, match=r"kernels\[0\]"):
        pf.load_bad_kernels(f)


@pytest.mark.parametrize("line,status,words", [
    ("702, 3003, 97, 66, Not Active, Not Active", Status.FAILED, "AC power"),  # eugr#334
    ("702, 3003, 0, 38, Not Active, Not Active", Status.OK, "idle"),  # idle clocks are low on every GPU
    ("2405, 3003, 98, 92, Active, Not Active", Status.FAILED, "-lgc 0,2000"),
    ("2405, 3003, 98, 70, [N/A], [N/A]", Status.OK, "no thermal"),
])
def test_sm_clock_stuck_low_and_thermal_slowdown(line, status, words):
    """Recorded lines of GB10's `nvidia-smi` (no GB10 here; the sim's nodes have none)."""
    r = pf.check_gpu_clocks(SPEC, facts(gpu_clocks=line))
    assert r.status is status and words in (r.fix if status is Status.FAILED else r.reason), r


TWO = [SPEC, NodeSpec("spark2", "192.168.177.12", "enp1s0f1np1", ("rocep1s0f1", "roceP2p1s0f1"))]
# spark2's table after an interface event: its IPv4 GIDs moved from index 3 to 4
MOVED = HEALTHY["rdma"].replace("c0a8:b10b", "c0a8:b10c").replace("c0a8:b20b", "c0a8:b20c").replace(
    " 1 3 0000:0000:0000:0000:0000:ffff", " 1 4 0000:0000:0000:0000:0000:ffff")
SPARK2 = {"addrs": HEALTHY["addrs"].replace(".11/24", ".12/24"), "rdma": MOVED}


def test_gid_index_against_the_running_release_and_across_nodes():
    now = {"spark1": facts(deployed="NCCL_IB_GID_INDEX=3"), "spark2": facts("spark2", deployed="NCCL_IB_GID_INDEX=3",
                                                                             **SPARK2)}
    r = pf.check_gid_plan(TWO, now)
    assert r.status is Status.FAILED and "spark2 rocep1s0f1: RoCE v2 IPv4 GID is at index 4" in r.reason
    assert "spark2: NCCL_IB_GID_INDEX=4" in r.fix and "spark1" not in r.fix
    # nothing deployed and no literal in the profile: the plan sets each node its own index at `up`
    fresh = {"spark1": facts(), "spark2": facts("spark2", **SPARK2)}
    ok = pf.check_gid_plan(TWO, fresh)
    assert ok.status is Status.OK and "differs across nodes" in ok.reason
    # a literal pinned in the profile's env is wrong for the node whose index differs
    pinned = pf.check_gid_plan(TWO, fresh, pinned="3")
    assert pinned.status is Status.FAILED and "the profile pins NCCL_IB_GID_INDEX=3" in pinned.reason
    assert pf.check_gid_plan([SIM_SPEC], {"node1": facts("node1")}).status is Status.SKIPPED


def test_every_pair_that_must_talk_is_tried_across_services(tmp_path, monkeypatch):
    """The router's node tries each service head's API port, each worker its head's master port; a refused
    port proves the path (nothing listens before `up`), a timeout does not."""
    from sparkdeploy import paths
    from sparkdeploy.model import inventory

    monkeypatch.setenv("HOME", str(tmp_path))  # the example's API key file, ~/.config/sparkdeploy/api_key
    (tmp_path / ".config" / "sparkdeploy").mkdir(parents=True)
    (tmp_path / ".config" / "sparkdeploy" / "api_key").write_text("k" * 32 + "\n")
    (tmp_path / ".config" / "sparkdeploy" / "api_key").chmod(0o600)
    views = inventory.load_services(paths.repo_root() / "examples" / "inventory.4node.yaml")
    heads = {f"{v.head.data_ip}:{v.ports.api}" for v in views}
    for view in views:  # the router (spark1) is in the first service only: from either, it tries every head
        targets = d.reach_targets(view)
        for node in view.nodes:
            if node.name != view.head.name:
                assert f"{view.head.data_ip}:{view.ports.master}" in targets[node.name]
        assert heads <= set(targets[view.router.node.name]), (view.service, targets)
    specs = [SPEC, NodeSpec("spark2", "192.168.177.12", "enp1s0f1np1")]
    f1 = facts(reach="192.168.177.12 ok\n192.168.177.13:8000 refused")
    f2 = facts("spark2", reach="192.168.177.11 ok\n192.168.177.11:29501 err timed out")
    r = pf.check_reach(specs, {"spark1": f1, "spark2": f2})
    assert r.status is Status.FAILED and r.reason == "spark2 -> 192.168.177.11:29501: timed out"
    assert pf.check_reach(specs, {"spark1": f1, "spark2": facts("spark2")}).status is Status.OK
    # the router's node, outside the service examined, probed for its paths only
    router = {"spark9": facts("spark9", reach="192.168.177.11:8000 err [Errno 113] No route to host")}
    r = pf.check_reach(specs, {"spark1": f1, "spark2": facts("spark2")}, router)
    assert r.status is Status.FAILED and "spark9 -> 192.168.177.11:8000: [Errno 113]" in r.reason
    down = pf.check_reach(specs, {"spark1": f1, "spark2": facts("spark2")},
                          {"spark9": HostFacts("spark9", error="ssh: timed out")})
    assert down.status is Status.FAILED and "spark9 (outside the service): not reached: ssh: timed out" in down.reason
    out = subprocess.run(probes.reach_argv(["127.0.0.1:1"]), capture_output=True, text=True, timeout=30).stdout
    assert HostFacts.from_output("spark9", out).text("reach") == "127.0.0.1:1 refused"


def test_doctors_clock_query_through_the_nvidia_smi_double(tmp_path):
    """The probe's real gpu_clocks section against tests/support/fake_nvidia_smi (a test double for GB10's
    nvidia-smi: there is no GB10 here) planted at 702 MHz under load."""
    from tests.support import fake_nvidia_smi

    bin_dir = fake_nvidia_smi.install(tmp_path / "bin", "40.1, 702, 97", clocks="702, 3003, 97, 71, Not Active, Not Active")
    script = probes.probe_script({"gpu_clocks": probes.SECTIONS["gpu_clocks"]})
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30,
                         env={"PATH": f"{bin_dir}:/usr/bin:/bin"}).stdout
    r = pf.check_gpu_clocks(SPEC, HostFacts.from_output("spark1", out))
    assert r.status is Status.FAILED and "702 MHz at 97 % busy" in r.reason and "AC power" in r.fix


def test_one_unit_state_parser_reads_every_systemctl_show():
    """Units in blocks, in order; a repeated property (two ExecStartPre commands) keeps both for the stale
    check and reads as its first value; a single-unit read of nothing is empty, never an error."""
    text = ("Id=a.service\nActiveState=active\nExecStartPre={ path=/bin/x ; argv[]=/bin/x one ; pid=1 }\n"
            "ExecStartPre={ path=/bin/y ; argv[]=/bin/y two ; pid=2 }\n\nId=b.service\nActiveState=failed\n"
            "InvocationID=\n")
    a, b = probes.parse_unit_states(text)
    assert (a["Id"], a["ActiveState"], a["ExecStartPre"]) == ("a.service", "active", "{ path=/bin/x ; argv[]=/bin/x one ; pid=1 }")
    assert a.commands() == ["ExecStartPre=/bin/x one", "ExecStartPre=/bin/y two"]
    assert dict(b) == {"Id": "b.service", "ActiveState": "failed", "InvocationID": ""}
    assert probes.unit_state(text) == a and dict(probes.unit_state("")) == {}
    assert probes.unit_show_argv(["u.service"], ("ActiveState", "SubState"))[-5:] == [
        "-p", "ActiveState", "-p", "SubState", "u.service"]


def _ring_inventory(tmp_path):
    """A three-node ring as `sim up --ring` writes it (service s1 on node1 + node2, node3 idle), each cable a
    10.97.x.0/24 of its own (no such network here: the loader refuses loopback addresses)."""
    from dataclasses import replace

    from sparkdeploy.sim.cluster import SimNode, SimState
    from sparkdeploy.sim.inventory_file import write_inventory
    from sparkdeploy.sim.ring import ring_addresses

    names = ["node1", "node2", "node3"]
    links = ring_addresses(names, ["10.97.31.0/24", "10.97.32.0/24", "10.97.33.0/24"], "p")
    state = SimState(name="r", subnet="10.97.30.0/24", network="n", image="i", key=str(tmp_path / "id_ed25519"),
                     known_hosts=str(tmp_path / "known_hosts"), inventory=None, profile="sim-tiny",
                     nodes=[SimNode(n, f"10.97.30.1{i + 1}", "c", "v", "worker",
                                    [replace(link, netdev=f"eth{k + 1}") for k, link in enumerate(links[n])])
                            for i, n in enumerate(names)])
    assert write_inventory(state, tmp_path / "ring.yaml") is None
    return tmp_path / "ring.yaml"


def test_a_rings_service_checks_all_three_cables_naming_both_ports(tmp_path):
    from sparkdeploy.model import inventory

    inv = inventory.load(_ring_inventory(tmp_path), "s1")
    links = d.service_links(inv)
    assert [p.describe() for p in links] == ["node1 eth1 -> node2 eth1", "node1 eth2 -> node3 eth2",
                                             "node2 eth2 -> node3 eth1"]
    assert [n.name for n in d.link_peers(inv)] == ["node3"]
    targets = d.reach_targets(inv)
    assert targets["node3"] == ["10.97.33.11", "10.97.32.12"]  # each cable from the far end too
    assert targets["node1"] == ["10.97.31.12", "10.97.33.13"] and "10.97.31.11:29500" in targets["node2"]
    # a dead cable is named by both its ports, from both ends
    dead = {"node1": facts("node1", reach="10.97.31.12 ok\n10.97.33.13 err timed out"),
            "node2": facts("node2", reach="10.97.31.11 ok\n10.97.32.13 ok")}
    r = pf.check_reach([d.spec_of(n, None) for n in inv.nodes], dead,
                       {"node3": facts("node3", reach="10.97.33.11 err timed out\n10.97.32.12 ok")},
                       d.path_names(links))
    assert r.status is Status.FAILED
    assert r.reason == "node1 eth2 -> node3 eth2 10.97.33.13: timed out; node3 eth2 -> node1 eth2 10.97.33.11: timed out"


def test_examine_on_a_ring_tries_and_measures_every_link_through_local_connections(tmp_path):
    """examine() reaches the third node of the ring (outside the service) for its paths and measures all three
    cables; here no address of the ring exists, so every link fails, each named by its two ports."""
    from sparkdeploy.model import inventory
    from sparkdeploy.remote.connection import Target
    from sparkdeploy.remote.ssh import Pool

    inv = inventory.load(_ring_inventory(tmp_path), "s1")
    pool = Pool([Target(n, "localhost", local=True) for n in ("node1", "node2", "node3")])
    exam = d.examine(inv, checkpoint_dir="/nonexistent/ckpt", pool=pool)
    by = {(r.node, r.check): r for r in exam.results}
    assert not any(r.node == "node3" for r in exam.results)  # not examined: only its paths count
    reach, bandwidth = by[("cluster", "data-plane-reach")], by[("cluster", "data-plane-bandwidth")]
    # node1 2 + node2 3 (its head's master port) + node3 2: whether this machine's network answers for
    # 10.97.x varies, so either all 7 answered or node3's cable to node1 is named by its ports
    assert "7 node-to-node" in reach.reason or "node3 eth2 -> node1 eth2 10.97.33.11" in reach.reason, reach
    assert bandwidth.status is Status.FAILED  # no address of the ring is this machine's
    for link in ("node1 eth1 -> node2 eth1: ", "node1 eth2 -> node3 eth2: ", "node2 eth2 -> node3 eth1: "):
        assert link in bandwidth.reason, bandwidth


def test_the_image_libs_probe_says_absent_for_an_image_the_engine_lacks():
    """The whole probe on this machine's shell and Docker engine (or none): no such image reads as absent, and
    the host's own libnccl (none here) as empty."""
    out = subprocess.run(probes.image_libs_argv("sparkdeploy-no-such-image:0"), capture_output=True, text=True)
    got = probes.parse_image_libs(out.stdout)
    assert out.returncode == 0 and got["image"] == "absent" and got["image_pip"] == "", out.stdout


def test_doctor_plans_on_the_facts_up_gathers_and_says_a_refusal_on_its_own_line():
    """Doctor used to give the planner /proc/meminfo alone, so a node whose RoCE twin was missing passed doctor's
    plan while `up` (which plans on the gathered netdevs and GIDs) refused it. Now both plan on `from_probe`'s
    facts: the refusal is a "plan" line naming the field, and the memory lines still carry the budget."""
    from sparkdeploy import paths
    from sparkdeploy.model import inventory
    from sparkdeploy.node.facts import from_probe

    inv = inventory.load(paths.repo_root() / "inventory.yaml")
    spark1 = inv.node("spark1")
    budgets, _, budget_error, refusal = d.plan_verdict(inv, {"spark1": from_probe(spark1, facts())})
    assert refusal is None and budget_error is None and set(budgets) == {"spark1", "spark2"}

    one_twin = "\n".join(line for line in HEALTHY["rdma"].splitlines() if "roceP2p1s0f1" not in line)
    budgets, _, budget_error, refusal = d.plan_verdict(inv, {"spark1": from_probe(spark1, facts(rdma=one_twin))})
    assert refusal.check == "plan" and refusal.node == "spark1" and refusal.status is Status.FAILED
    assert "nodes[0].hca[1]" in refusal.reason and "'roceP2p1s0f1' (has: rocep1s0f1)" in refusal.reason
    assert budget_error is None and set(budgets) == {"spark1", "spark2"}

    # a facts file renames doctor's GPU for its checks; the plan keeps nvidia-smi's answer, as `up` would
    no_smi = facts(gpu="nvidia-smi: not found", _rcs={"gpu": 127}, _overrides={"gpu_name": "NVIDIA GB10"})
    assert no_smi.gpus and not from_probe(spark1, no_smi).has_gpu

    short = "MemTotal: 127535896 kB\nMemAvailable: 20000000 kB\n"
    budgets, _, budget_error, refusal = d.plan_verdict(inv, {"spark1": from_probe(spark1, facts(meminfo=short))})
    assert refusal is None and budgets == {} and budget_error.startswith("node spark1: ")
