"""Facts read from a node: the gather probe's sections (doctor's own) parsed into NodeFacts (pure)."""

from types import SimpleNamespace

from sparkdeploy.node import facts
from sparkdeploy.node.probes import HostFacts
from sparkdeploy.ops import gather

OUT = """@@@ meminfo
MemTotal:       125000000 kB
MemAvailable:   121000000 kB
@@@ rc=0
@@@ links
1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN mode DEFAULT group default qlen 1000
3: enp1s0f1np1: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 9000 qdisc mq state UP mode DEFAULT group default qlen 1000
@@@ rc=0
@@@ addrs
3: enp1s0f1np1    inet 192.168.177.11/24 brd 192.168.177.255 scope global enp1s0f1np1\\       valid_lft forever
@@@ rc=0
@@@ gpu
NVIDIA GB10, 580.95.05
@@@ rc=0
@@@ docker
server=28.3.3
runtimes=io.containerd.runc.v2 nvidia runc
default_runtime=runc
@@@ rc=0
@@@ enabled_units
Id=docker.service

Id=sparkdeploy-engine.service
@@@ rc=0
@@@ rdma
port rocep1s0f1 1 enp1s0f1np1 4: ACTIVE
gid rocep1s0f1 1 0 fe80:0000:0000:0000:0000:0000:0000:0001 enp1s0f1np1 IB/RoCE v1
gid rocep1s0f1 1 1 fe80:0000:0000:0000:0000:0000:0000:0001 enp1s0f1np1 RoCE v2
gid rocep1s0f1 1 2 0000:0000:0000:0000:0000:ffff:c0a8:b10b enp1s0f1np1 IB/RoCE v1
gid rocep1s0f1 1 3 0000:0000:0000:0000:0000:ffff:c0a8:b10b enp1s0f1np1 RoCE v2
@@@ rc=0
"""


def parse_gather(node, text, *, mem_available=None):
    return facts.from_probe(node, HostFacts.from_output(node.name, text), mem_available=mem_available)


def test_parse_gather():
    node = SimpleNamespace(name="spark1", data_ip="192.168.177.11", netdev="enp1s0f1np1", hca=("rocep1s0f1", "x"))
    f = parse_gather(node, OUT)
    assert f.mem_total_bytes == 125000000 * 1024 and f.mem_available_bytes == 121000000 * 1024
    assert f.gpu_name == "NVIDIA GB10" and f.driver == "580.95.05" and f.has_gpu
    assert f.docker_version == "28.3.3" and "sparkdeploy-engine.service" in f.units
    assert f.netdev("enp1s0f1np1").addresses() == ("192.168.177.11",)
    assert [(r.name, r.gid_index) for r in f.roce] == [("rocep1s0f1", 3)]


def test_parse_gather_sim_node():
    node = SimpleNamespace(name="n2", data_ip="172.30.0.12", netdev="eth0", hca=())
    f = parse_gather(node, "@@@ meminfo\nMemTotal: 1000 kB\n@@@ rc=0\n@@@ gpu\n@@@ rc=0\n", mem_available=5)
    assert not f.has_gpu and f.gpu_name is None and f.roce == () and f.mem_available_bytes == 5


def test_parse_gather_reads_every_links_hcas_each_by_its_own_address():
    """A ring node has two links: each HCA's RoCE v2 GID is the one mapping its own link's IPv4 address."""
    from sparkdeploy.model.topology import Link

    links = (Link("enp1s0f1np1", "192.168.177.11", 24, ("rocep1s0f1",)),
             Link("enp1s0f0np0", "192.168.10.1", 24, ("rocep1s0f0",)))
    node = SimpleNamespace(name="spark1", data_links=lambda: links)
    ring = OUT.replace("@@@ rc=0\n@@@ gpu",
                       "2: enp1s0f0np0    inet 192.168.10.1/24 scope global enp1s0f0np0\n@@@ rc=0\n@@@ gpu")
    ring = ring.replace("@@@ rc=0\n@@@ addrs",
                        "2: enp1s0f0np0: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 9000 state UP\n@@@ rc=0\n@@@ addrs")
    ring = ring.removesuffix("@@@ rc=0\n") + ("port rocep1s0f0 1 enp1s0f0np0 4: ACTIVE\n"
                                       "gid rocep1s0f0 1 4 0000:0000:0000:0000:0000:ffff:c0a8:0a01 enp1s0f0np0 RoCE v2\n"
                                       "gid rocep1s0f0 1 5 0000:0000:0000:0000:0000:ffff:c0a8:b10b enp1s0f0np0 RoCE v2\n"
                                       "@@@ rc=0\n")
    f = parse_gather(node, ring)
    assert [(r.name, r.netdev, r.gid_index) for r in f.roce] == [("rocep1s0f1", "enp1s0f1np1", 3),
                                                               ("rocep1s0f0", "enp1s0f0np0", 4)]


def test_the_gather_probe_runs_on_a_real_shell_and_parses(tmp_path):
    """The script and its parser together, on this machine (no RoCE device here: that section stays empty).
    The checkpoint read is the same grammar: a config.json is read, a missing one is None."""
    import json

    from sparkdeploy.remote.ssh import LocalConn, Target

    conn = LocalConn(Target("local", "127.0.0.1", local=True))
    node = SimpleNamespace(name="local", data_ip="127.0.0.1", netdev="lo", hca=("no-such-hca",))
    f = gather.gather(conn, node)
    total_kb = int(next(row.split()[1] for row in open("/proc/meminfo") if row.startswith("MemTotal:")))
    assert f.mem_total_bytes == total_kb * 1024 and f.mem_available_bytes > 0
    assert f.netdev("lo") is not None and f.roce == ()
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    assert gather.checkpoint_facts(conn, str(tmp_path)) is not None
    assert gather.checkpoint_facts(conn, str(tmp_path / "absent")) is None
