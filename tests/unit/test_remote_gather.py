"""Facts read from a node: the gather script's tagged output parsed into NodeFacts (pure)."""

from types import SimpleNamespace

from sparkdeploy.ops import gather

OUT = """@@@ meminfo
MemTotal:       125000000 kB
MemAvailable:   121000000 kB
@@@ rc=0
@@@ ip
[{"ifname":"enp1s0f1np1","mtu":9000,"operstate":"UP","addr_info":[{"family":"inet","local":"192.168.177.11","prefixlen":24}]}]
@@@ rc=0
@@@ gpu
NVIDIA GB10, 580.95.05
@@@ rc=0
@@@ docker
28.3.3
@@@ rc=0
@@@ units
docker.service
sparkdeploy-engine.service
@@@ rc=0
@@@ roce
gid rocep1s0f1 0 fe80:0000:0000:0000:0000:0000:0000:0001 IB/RoCE v1
gid rocep1s0f1 1 fe80:0000:0000:0000:0000:0000:0000:0001 RoCE v2
gid rocep1s0f1 2 0000:0000:0000:0000:0000:ffff:c0a8:b10b IB/RoCE v1
gid rocep1s0f1 3 0000:0000:0000:0000:0000:ffff:c0a8:b10b RoCE v2
ndev rocep1s0f1 enp1s0f1np1
@@@ rc=0
"""


def test_parse_gather():
    node = SimpleNamespace(name="spark1", data_ip="192.168.177.11", netdev="enp1s0f1np1", hca=("rocep1s0f1", "x"))
    f = gather.parse_gather(node, OUT)
    assert f.mem_total_bytes == 125000000 * 1024 and f.mem_available_bytes == 121000000 * 1024
    assert f.gpu_name == "NVIDIA GB10" and f.driver == "580.95.05" and f.has_gpu
    assert f.docker_version == "28.3.3" and "sparkdeploy-engine.service" in f.units
    assert f.netdev("enp1s0f1np1").addresses() == ("192.168.177.11",)
    assert [(r.name, r.gid_index) for r in f.roce] == [("rocep1s0f1", 3)]


def test_parse_gather_sim_node():
    node = SimpleNamespace(name="n2", data_ip="172.30.0.12", netdev="eth0", hca=())
    f = gather.parse_gather(node, "@@@ meminfo\nMemTotal: 1000 kB\n@@@ rc=0\n@@@ gpu\n@@@ rc=0\n",
                            mem_available=5)
    assert not f.has_gpu and f.gpu_name is None and f.roce == () and f.mem_available_bytes == 5


def test_parse_gather_reads_every_links_hcas_each_by_its_own_address():
    """A ring node has two links: each HCA's RoCE v2 GID is the one mapping its own link's IPv4 address."""
    from sparkdeploy.model.topology import Link

    links = (Link("enp1s0f1np1", "192.168.177.11", 24, ("rocep1s0f1",)),
             Link("enp1s0f0np0", "192.168.10.1", 24, ("rocep1s0f0",)))
    node = SimpleNamespace(name="spark1", data_links=lambda: links)
    ring = OUT.replace("ndev rocep1s0f1 enp1s0f1np1\n", "ndev rocep1s0f1 enp1s0f1np1\n"
                       "gid rocep1s0f0 4 0000:0000:0000:0000:0000:ffff:c0a8:0a01 RoCE v2\n"
                       "gid rocep1s0f0 5 0000:0000:0000:0000:0000:ffff:c0a8:b10b RoCE v2\n"
                       "ndev rocep1s0f0 enp1s0f0np0\n")
    ring = ring.replace('"prefixlen":24}]}]', '"prefixlen":24}]},{"ifname":"enp1s0f0np0","mtu":9000,"operstate":"UP",'
                                              '"addr_info":[{"family":"inet","local":"192.168.10.1","prefixlen":24}]}]')
    f = gather.parse_gather(node, ring)
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
