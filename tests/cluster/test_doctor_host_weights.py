"""Host safety on the simulated cluster: doctor (honest verdicts, one planted problem per check), host setup
(twice: the second changes nothing; then earlyoom really kills a bounded memory hog and sshd survives), and
weights sync (moves a fake checkpoint over the data plane, skips it the second time).

One cluster for the whole module, its own (name `hostsafety`, or $SPARKDEPLOY_SIM_HOSTSAFETY_NAME): its network
has MTU 9000 like a CX-7 data plane, and these tests change the nodes (packages, units, mounts, MTU), so they
stay off the session cluster the engine tests use. Memory: the hog allocates 600 MiB inside one node, under an
RLIMIT_AS; earlyoom inside a node can only see and kill that node's processes.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from sparkdeploy.cli import main

DOCTOR_DIR = "/srv/models/doctor"
CKPT_DIR = "/srv/models/fake"


# ------------------------------------------------------------------------------------------------ cluster
class Nodes:
    def __init__(self, cluster, state, inventory: Path):
        self.cluster, self.state, self.inventory = cluster, state, inventory

    def sh(self, node: str, script: str, *, check: bool = True, timeout: float = 120) -> str:
        done = self.cluster.run_on(node, ["sh", "-c", script], timeout=timeout, check=False)
        if check and done.rc != 0:
            raise AssertionError(f"{node}: `{script}` exited {done.rc}: {done.err or done.out}")
        return done.out


@pytest.fixture(scope="module")
def nodes(sim_node_image, tmp_path_factory):
    from sparkdeploy.sim.cluster import SimCluster

    name = os.environ.get("SPARKDEPLOY_SIM_HOSTSAFETY_NAME", "hostsafety")
    state_dir = tmp_path_factory.mktemp("hostsafety")
    cluster = SimCluster(name, state_dir=state_dir)
    cluster.down()
    state = cluster.up(2, inventory=state_dir / "inventory.sim.yaml", mtu=9000)  # jumbo frames, as on a CX-7
    # the sim inventory + a host reserve that fits a small CI machine (the default 28 GiB is a GB10's)
    data = yaml.safe_load(Path(state.inventory).read_text())
    data["memory"] = {"reserve_gib": 1}
    inv = state_dir / "inventory.hostsafety.yaml"
    inv.write_text(yaml.safe_dump(data, sort_keys=False))
    yield Nodes(cluster, state, inv)
    if os.environ.get("SPARKDEPLOY_SIM_KEEP") != "1":
        cluster.down()


def run_cli(capsys, *argv: str) -> tuple[int, dict]:
    capsys.readouterr()
    rc = main(list(argv))
    out = capsys.readouterr().out
    return rc, (json.loads(out) if out.strip() else {})


@pytest.fixture(scope="module")
def host_setup_runs(nodes):
    """`host setup` twice (the module's nodes need it before the doctor checks can be green)."""
    import contextlib
    import io

    outs = []
    for _ in range(2):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = main(["host", "setup", "--inventory", str(nodes.inventory), "--json"])
        outs.append((rc, json.loads(buf.getvalue())))
    return outs


# ------------------------------------------------------------------------------------------------ host setup
def test_host_setup_twice_second_changes_nothing(nodes, host_setup_runs):
    (rc1, first), (rc2, second) = host_setup_runs
    assert rc1 == 0 and not first["failed"], first
    assert first["changes"] >= 6  # packages, earlyoom config + service, sshd drop-in: on both nodes
    assert rc2 == 0 and second["changes"] == 0, second
    for node in ("node1", "node2"):
        st = {i["item"]: i["status"] for i in second["nodes"][node]}
        assert st == {"packages": "ok", "earlyoom-config": "ok", "earlyoom-service": "ok", "sshd-oom": "ok",
                      "netplan": "skipped"}
        assert "--prefer ^(vllm|VLLM|python|ray)" in nodes.sh(node, "tr '\\0' ' ' < /proc/$(pgrep -x earlyoom)/cmdline")
        assert nodes.sh(node, "systemctl show -p OOMScoreAdjust --value ssh").strip() == "-1000"


# ------------------------------------------------------------------------------------------------ doctor
def doctor_run(capsys, nodes, *extra: str) -> tuple[int, dict[tuple[str, str], dict]]:
    rc, rep = run_cli(capsys, "doctor", "--inventory", str(nodes.inventory), "--dir", DOCTOR_DIR, "--json", *extra)
    return rc, {(r["node"], r["check"]): r for r in rep["results"]}


def red(results) -> set[tuple[str, str]]:
    return {k for k, r in results.items() if r["status"] in ("failed", "warn")}


def test_doctor_baseline_is_honest(nodes, host_setup_runs, capsys):
    rc, res = doctor_run(capsys, nodes)
    assert rc == 0, {k: r["reason"] for k, r in res.items() if k in red(res)}
    assert not red(res)
    checks = {c for _, c in res}
    assert checks == {"ssh", "gpu", "gpu-clocks", "kernel", "kernel-modules", "roce-twins", "mtu", "roce-gid",
                      "earlyoom", "sshd-oom", "disk", "docker", "gpu-processes", "stale-units", "memory", "timesync",
                      "driver-match", "data-plane-reach", "roce-gid-plan", "data-plane-bandwidth", "clock-skew",
                      "nccl-library", "api-key"}
    assert res[("cluster", "api-key")]["status"] == "ok"  # the sim inventory names a 0600 key, as users should
    for node in ("node1", "node2"):
        for check in ("gpu", "gpu-clocks", "gpu-processes", "roce-twins", "roce-gid"):
            assert res[(node, check)]["status"] == "skipped"
        # the sim shares the host's kernel: said, not judged
        assert res[(node, "kernel-modules")]["status"] == "skipped"
        assert "host's" in res[(node, "kernel-modules")]["reason"]
        assert res[(node, "mtu")]["status"] == "ok" and "mtu 9000" in res[(node, "mtu")]["reason"]
        assert res[(node, "earlyoom")]["status"] == "ok"
        # nothing deployed on these nodes: the image whose NCCL it would report is not there (test_services.py
        # reads it where it is)
        assert res[(node, "nccl-library")]["status"] == "skipped" and "not on the node yet" in \
            res[(node, "nccl-library")]["reason"]
    assert res[("cluster", "data-plane-reach")]["status"] == "ok"
    assert "node1 eth0 -> node2 eth0" in res[("cluster", "data-plane-bandwidth")]["reason"]
    assert "by construction" in res[("cluster", "clock-skew")]["reason"]


PLANTS = {
    "earlyoom": ("systemctl stop earlyoom", "systemctl start earlyoom", "node2", "earlyoom", "enable --now earlyoom"),
    "mtu": ("ip link set eth0 mtu 1500", "ip link set eth0 mtu 9000", "node2", "mtu", "mtu: 9000"),
    "stale-unit": (
        "printf '[Unit]\\nDescription=old vLLM stack\\n[Service]\\nExecStart=/usr/bin/docker run --name vllm "
        "vllm/vllm-openai:latest --port 8000\\n[Install]\\nWantedBy=multi-user.target\\n' "
        "> /etc/systemd/system/old-vllm.service && systemctl daemon-reload && systemctl enable -q old-vllm.service",
        "systemctl disable -q old-vllm.service; rm -f /etc/systemd/system/old-vllm.service; systemctl daemon-reload",
        "node2", "stale-units", "systemctl disable --now old-vllm.service"),
    "disk-full": (
        f"mkdir -p {DOCTOR_DIR} && mount -t tmpfs -o size=1m tmpfs {DOCTOR_DIR} && "
        f"head -c 1000000 /dev/zero > {DOCTOR_DIR}/fill || true",
        f"umount {DOCTOR_DIR}; rmdir {DOCTOR_DIR}", "node2", "disk", "free space"),
    # doctor reads the kernel as `uname -r` in its SSH session: a `uname` earlier on PATH answers a build on
    # deploy/host/bad-kernels.yaml (the sim shares the host's kernel, which we cannot swap)
    "bad-kernel": (
        "printf '#!/bin/sh\\n[ \"$1\" = -r ] && exec echo 7.0.0-1019-nvidia\\nexec /usr/bin/uname \"$@\"\\n' "
        "> /usr/local/bin/uname && chmod +x /usr/local/bin/uname",
        "rm -f /usr/local/bin/uname", "node2", "kernel", "apt-mark hold linux-image-6.17.0-1032-nvidia"),
}


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_doctor_planted_problem_turns_exactly_that_check_red(nodes, host_setup_runs, capsys, plant):
    do, undo, node, check, fix = PLANTS[plant]
    nodes.sh(node, do)
    try:
        rc, res = doctor_run(capsys, nodes)
    finally:
        nodes.sh(node, undo, check=False)
    assert rc == 1, {k: (r["status"], r["reason"]) for k, r in res.items() if k[0] == node}
    assert red(res) == {(node, check)}, {k: res[k]["reason"] for k in red(res)}
    assert res[(node, check)]["status"] == "failed" and fix in res[(node, check)]["fix"]


#: A test double for a GB10's nvidia-smi (the GPU we cannot run): it answers the three queries doctor sends
#: (probes.SECTIONS gpu, gpu_procs, gpu_clocks) in the driver's csv shape; the clocks line comes from CLOCKS_FILE.
CLOCKS_FILE = "/etc/sparkdeploy-fake-gpu-clocks"
FAKE_NVIDIA_SMI = f"""#!/bin/sh
case "$*" in
  *--query-gpu=name,driver_version*) echo 'NVIDIA GB10, 580.95.05' ;;
  *--query-compute-apps=*) ;;
  *--query-gpu=clocks.sm,*) cat {CLOCKS_FILE} ;;
  *) echo "fake nvidia-smi: no answer for: $*" >&2; exit 2 ;;
esac
"""
#: clocks.sm, clocks.max.sm, utilization.gpu, temperature.gpu, hw / sw thermal slowdown (csv,noheader,nounits)
GPU_CLOCKS = {
    "healthy": "2405, 3003, 96, 61, Not Active, Not Active",
    "stuck-702": "702, 3003, 97, 52, Not Active, Not Active",  # the low-power state, seen under load
    "thermal": "1310, 3003, 98, 94, Active, Not Active",
}
GB10_CHECKS = {"gpu", "gpu-clocks", "gpu-processes", "driver-match"}


def gb10_inventory(nodes, path: Path) -> Path:
    """The module's inventory as two GB10s (gpu: gb10 on every node: the loader refuses a mix) with a GB10
    profile and image, for the fake nvidia-smi to answer."""
    data = yaml.safe_load(nodes.inventory.read_text())
    for node in data["nodes"]:
        node["gpu"] = "gb10"
    data.pop("vocab", None)
    data.update(profile="qwen3.5-35b-a3b-fp8-tp2", patches={**data["patches"], "shortlist": False},
                image={"base": "nvcr.io/nvidia/vllm@sha256:" + "3f1c7a9e5b2d8c4f6a0e9b7d5c3a1f8e" * 2,
                       "vllm_version": "0.34.0", "repository": "sparkdeploy/serving"})
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_doctor_reports_a_stuck_clock_and_thermal_slowdown_from_a_fake_gb10(nodes, host_setup_runs, capsys,
                                                                              tmp_path):
    """Both nodes get the fake nvidia-smi (node2's planted). A GB10 inventory also turns on checks the sim cannot
    pass (docker's nvidia runtime, a 35 GB checkpoint's disk and memory): whatever doctor finds red with both
    GPUs healthy is the baseline, and each planted state on node2 adds exactly its gpu-clocks, with the fix."""
    inv = gb10_inventory(nodes, tmp_path / "inventory.gb10.yaml")
    seen = {}
    try:
        for node in ("node1", "node2"):
            done = subprocess.run(nodes.cluster.ssh_argv(nodes.state.node(node), "cat > /usr/local/bin/nvidia-smi"),
                                  input=FAKE_NVIDIA_SMI.encode(), capture_output=True, timeout=30)
            assert done.returncode == 0, done.stderr
            nodes.sh(node, f"chmod +x /usr/local/bin/nvidia-smi && echo '{GPU_CLOCKS['healthy']}' > {CLOCKS_FILE}")
        for state in ("healthy", "stuck-702", "thermal"):
            nodes.sh("node2", f"echo '{GPU_CLOCKS[state]}' > {CLOCKS_FILE}")
            rc, rep = run_cli(capsys, "doctor", "--inventory", str(inv), "--dir", DOCTOR_DIR, "--json")
            assert "results" in rep, (rc, rep)
            seen[state] = (rc, {(r["node"], r["check"]): r for r in rep["results"]})
    finally:
        for node in ("node1", "node2"):
            nodes.sh(node, f"rm -f /usr/local/bin/nvidia-smi {CLOCKS_FILE}", check=False)
    _, healthy = seen["healthy"]
    for node in ("node1", "node2"):
        assert healthy[(node, "gpu")]["status"] == "ok" and "580.95.05" in healthy[(node, "gpu")]["reason"]
        assert healthy[(node, "gpu-clocks")]["status"] == "ok", healthy[(node, "gpu-clocks")]
        assert healthy[(node, "gpu-processes")]["status"] == "ok", healthy[(node, "gpu-processes")]
    assert healthy[("cluster", "driver-match")]["status"] == "ok"
    baseline = red(healthy)
    assert not {check for _, check in baseline} & GB10_CHECKS, {k: healthy[k]["reason"] for k in baseline}
    for state, (reason, fix) in {"stuck-702": ("SM 702 MHz at 97 % busy", "remove AC power"),
                                 "thermal": ("hardware thermal slowdown active", "nvidia-smi -lgc")}.items():
        rc, res = seen[state]
        assert rc == 1 and red(res) == baseline | {("node2", "gpu-clocks")}, {k: res[k]["reason"] for k in red(res)}
        clocks = res[("node2", "gpu-clocks")]
        assert clocks["status"] == "failed" and reason in clocks["reason"] and fix in clocks["fix"], clocks


def test_doctor_names_a_slow_data_plane_pair(nodes, host_setup_runs, capsys):
    """node1's data-plane port held to 100 Mbit/s (tc tbf on its egress, the direction node1 -> node2 streams):
    only the pair's bandwidth turns red, a failure naming the ports against the veth's negotiated 10G."""
    nodes.sh("node1", "tc qdisc add dev eth0 root tbf rate 100mbit burst 64kb latency 50ms")
    try:
        rc, res = doctor_run(capsys, nodes)
    finally:
        nodes.sh("node1", "tc qdisc del dev eth0 root", check=False)
    assert red(res) == {("cluster", "data-plane-bandwidth")}, {k: res[k]["reason"] for k in red(res)}
    slow = res[("cluster", "data-plane-bandwidth")]
    assert slow["status"] == "failed" and "node1 eth0 -> node2 eth0: 0." in slow["reason"]
    assert "negotiated at 10 Gbit/s" in slow["reason"] and "tc" in slow["fix"] and rc == 1


def test_doctor_driver_mismatch_from_facts_file(nodes, host_setup_runs, capsys, tmp_path):
    facts = tmp_path / "facts.yaml"
    facts.write_text(yaml.safe_dump({"nodes": {
        "node1": {"mem_total_gib": 24, "gpu_name": "NVIDIA GB10", "driver": "580.95.05"},
        "node2": {"mem_total_gib": 24, "gpu_name": "NVIDIA GB10", "driver": "590.44.01"}}}))
    rc, res = doctor_run(capsys, nodes, "--facts", str(facts))
    assert rc == 1 and red(res) == {("cluster", "driver-match")}
    r = res[("cluster", "driver-match")]
    assert "node1 580.95.05" in r["reason"] and "node2 590.44.01" in r["reason"] and "same driver" in r["fix"]
    assert res[("node1", "gpu")]["status"] == "skipped"  # a facts file does not invent a GPU


# ------------------------------------------------------------------------------------------------ earlyoom
HOG = b"""
import resource, time
N = 600 << 20
resource.setrlimit(resource.RLIMIT_AS, (N + (400 << 20), N + (400 << 20)))
b = bytearray(N)
for i in range(0, N, 4096):
    b[i] = 1
open("/run/sparkdeploy-hog.ready", "w").write("1")
time.sleep(600)
"""


def test_earlyoom_kills_a_bounded_hog_and_sshd_survives(nodes, host_setup_runs, capsys):
    """earlyoom (as host setup configured it: prefer python, avoid sshd...) with a test threshold set between
    MemAvailable with and without a 600 MiB hog, so the hog is what tips it; then host setup restores the config."""
    node = "node2"
    done = subprocess.run(nodes.cluster.ssh_argv(nodes.state.node(node), "cat > /root/sparkdeploy-hog.py"),
                          input=HOG, capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr
    sshd_before = nodes.sh(node, "systemctl show -p MainPID --value ssh").strip()
    since = nodes.sh(node, "date '+%Y-%m-%d %H:%M:%S'").strip()
    killed = False
    try:
        for attempt in range(3):  # other load on the host moves MemAvailable: re-aim the threshold if it missed
            pid = nodes.sh(node, "rm -f /run/sparkdeploy-hog.ready; systemctl reset-failed sparkdeploy-hog 2>/dev/null; "
                                 "systemd-run -q --unit sparkdeploy-hog --collect python3 /root/sparkdeploy-hog.py; "
                                 "for i in $(seq 150); do [ -e /run/sparkdeploy-hog.ready ] && "
                                 "{ systemctl show -p MainPID --value sparkdeploy-hog; exit 0; }; sleep 0.2; done; exit 1"
                           ).strip()
            assert pid.isdigit() and int(pid) > 1, pid
            # threshold: MemAvailable now (hog resident) + 15% of the hog, as a % of MemTotal: the hog's exit
            # lifts MemAvailable 85% of the hog above it; a miss (the host freed memory meanwhile) just retries
            nodes.sh(node, "T=$(awk '/MemTotal/{t=$2}/MemAvailable/{a=$2}END{printf \"%.2f\", (a+90*1024)/t*100}' "
                           "/proc/meminfo); sed -i -E \"s/-m [0-9.,]+/-m $T/; s/-r [0-9]+/-r 1/\" /etc/default/earlyoom; "
                           "systemctl restart earlyoom")
            # earlyoom is stopped the moment the hog is gone: with this threshold, a dip in the host's memory
            # from other work could otherwise make it pick a second victim
            state = nodes.sh(node, f"pid={pid}; i=0; "
                                   "while kill -0 $pid 2>/dev/null && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; "
                                   "kill -0 $pid 2>/dev/null && echo active || { systemctl stop earlyoom; echo gone; }"
                             ).strip()
            if state != "active":
                killed = True
                break
            nodes.sh(node, "systemctl stop earlyoom sparkdeploy-hog", check=False)
        log = nodes.sh(node, f"journalctl -u earlyoom --since '{since}' --no-pager")
    finally:
        nodes.sh(node, "systemctl stop earlyoom sparkdeploy-hog 2>/dev/null; rm -f /root/sparkdeploy-hog.py",
                 check=False)
    assert killed, log[-2000:]
    victims = [line for line in log.splitlines() if "sending SIG" in line and " to process " in line]
    # the hog goes first (prefer python, largest RSS); the avoided lifelines never
    assert victims and '"python3"' in victims[0] and "VmRSS 6" in victims[0], victims
    assert not any(f'"{p}' in v for v in victims for p in ("sshd", "dockerd", "containerd", "systemd")), victims
    assert nodes.sh(node, "systemctl show -p MainPID --value ssh").strip() == sshd_before  # sshd survived
    assert nodes.sh(node, "systemctl is-active docker containerd").split() == ["active", "active"]
    # host setup puts the kit's thresholds back (drift repaired), and then has nothing left to do
    rc, rep = run_cli(capsys, "host", "setup", "--inventory", str(nodes.inventory), "--json")
    assert rc == 0 and {i["item"] for i in rep["nodes"][node] if i["status"] == "changed"} == \
        {"earlyoom-config", "earlyoom-service"}
    assert nodes.sh(node, "systemctl is-active earlyoom").strip() == "active"
    rc, rep = run_cli(capsys, "host", "setup", "--inventory", str(nodes.inventory), "--json")
    assert rc == 0 and rep["changes"] == 0


# ------------------------------------------------------------------------------------------------ weights
def test_weights_sync_moves_then_skips_then_sends_only_the_change(nodes, host_setup_runs, capsys):
    nodes.sh("node1", f"mkdir -p {CKPT_DIR} && for i in 1 2 3; do head -c 100000000 /dev/urandom "
                      f"> {CKPT_DIR}/model-0000$i-of-00003.safetensors; done && echo '{{}}' > {CKPT_DIR}/config.json",
             timeout=300)
    base = ["--inventory", str(nodes.inventory), "--dir", CKPT_DIR, "--json"]
    rc, dry = run_cli(capsys, "weights", "sync", *base, "--dry-run")
    assert rc == 0 and dry["nodes"][0]["status"] == "would change" and dry["nodes"][0]["files"] == 4
    rc, first = run_cli(capsys, "weights", "sync", *base, "--streams", "3")
    r = first["nodes"][0]
    assert rc == 0 and (r["node"], r["status"], r["files"], r["bytes"]) == ("node2", "changed", 4, 300000003)
    assert r["streams"] == 3  # 4 files over 3 parallel rsync streams
    same = "cd %s && sha256sum $(ls) " % CKPT_DIR
    assert nodes.sh("node1", same) == nodes.sh("node2", same)
    assert "sparkdeploy-weights" not in nodes.sh("node2", "cat /root/.ssh/authorized_keys")  # one-time key gone
    rc, second = run_cli(capsys, "weights", "sync", *base)
    assert rc == 0 and second["nodes"][0]["status"] == "ok"
    # the skip, too, leaves no key behind: not authorized on the worker, no key directory on the head
    assert "sparkdeploy-weights" not in nodes.sh("node2", "cat /root/.ssh/authorized_keys")
    assert nodes.sh("node1", "ls -d /tmp/sparkdeploy-sync-* 2>/dev/null; true").strip() == ""
    # one shard damaged on the worker (same size, other bytes): only that file goes again
    nodes.sh("node2", f"printf 'X' | dd of={CKPT_DIR}/model-00002-of-00003.safetensors bs=1 seek=5 conv=notrunc "
                      "status=none; touch -d '2001-01-01' " + f"{CKPT_DIR}/model-00002-of-00003.safetensors")
    rc, third = run_cli(capsys, "weights", "sync", *base)
    assert rc == 0 and (third["nodes"][0]["status"], third["nodes"][0]["files"], third["nodes"][0]["streams"]) == (
        "changed", 1, 1)
    assert nodes.sh("node1", same) == nodes.sh("node2", same)
    # eviction: the page cache of the checkpoint is dropped on every node, then the guard judges memory
    nodes.sh("node2", f"cat {CKPT_DIR}/* > /dev/null")
    rc, ev = run_cli(capsys, "weights", "evict", *base)
    assert rc == 0, ev
    n2 = ev["nodes"]["node2"]
    assert n2["files"] == 4 and n2["bytes"] == 300000003
    if n2["cached_before"] is not None:
        assert n2["cached_before"] > 200_000_000 and n2["cached_after"] < 10_000_000
    assert {g["status"] for g in ev["guard"]} <= {"ok", "warn"}
