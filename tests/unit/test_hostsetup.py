"""host setup: rendering, the pure diff, and idempotence (the state after applying plans nothing)."""

from __future__ import annotations

import dataclasses

import yaml

from sparkdeploy.checks import preflight
from sparkdeploy.node import probes
from sparkdeploy.ops import hostsetup as hs


def fresh() -> hs.HostState:
    return hs.HostState(apt_available=True, netplan_available=True, ssh_unit="ssh", sshd_pid="77",
                        sshd_live_adj="0", files={hs.EARLYOOM_DEFAULT: 'EARLYOOM_ARGS="-r 3600"\n'},
                        twin_netdevs=("enp1s0f1np1", "enP2p1s0f1np1"))


def after(state: hs.HostState, items) -> hs.HostState:
    """What the node looks like once `items` ran (files written, services (re)started)."""
    s = dataclasses.replace(state, files=dict(state.files))
    for it in items:
        if it.status != hs.CHANGE:
            continue
        for path, content, _ in it.writes:
            s.files[path] = content
        if it.name == "packages":
            s.earlyoom_installed = s.rsync_installed = True
        if it.name == "earlyoom-service":
            s.earlyoom_enabled, s.earlyoom_active = "enabled", "active"
            s.earlyoom_cmdline = "/usr/bin/earlyoom " + " ".join(hs.earlyoom_args())
        if it.name == "sshd-oom":
            s.sshd_live_adj = "-1000"
    return s


def statuses(items):
    return {i.name: i.status for i in items}


def test_fresh_node_changes_everything_but_network_then_nothing():
    kw = dict(netdev="enp1s0f1np1", data_ip="192.168.177.11")
    first = hs.plan_items("spark1", fresh(), **kw)
    assert statuses(first) == {"packages": "would change", "earlyoom-config": "would change",
                               "earlyoom-service": "would change", "sshd-oom": "would change", "netplan": "skipped"}
    assert "--apply-network" in first[-1].note and "+      mtu: 9000" in first[-1].diff
    cfg = first[1]
    assert cfg.diff.startswith("--- spark1:/etc/default/earlyoom (now)") and '-EARLYOOM_ARGS="-r 3600"' in cfg.diff
    second = hs.plan_items("spark1", after(fresh(), first), **kw)
    assert statuses(second) == {"packages": "ok", "earlyoom-config": "ok", "earlyoom-service": "ok",
                                "sshd-oom": "ok", "netplan": "skipped"}
    assert not any(i.commands or i.writes for i in second)


def test_apply_network_writes_netplan_once():
    kw = dict(netdev="enp1s0f1np1", data_ip="192.168.177.11", apply_network=True)
    first = hs.plan_items("spark1", fresh(), **kw)
    net = first[-1]
    assert net.status == "would change" and net.commands == [["netplan", "apply"]]
    (path, content, mode), = net.writes
    assert (path, mode) == ("/etc/netplan/40-cx7.yaml", 0o600)
    eth = yaml.safe_load(content)["network"]["ethernets"]
    assert eth["enp1s0f1np1"]["addresses"] == ["192.168.177.11/24"]
    assert eth["enP2p1s0f1np1"]["addresses"] == ["192.168.178.11/24"]  # a different /24 per twin
    assert all(v["mtu"] == 9000 and v["dhcp4"] is False and v["link-local"] == [] for v in eth.values())
    assert statuses(hs.plan_items("spark1", after(fresh(), first), **kw))["netplan"] == "ok"


def test_sshd_live_adjust_skipped_where_impossible():
    st = dataclasses.replace(fresh(), can_lower_oom=False)
    ssh = {i.name: i for i in hs.plan_items("n", st, netdev="eth0", data_ip="10.0.0.1")}["sshd-oom"]
    assert ssh.status == "would change" and not any("oom_score_adj" in " ".join(c) for c in ssh.commands)
    assert "CAP_SYS_RESOURCE" in ssh.note
    done = dataclasses.replace(st, files={**st.files, hs.dropin_path("ssh"): hs.render_sshd_dropin()})
    assert {i.name: i for i in hs.plan_items("n", done, netdev="eth0", data_ip="10.0.0.1")}["sshd-oom"].status == "ok"
    assert probes.has_cap_sys_resource("000001ffffffffff") and not probes.has_cap_sys_resource("000001fffeffffff")


def test_no_twins_no_netplan():
    net = hs.plan_items("node1", fresh(), netdev="eth0", data_ip="172.30.99.11", hca=(), apply_network=True)[-1]
    assert net.status == "skipped" and not net.diff and "hca: []" in net.note


def test_no_netplan_binary_is_skipped_with_reason():
    st = dataclasses.replace(fresh(), netplan_available=False)
    net = hs.plan_items("node1", st, netdev="eth0", data_ip="172.30.99.11", apply_network=True)[-1]
    assert net.status == "skipped" and "netplan is not installed" in net.note


def test_drift_is_repaired():
    kw = dict(netdev="eth0", data_ip="172.30.99.11")
    done = after(fresh(), hs.plan_items("n", fresh(), **kw))
    # someone edits the thresholds by hand and restarts earlyoom with them
    drift = dataclasses.replace(done, files={**done.files, hs.EARLYOOM_DEFAULT: 'EARLYOOM_ARGS="-m 50"\n'},
                                earlyoom_cmdline="/usr/bin/earlyoom -m 50")
    items = {i.name: i for i in hs.plan_items("n", drift, **kw)}
    assert items["earlyoom-config"].status == "would change"
    assert ["systemctl", "restart", "earlyoom"] in items["earlyoom-service"].commands
    # file right but the daemon still runs old arguments: restart only
    stale = dataclasses.replace(done, earlyoom_cmdline="/usr/bin/earlyoom -m 50")
    items = {i.name: i for i in hs.plan_items("n", stale, **kw)}
    assert items["earlyoom-config"].status == "ok" and items["earlyoom-service"].status == "would change"


def test_rendered_earlyoom_matches_doctor_and_has_no_spaces_in_regexes():
    args = hs.earlyoom_args()
    assert args[args.index("--prefer") + 1] == hs.EARLYOOM_PREFER
    assert args[args.index("--avoid") + 1] == hs.EARLYOOM_AVOID
    assert "-p" in args and args[args.index("-m") + 1] == "4,2"
    cmdline = "/usr/bin/earlyoom " + " ".join(args)
    assert preflight._earlyoom_args_ok(cmdline) == []
    assert hs.render_sshd_dropin().splitlines()[-1] == "OOMScoreAdjust=-1000"


def test_twins_addressing():
    assert hs.twins_for("eth0", "10.1.2.3", ()) == [hs.Twin("eth0", "10.1.2.3/24")]
    t = hs.twins_for("enP2p1s0f1np1", "192.168.177.12", ("enP2p1s0f1np1", "enp1s0f1np1"))
    assert t == [hs.Twin("enP2p1s0f1np1", "192.168.177.12/24"), hs.Twin("enp1s0f1np1", "192.168.178.12/24")]


class FakeConn:
    name = "spark1"

    def __init__(self):
        self.runs, self.puts = [], []

    def run(self, argv, **kw):
        from sparkdeploy.remote.connection import Result

        self.runs.append(list(argv))
        out = "/tmp/.sparkdeploy-host.Qx7Zr2Lm9a\n" if argv[:2] == ["mktemp", "-d"] else ""
        return Result(list(argv), 0, out, "", self.name)

    def put(self, path, data, *, mode=0o644, owner=None):
        self.puts.append((path, data, mode))


def test_non_root_login_writes_through_sudo_install():
    c = FakeConn()
    hs.write_file(c, "/etc/netplan/40-cx7.yaml", "network: {}\n", 0o600, sudo=hs.sudo_prefix("nvidia"))
    # the content waits in a private mktemp'd directory (0700, unpredictable), never a fixed /tmp name
    tmp = "/tmp/.sparkdeploy-host.Qx7Zr2Lm9a/40-cx7.yaml"
    assert ["mktemp", "-d", "/tmp/.sparkdeploy-host.XXXXXXXXXX"] in c.runs
    assert c.puts == [(tmp, b"network: {}\n", 0o600)]
    assert ["sudo", "-n", "mkdir", "-p", "/etc/netplan"] in c.runs
    assert ["sudo", "-n", "install", "-m", "600", "-o", "root", "-g", "root", tmp, "/etc/netplan/40-cx7.yaml"] in c.runs
    assert c.runs[-1] == ["rm", "-rf", "/tmp/.sparkdeploy-host.Qx7Zr2Lm9a"]
    items = hs.plan_items("spark1", fresh(), netdev="enp1s0f1np1", data_ip="192.168.177.11")
    c = FakeConn()
    done = hs.apply_items(c, items, sudo=["sudo", "-n"])
    assert [a.status for a in done] == ["changed"] * 4
    assert all(r[:2] == ["sudo", "-n"] or r[0] in ("rm", "mktemp") for r in c.runs)
    root = FakeConn()
    hs.write_file(root, hs.EARLYOOM_DEFAULT, "x\n", 0o644)
    assert root.puts == [(hs.EARLYOOM_DEFAULT, b"x\n", 0o644)]


def test_a_ring_nodes_netplan_lists_each_link_with_its_own_subnet():
    """spark2 of the shipped ring example: two cables, two subnets. Each link's netdev gets the inventory's
    address; no twin is put on a derived next /24 (192.168.11.0/24 is the spark2-spark3 cable's)."""
    import yaml

    from sparkdeploy import paths
    from sparkdeploy.model import inventory

    spark2 = inventory.load(paths.repo_root() / "examples" / "inventory.3ring.yaml").node("spark2")
    links = spark2.data_links()
    kw = dict(netdev=spark2.netdev, data_ip=spark2.data_ip, hca=spark2.hca, links=links, apply_network=True)
    net = {i.name: i for i in hs.plan_items("spark2", fresh(), **kw)}["netplan"]
    assert net.status == "would change"
    written = yaml.safe_load(net.writes[0][1])["network"]["ethernets"]
    assert {dev: cfg["addresses"] for dev, cfg in written.items()} == {
        "enp1s0f0np0": ["192.168.11.2/24"], "enp1s0f1np1": ["192.168.10.2/24"]}
    assert all(cfg["mtu"] == 9000 for cfg in written.values())
    done = after(fresh(), hs.plan_items("spark2", fresh(), **kw))
    assert {i.name: i for i in hs.plan_items("spark2", done, **kw)}["netplan"].status == "ok"


def test_the_host_state_probe_runs_on_a_real_shell_and_reads_this_machines_tools():
    """host setup's read, run here: doctor's earlyoom/sshd/rdma sections and the tools it installs or uses."""
    import shutil

    from sparkdeploy.remote.ssh import LocalConn, Target

    st = hs.read_state(LocalConn(Target("local", "127.0.0.1", local=True)))
    assert (st.earlyoom_installed, st.rsync_installed, st.apt_available, st.netplan_available) == tuple(
        shutil.which(t) is not None for t in ("earlyoom", "rsync", "apt-get", "netplan"))
    assert st.ssh_unit in ("ssh", "sshd") and st.twin_netdevs == ()
