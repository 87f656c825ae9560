"""`sparkdeploy init`: the layout from recorded probe outputs of DGX Sparks (direct cable, switch, ring), the
choices it asks for where the boxes are ambiguous, and the inventory it writes planned as is."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
import yaml

from sparkdeploy import plan
from sparkdeploy.checks import init as I
from sparkdeploy.errors import InputError
from sparkdeploy.model import inventory
from tests.unit.init_boxes import ip_sections, output, sections

NOW = datetime(2026, 12, 5, 18, 0, tzinfo=timezone.utc)
SYNC_NETPLAN = "netplan /etc/netplan/60-nvsync-cx7.yaml network version ethernets enp1s0f1np1 enP2p1s0f1np1"


def box(name: str, n: int, ports: dict[str, str], **kw) -> I.Box:
    return I.parse_box(name, output(sections(name, n, ports, **kw)))


def pair_boxes() -> list[I.Box]:
    """Two Sparks, one cable on port 1: each twin its own subnet (host setup's and Sync's layout)."""
    return [box(f"spark{n}", n, {"enp1s0f1np1": f"192.168.177.1{n}/24", "enP2p1s0f1np1": f"192.168.178.1{n}/24"},
                network=SYNC_NETPLAN if n == 1 else "")
            for n in (1, 2)]


def ring_boxes() -> list[I.Box]:
    """Three Sparks in a ring: spark1 port 0 <-> spark2 port 1 on .12, spark2 port 0 <-> spark3 port 1 on .23,
    spark3 port 0 <-> spark1 port 1 on .31 (each link its own subnet; one twin addressed per port)."""
    links = {1: {"enp1s0f0np0": "192.168.12.1/24", "enp1s0f1np1": "192.168.31.1/24"},
             2: {"enp1s0f1np1": "192.168.12.2/24", "enp1s0f0np0": "192.168.23.2/24"},
             3: {"enp1s0f1np1": "192.168.23.3/24", "enp1s0f0np0": "192.168.31.3/24"}}
    return [box(f"spark{n}", n, ports) for n, ports in links.items()]


def plans(tmp_path, text: str):
    path = tmp_path / "inventory.yaml"
    path.write_text(text)
    return plan.plan(inventory.load(path))


def test_a_box_is_read_from_its_probe_output():
    b = pair_boxes()[0]
    assert (b.name, b.gpu, b.driver, b.kernel, b.mem_total) == ("spark1", "gb10", "580.95.05", "6.17.0-1032-nvidia",
                                                                 125_000_000 * 1024)
    # the CX-7 ports only (not the management port, not DGX OS's link-local 169.254 addresses), each with its
    # RoCE device, speed, MTU and the RoCE v2 GID index of its own address
    assert [(p.netdev, p.ip, p.prefix, p.hca, p.gid_index, p.speed_mbit, p.mtu) for p in b.ports] == [
        ("enP2p1s0f1np1", "192.168.178.11", 24, ("roceP2p1s0f1",), 3, 200000, 9000),
        ("enp1s0f1np1", "192.168.177.11", 24, ("rocep1s0f1",), 3, 200000, 9000)]
    assert b.network_files == ("netplan /etc/netplan/60-nvsync-cx7.yaml (enp1s0f1np1, enP2p1s0f1np1)",)
    nm = box("spark1", 1, {"enp1s0f1np1": "192.168.177.11/24"},
             network="nm /run/NetworkManager/system-connections/cx7.nmconnection enp1s0f1np1\n"
                     "nm /etc/NetworkManager/system-connections/wifi.nmconnection wlP9s9")
    assert nm.network_files == ("NetworkManager /run/NetworkManager/system-connections/cx7.nmconnection "
                                "(enp1s0f1np1) (under /run: lost at reboot)",)


def test_direct_cable_plans_as_written(tmp_path):
    lay = I.work_out(pair_boxes())
    assert lay.kind == "direct" and [n.box.name for n in lay.nodes] == ["spark1", "spark2"]
    text = I.render(lay, user="nvidia", profile=None, hosts=["spark1", "spark2"], now=NOW)
    raw = yaml.safe_load(text)
    assert raw["nodes"][0] | {"ssh": None} == {
        "name": "spark1", "role": "head", "ssh": None, "data_ip": "192.168.177.11", "netdev": "enp1s0f1np1",
        "hca": ["rocep1s0f1", "roceP2p1s0f1"], "gpu": "gb10"}
    assert raw["nodes"][0]["ssh"] == {"host": "spark1", "user": "nvidia"}
    assert "# network: netplan /etc/netplan/60-nvsync-cx7.yaml" in text and "RoCE v2 IPv4 GID 3" in text
    p = plans(tmp_path, text)
    assert [(n.name, n.role) for n in p.nodes] == [("spark1", "head"), ("spark2", "worker")]
    assert p.nodes[0].env["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1"
    assert p.nodes[1].env["NCCL_SOCKET_IFNAME"] == "enp1s0f1np1"


def test_switch_puts_every_node_on_one_subnet(tmp_path):
    """Four boxes on a switch, a two-node profile: one service per pair, each planned as written."""
    boxes = [box(f"spark{n}", n, {"enp1s0f1np1": f"10.10.0.{n}/16"}) for n in (1, 2, 3, 4)]
    lay = I.work_out(boxes)
    assert lay.kind == "switch" and {n.data.ip for n in lay.nodes} == {f"10.10.0.{n}" for n in (1, 2, 3, 4)}
    text = I.render(lay, user=None, profile=None, hosts=[b.host for b in boxes], now=NOW)
    path = tmp_path / "inventory.yaml"
    path.write_text(text)
    views = inventory.load_services(path)
    assert [[n.name for n in v.nodes] for v in views] == [["spark1", "spark2"], ["spark3", "spark4"]]
    assert [len(plan.plan(v).nodes) for v in views] == [2, 2]
    # three boxes for a two-node profile: one service, the third box named as spare
    text = I.render(I.work_out(boxes[:3]), user=None, profile=None, hosts=["a", "b", "c"], now=NOW)
    assert "# in no service yet: spark3" in text and "nodes: [spark1, spark2]" in text
    # a four-node profile on three boxes cannot be placed: the choices are named
    from sparkdeploy import paths

    four = tmp_path / "tp4.yaml"
    four.write_text((paths.profiles_dir() / "qwen3.8-flash-next-nvfp4.yaml").read_text().replace("  tp: 2", "  tp: 4"))
    with pytest.raises(I.InitError, match="needs 4 node.*the boxes are 3: pass --profile"):
        I.render(I.work_out(boxes[:3]), user=None, profile="tp4.yaml", hosts=["a", "b", "c"], out=path, now=NOW)


def test_ring_gets_a_link_per_peer(tmp_path):
    lay = I.work_out(ring_boxes())
    assert lay.kind == "ring" and lay.nodes[0].box.name == "spark1"
    raw = yaml.safe_load(I.render(lay, user=None, profile=None, hosts=["spark1", "spark2", "spark3"], now=NOW))
    # the per-link schema (issue 35): one entry per peer, each its own subnet; no shorthand beside it
    assert raw["nodes"][0]["links"] == [
        {"netdev": "enp1s0f0np0", "ip": "192.168.12.1", "prefix": 24, "hca": ["rocep1s0f0"], "peer": "spark2"},
        {"netdev": "enp1s0f1np1", "ip": "192.168.31.1", "prefix": 24, "hca": ["rocep1s0f1"], "peer": "spark3"}]
    assert not {"data_ip", "netdev", "hca"} & set(raw["nodes"][0])
    # and it plans as written: each service on two of the three, over the cable those two share
    text = I.render(lay, user=None, profile=None, hosts=["spark1", "spark2", "spark3"], now=NOW)
    (tmp_path / "inventory.yaml").write_text(text)
    s1 = plan.plan(inventory.load(tmp_path / "inventory.yaml", "s1"))
    assert [(n.name, n.data_ip) for n in s1.nodes] == [("spark1", "192.168.12.1"), ("spark2", "192.168.12.2")]


def test_sim_like_boxes_without_rdma_use_their_plain_interface(tmp_path):
    """A box without RDMA devices (the sim's nodes: containers) offers its up interfaces, not Docker's."""
    secs = [sections(f"node{n}", n, {}, gpu="nvidia-smi: not found") for n in (1, 2)]
    for n, s in enumerate(secs, 1):
        s["rdma"] = ""
        s.update(ip_sections(json.loads(
            '[{"ifname":"lo","mtu":65536,"operstate":"UNKNOWN","addr_info":[{"family":"inet","local":"127.0.0.1","prefixlen":8}]},'
            '{"ifname":"docker0","mtu":1500,"operstate":"UP","addr_info":[{"family":"inet","local":"172.17.0.1","prefixlen":16}]},'
            f'{{"ifname":"eth0","mtu":9000,"operstate":"UP","addr_info":[{{"family":"inet","local":"172.30.97.1{n}","prefixlen":24}}]}}]')))
    boxes = [I.parse_box(f"172.30.97.1{n}", output(s)) for n, s in enumerate(secs, 1)]
    assert [b.name for b in boxes] == ["node1", "node2"]  # an address is no name: the box's hostname is
    lay = I.work_out(boxes)
    text = I.render(lay, user="root", profile=None, hosts=["172.30.97.11", "172.30.97.12"], now=NOW)
    assert "profile: sim-tiny" in text and "gpu: none" in text and "image:" not in text
    p = plans(tmp_path, text)
    assert [(n.name, n.data_ip) for n in p.nodes] == [("node1", "172.30.97.11"), ("node2", "172.30.97.12")]


def sim_ring_box(n: int) -> I.Box:
    """A node of `sim up --ring`: no RDMA devices, SSH on eth0 (the management network, every node on it) and
    one interface per cable, each cable its own /24 (node1-node2 on .12, node2-node3 on .23, node3-node1 on .31)."""
    cables = {1: ("172.31.12.11", "172.31.31.11"), 2: ("172.31.12.12", "172.31.23.12"),
              3: ("172.31.23.13", "172.31.31.13")}[n]
    ifaces = [("eth0", f"172.30.97.1{n}")] + [(f"eth{i}", ip) for i, ip in enumerate(cables, 1)]
    s = sections(f"node{n}", n, {}, gpu="nvidia-smi: not found")
    s["rdma"] = ""
    s.update(ip_sections([{"ifname": dev, "mtu": 1500, "operstate": "UP",
                           "addr_info": [{"family": "inet", "local": ip, "prefixlen": 24}]} for dev, ip in ifaces]))
    return I.parse_box(f"172.30.97.1{n}", output(s), reached_at=f"172.30.97.1{n}")


def test_the_port_ssh_reached_is_management_where_a_box_without_rdma_has_others(tmp_path):
    """The sim's ring: every node shares the SSH network, which would read as a switch; init leaves the port
    it reached the box on out of the data ports, so the cables make the ring, and the inventory names the key
    and known_hosts init logged in with (the sim's own, not the user's defaults)."""
    boxes = [sim_ring_box(n) for n in (1, 2, 3)]
    assert [p.netdev for p in boxes[0].ports] == ["eth1", "eth2"] and boxes[0].other_ports[0].netdev == "eth0"
    lay = I.work_out(boxes)
    assert lay.kind == "ring" and [n.box.name for n in lay.nodes] == ["node1", "node2", "node3"]
    text = I.render(lay, user="nvidia", profile=None, hosts=[f"172.30.97.1{n}" for n in (1, 2, 3)], now=NOW,
                    key="~/.ssh/sim_ed25519", known_hosts="~/.ssh/sim_known_hosts")
    (tmp_path / "inventory.yaml").write_text(text)
    s1 = inventory.load(tmp_path / "inventory.yaml", "s1")
    assert [(n.name, n.ssh.host, n.ssh.key, n.ssh.known_hosts) for n in s1.nodes] == [
        (f"node{n}", f"172.30.97.1{n}", "~/.ssh/sim_ed25519", "~/.ssh/sim_known_hosts") for n in (1, 2)]
    p = plan.plan(s1)
    assert [(n.name, n.data_ip, n.env["NCCL_SOCKET_IFNAME"]) for n in p.nodes] == [
        ("node1", "172.31.12.11", "eth1"), ("node2", "172.31.12.12", "eth1")]
    # a node whose only port is the SSH one keeps it as its data port (the plain two-node sim)
    only_ssh = I.parse_box("10.0.0.1", output({**sections("node1", 1, {}, gpu="nvidia-smi: not found"), "rdma": ""}),
                           reached_at="10.0.0.1")
    assert [p.netdev for p in only_ssh.ports] == ["enP7s7"]


def test_a_lone_box_serves_on_its_management_address(tmp_path):
    """One Spark, no CX-7 cable: the single-box layout on the address it has (a one-node profile)."""
    lone = box("spark1", 1, {})
    assert lone.ports == () and [p.netdev for p in lone.other_ports] == ["enP7s7"]
    lay = I.work_out([lone])
    assert lay.kind == "single" and lay.nodes[0].data.ip == "10.0.0.1"
    p = plans(tmp_path, I.render(lay, user=None, profile="gpt-oss-120b", hosts=["spark1"], now=NOW))
    assert [(n.name, n.data_ip) for n in p.nodes] == [("spark1", "10.0.0.1")]


def test_two_up_ports_on_one_subnet_ask_which(tmp_path):
    boxes = pair_boxes()
    two = box("spark1", 1, {"enp1s0f1np1": "192.168.177.11/24", "enP2p1s0f1np1": "192.168.177.21/24"})
    with pytest.raises(I.InitError) as err:
        I.work_out([two, boxes[1]])
    assert err.value.exit_code == 2
    assert "node spark1 has 2 up ports on 192.168.177.0/24" in str(err.value)
    assert "--netdev spark1=enP2p1s0f1np1|enp1s0f1np1" in str(err.value)
    lay = I.work_out([two, boxes[1]], netdev={"spark1": "enp1s0f1np1"})
    assert lay.nodes[0].data.netdev == "enp1s0f1np1"


def test_layouts_that_cannot_be_planned_say_why():
    far = [box("spark1", 1, {"enp1s0f1np1": "192.168.177.11/24"}), box("spark2", 2, {"enp1s0f1np1": "192.168.99.12/24"})]
    with pytest.raises(I.InitError, match="no two nodes share a subnet.*Cluster Assistant"):
        I.work_out(far)
    lonely = pair_boxes() + [box("spark3", 3, {"enp1s0f1np1": "192.168.50.13/24"})]
    with pytest.raises(I.InitError, match=r"spark3 share no subnet"):
        I.work_out(lonely)
    # a four-node ring: no node links to every other, so none can be head
    ring4 = {1: ("192.168.12.1/24", "192.168.41.1/24"), 2: ("192.168.12.2/24", "192.168.23.2/24"),
             3: ("192.168.23.3/24", "192.168.34.3/24"), 4: ("192.168.34.4/24", "192.168.41.4/24")}
    boxes = [box(f"spark{n}", n, {"enp1s0f0np0": a, "enp1s0f1np1": b}) for n, (a, b) in ring4.items()]
    with pytest.raises(I.InitError, match="none can be head.*spark1 -> spark2, spark4"):
        I.work_out(boxes)
    with pytest.raises(I.InitError, match="--head spark9: no such node; choose one of spark1, spark2"):
        I.work_out(pair_boxes(), head="spark9")
    assert I.work_out(pair_boxes(), head="spark2").nodes[0].box.name == "spark2"
    twins = [I.parse_box(f"10.0.0.1{n}", output(sections("spark", n, {"enp1s0f1np1": f"192.168.177.1{n}/24"})))
             for n in (1, 2)]
    with pytest.raises(I.InitError, match="share a hostname.*Host alias"):
        I.work_out(twins)
    with pytest.raises(I.InitError, match="hostname '-x'.*Host alias"):
        I.parse_box("10.0.0.11", output(sections("-x", 1, {})))


def test_cli_refuses_to_overwrite_and_names_bad_flags(tmp_path, capsys):
    from sparkdeploy.cli import main

    existing = tmp_path / "inventory.yaml"
    existing.write_text("keep me\n")
    assert main(["init", "spark1", "--out", str(existing)]) == 2
    assert "--force" in capsys.readouterr().err and existing.read_text() == "keep me\n"
    with pytest.raises(InputError, match="NODE=NETDEV"):
        from sparkdeploy.cli.init import _pairs
        _pairs("--netdev", ("spark1",))


NETPLAN = """network:
  version: 2
  ethernets:
    enp1s0f1np1:
      addresses: [192.168.177.1{n}/24]
      mtu: 9000
    enP2p1s0f1np1:
      addresses: [192.168.178.1{n}/24]
      mtu: 9000
"""


def test_init_reads_two_boxes_over_real_ssh(tmp_path, monkeypatch, capsys):
    """`sparkdeploy init spark1 spark2` through two real loopback sshds, reached by ~/.ssh/config aliases, with
    the real probe script. The GB10/CX-7 hardware is the part we cannot run: each sshd's sessions get
    $SPARKDEPLOY_PROBE_ROOT pointing at a recorded Spark's /proc, /sys and /etc/netplan, and stand-ins for `ip`
    and `nvidia-smi` on PATH (tests/unit/init_boxes.write_root)."""
    from sparkdeploy.cli import main
    from tests.support import sshd as sshd_mod
    from tests.unit.init_boxes import write_root

    if not sshd_mod.available():
        pytest.skip("needs /usr/sbin/sshd (openssh-server) and root")
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("SPARKDEPLOY_KNOWN_HOSTS", str(tmp_path / "known_hosts"))
    servers, config = [], []
    try:
        for n in (1, 2):
            root = tmp_path / f"spark{n}"
            write_root(root, n, {"enp1s0f1np1": f"192.168.177.1{n}/24", "enP2p1s0f1np1": f"192.168.178.1{n}/24"},
                       NETPLAN.format(n=n))
            s = sshd_mod.start(tmp_path / f"sshd{n}", options=(
                f"SetEnv=SPARKDEPLOY_PROBE_ROOT={root} PATH={root}/bin:/usr/sbin:/usr/bin:/sbin:/bin",))
            servers.append(s)
            config.append(f"Host spark{n}\n  HostName 127.0.0.1\n  Port {s.port}\n  User root\n"
                          f"  IdentityFile {s.client_key}\n")
        (home / ".ssh" / "config").write_text("".join(config))
        out = tmp_path / "inventory.yaml"
        assert main(["init", "spark1", "spark2", "--out", str(out), "--trust-new-hosts"]) == 0, capsys.readouterr().err
        assert "direct, head spark1" in capsys.readouterr().err
        text = out.read_text()
        assert "# network: netplan /etc/netplan/60-nvsync-cx7.yaml (enp1s0f1np1, enP2p1s0f1np1)" in text
        assert "enp1s0f1np1 192.168.177.12/24, 200G, MTU 9000, rocep1s0f1 RoCE v2 IPv4 GID 3" in text
        p = plan.plan(inventory.load(out))
        assert [(n.name, n.data_ip, n.env["NCCL_IB_HCA"]) for n in p.nodes] == [
            ("spark1", "192.168.177.11", "rocep1s0f1,roceP2p1s0f1"), ("spark2", "192.168.177.12", "rocep1s0f1,roceP2p1s0f1")]
        # --dry-run prints the same file and writes nothing
        assert main(["init", "spark1", "spark2", "--dry-run", "--out", str(tmp_path / "none.yaml")]) == 0
        assert capsys.readouterr().out.splitlines()[1:] == text.splitlines()[1:]  # all but the time stamp
        assert not (tmp_path / "none.yaml").exists()
        # a key and known_hosts given on the command line log in and are written into the node's ssh block
        known = tmp_path / "known_hosts"
        assert main(["init", "spark1", "--dry-run", "--profile", "gpt-oss-120b", "--key", str(servers[0].client_key),
                     "--known-hosts", str(known)]) == 0
        assert f"ssh: {{host: spark1, key: {servers[0].client_key}, known_hosts: {known}}}" in capsys.readouterr().out
    finally:
        for s in servers:
            s.stop()
