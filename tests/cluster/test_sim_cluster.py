"""The simulated cluster itself: SSH by key with host keys checked, systemd, own dockerd, reboot, CLI."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest

pytestmark = pytest.mark.cluster


def _cli(sim_cluster, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "SPARKDEPLOY_SIM_NAME": sim_cluster.name,
           "SPARKDEPLOY_SIM_STATE_DIR": str(sim_cluster.state_dir)}
    return subprocess.run([sys.executable, "-m", "sparkdeploy", "sim", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


def test_ssh_by_key_with_strict_host_key_checking(sim_cluster, tmp_path):
    for node in sim_cluster.nodes:
        done = sim_cluster.ssh(node, "hostname", check=True)
        assert done.out.strip() == node.name
        # The same key against an empty known_hosts must be refused: host keys really are checked.
        empty = tmp_path / "empty_known_hosts"
        empty.write_text("")
        refused = subprocess.run(
            ["ssh", "-i", str(sim_cluster.key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
             "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={empty}", "-o",
             "GlobalKnownHostsFile=/dev/null", f"root@{node.ip}", "true"], capture_output=True, text=True, timeout=30)
        assert refused.returncode == 255 and "Host key verification failed" in refused.stderr
        # And a password login is not offered at all.
        nokey = subprocess.run(
            ["ssh", "-o", "BatchMode=yes", "-o", "PubkeyAuthentication=no", "-o", "StrictHostKeyChecking=yes",
             "-o", f"UserKnownHostsFile={sim_cluster.known_hosts}", f"root@{node.ip}", "true"],
            capture_output=True, text=True, timeout=30)
        assert nokey.returncode == 255


def test_inventory_is_valid_and_names_the_nodes(sim_cluster):
    from sparkdeploy.model import inventory
    from sparkdeploy.remote import ssh as remote

    inv = inventory.load(sim_cluster.inventory)
    assert [n.name for n in inv.nodes] == ["node1", "node2"]
    assert inv.head.name == "node1"
    for node, sim_node in zip(inv.nodes, sim_cluster.nodes):
        assert node.ssh.host == node.data_ip == sim_node.ip
        assert remote.local_path(node.ssh.key) == str(sim_cluster.key)
        assert remote.local_path(node.ssh.known_hosts) == str(sim_cluster.known_hosts)
        assert node.gpu == "none" and node.netdev == "eth0"
    assert inv.profile.name == "sim-tiny"


def test_login_is_a_sudoer_not_root_and_the_inventory_uses_tilde_paths(sim_cluster):
    """As on a DGX Spark: the kit logs in as `nvidia` (sudo without password, not in the docker group) with a key
    the inventory names as `~/.ssh/...`; every command it runs is root through sudo."""
    import yaml

    from sparkdeploy.model import inventory
    from sparkdeploy.remote import ssh as remote
    from sparkdeploy.remote.ssh import target_of

    written = yaml.safe_load(sim_cluster.inventory.read_text())["nodes"][0]["ssh"]
    assert written["user"] == sim_cluster.user == "nvidia"
    assert written["key"] == f"~/.ssh/{sim_cluster.key.name}" and written["known_hosts"].startswith("~/.ssh/")
    inv = inventory.load(sim_cluster.inventory)
    for node in inv.nodes:
        with remote.connect(target_of(node.name, node.ssh)) as conn:
            assert isinstance(conn, remote.SSHConn)
            assert conn.run(["id", "-u"]).stdout.strip() == "0"  # through sudo
            assert conn.run(["docker", "info", "--format", "{{.Name}}"]).stdout.strip() == node.name
            chan = conn.client.get_transport().open_session()  # the login itself, without the kit's sudo
            chan.exec_command("id -un; id -nG")
            login = chan.makefile().read().decode().split("\n")
            assert login[0] == "nvidia" and "sudo" in login[1].split() and "docker" not in login[1].split()
    # No key for root: the sim does not quietly keep the root login the kit used before.
    root = subprocess.run(sim_cluster.cluster.ssh_argv(sim_cluster.head, "true")[:-2] + [f"root@{sim_cluster.head.ip}",
                          "true"], capture_output=True, text=True, timeout=30)
    assert root.returncode == 255 and "Permission denied" in root.stderr


def test_ssh_config_alias_logs_in_as_the_sudoer(sim_cluster, tmp_path, monkeypatch):
    """An inventory that names only a ~/.ssh/config Host alias: HostName, User and IdentityFile come from there."""
    import shutil

    import yaml

    from sparkdeploy.model import inventory
    from sparkdeploy.remote import ssh as remote
    from sparkdeploy.remote.ssh import target_of

    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    shutil.copy(sim_cluster.key, home / ".ssh" / "spark_key")
    os.chmod(home / ".ssh" / "spark_key", 0o600)
    shutil.copy(sim_cluster.known_hosts, home / ".ssh" / "known_hosts")
    aliases = "".join(f"Host spark-{n.name}\n  HostName {n.ip}\n  User {sim_cluster.user}\n"
                      f"  IdentityFile ~/.ssh/spark_key\n" for n in sim_cluster.nodes)
    (home / ".ssh" / "config").write_text(aliases)
    data = yaml.safe_load(sim_cluster.inventory.read_text())
    for node in data["nodes"]:
        node["ssh"] = {"host": f"spark-{node['name']}", "known_hosts": "~/.ssh/known_hosts"}
    # the secret stays where `sim up` wrote it (under the real $HOME): only the SSH side moves to the alias home
    data["auth"] = {"api_key_file": str(inventory.load(sim_cluster.inventory).auth.api_key_file)}
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    inv = inventory.load(path)
    for node, sim_node in zip(inv.nodes, sim_cluster.nodes):
        # paramiko expands the IdentityFile's `~` itself
        assert (node.ssh.host, node.ssh.user, node.ssh.key) == (sim_node.ip, "nvidia", str(home / ".ssh/spark_key"))
        with remote.connect(target_of(node.name, node.ssh)) as conn:
            assert conn.run(["hostname"]).stdout.strip() == sim_node.name


def test_nodes_run_systemd_and_their_own_docker(sim_cluster):
    seen = {}
    for node in sim_cluster.nodes:
        out = sim_cluster.ssh(node, "systemctl is-system-running; cat /etc/machine-id; "
                                    "cat /etc/ssh/ssh_host_ed25519_key.pub; "
                                    "docker info --format '{{.CgroupDriver}} {{.Driver}} {{.Name}}'; "
                                    "ip -4 -o addr show eth0", check=True).out.splitlines()
        assert out[0] == "running"
        assert out[3].split()[:2] == ["systemd", "overlay2"] and out[3].split()[2] == node.name
        assert node.ip in out[4]
        seen[node.name] = (out[1], out[2])
    machine_ids = {v[0] for v in seen.values()}
    host_keys = {v[1] for v in seen.values()}
    assert len(machine_ids) == len(host_keys) == len(sim_cluster.nodes), "nodes must not share identity"


def test_nodes_reach_each_other(sim_cluster):
    head, worker = sim_cluster.head, sim_cluster.worker
    done = sim_cluster.ssh(worker, f"python3 -c \"import socket; s=socket.create_connection(('{head.ip}', 22), 5); "
                                   f"print(s.recv(64).decode().split('-')[0])\"", check=True)
    assert done.out.strip() == "SSH"


def test_reboot_all_brings_systemd_and_enabled_units_back(sim_cluster):
    unit = ("[Unit]\nDescription=sim reboot probe\n[Service]\nType=oneshot\nRemainAfterExit=yes\n"
            "ExecStart=/bin/sh -c 'date +%s.%N > /run/sim-probe'\n[Install]\nWantedBy=multi-user.target\n")
    before = {}
    for node in sim_cluster.nodes:
        sim_cluster.ssh(node, f"printf %s {shlex.quote(unit)} > /etc/systemd/system/sim-probe.service && systemctl daemon-reload "
                              "&& systemctl enable --now sim-probe.service && test -s /run/sim-probe", check=True)
        before[node.name] = sim_cluster.ssh(node, "cat /proc/1/stat", check=True).out
    secs = sim_cluster.cluster.reboot("all")
    assert set(secs) == {n.name for n in sim_cluster.nodes}
    from sparkdeploy.sim.containers import pid1_start_ticks

    for node in sim_cluster.nodes:
        # known_hosts from `sim up` still holds: a reboot keeps the node's host keys.
        out = sim_cluster.ssh(node, "systemctl is-system-running; systemctl is-active sim-probe docker; "
                                    "test -s /run/sim-probe && echo probe; cat /proc/1/stat", check=True).out
        lines = out.splitlines()
        assert lines[0] == "running"
        assert lines[1:3] == ["active", "active"]
        assert lines[3] == "probe"
        assert pid1_start_ticks(lines[4]) > pid1_start_ticks(before[node.name])
        sim_cluster.ssh(node, "systemctl disable --now sim-probe.service; rm -f /etc/systemd/system/sim-probe.service",
                        check=True)


def test_cli_status_json_and_ssh_exit_code(sim_cluster):
    st = _cli(sim_cluster, "status", "--json")
    assert st.returncode == 0, st.stderr
    data = json.loads(st.stdout)
    assert [n["name"] for n in data["nodes"]] == ["node1", "node2"]
    for n in data["nodes"]:
        assert n["container_state"] == "running" and n["ssh"] and n["system"] == "running"
        assert n["docker"] == "active" and n["booted_at"] > 0
    rc = _cli(sim_cluster, "ssh", "node2", "--", "sh", "-c", "echo hi; exit 7")
    assert rc.returncode == 7 and rc.stdout.strip() == "hi"
    assert "exited" not in rc.stderr  # the remote command's code passes through without a message, as with ssh
    missing = _cli(sim_cluster, "ssh", "node9", "--", "true")
    assert missing.returncode == 1 and "node9" in missing.stderr


def test_up_is_idempotent_and_keeps_nodes(sim_cluster):
    from sparkdeploy.sim.containers import pid1_start_ticks

    before = pid1_start_ticks(sim_cluster.ssh(sim_cluster.head, "cat /proc/1/stat", check=True).out)
    up = _cli(sim_cluster, "up", "--nodes", "2", "--no-engine-image", "--inventory", str(sim_cluster.inventory),
              "--json")
    assert up.returncode == 0, up.stderr
    data = json.loads(up.stdout)
    assert [n["ip"] for n in data["nodes"]] == [n.ip for n in sim_cluster.nodes]
    assert "timings" in data and data["total_seconds"] >= 0
    after = pid1_start_ticks(sim_cluster.ssh(sim_cluster.head, "cat /proc/1/stat", check=True).out)
    assert after == before  # the nodes were kept, not restarted


def test_down_removes_its_own_cluster_only(sim_node_image, tmp_path):
    """Clusters whose names share a prefix ("x" and "x-b", as "pytest" and "pytest-quad" of the two test workers)
    live side by side: `down` of one leaves the other's node and its Docker volume alone."""
    import subprocess

    from sparkdeploy.sim.cluster import SimCluster

    one, two = SimCluster("downtest", state_dir=tmp_path / "a"), SimCluster("downtest-b", state_dir=tmp_path / "b")
    try:
        for c in (one, two):
            c.up(1)
        one.down()

        def left(*argv: str) -> list[str]:
            out = subprocess.run(["docker", *argv], capture_output=True, text=True, check=True).stdout.split()
            return [name for name in out if name.startswith("sparkdeploy-sim-downtest")]

        assert left("ps", "-a", "--format", "{{.Names}}") == ["sparkdeploy-sim-downtest-b-node1"]
        assert left("volume", "ls", "--format", "{{.Name}}") == ["sparkdeploy-sim-downtest-b-node1-docker"]
    finally:
        one.down()
        two.down()


def test_nodes_start_out_holding_a_seeded_image_and_each_keeps_its_own(sim_node_image, sim_serving_image, tmp_path):
    """`sim up --with-image` (sparkdeploy.sim.seed): each new node holds the host's image under its ID, by every
    name asked for, and runs it. The nodes share only hard-linked layer files: an image removed on one node stays
    whole on the other. A node kept by a later `up` is not seeded again."""
    import subprocess

    from sparkdeploy.sim import containers
    from sparkdeploy.sim.cluster import SimCluster

    second = "sparkdeploy/seedtest:second-name"
    host_id = subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", sim_serving_image], capture_output=True,
                             text=True, check=True).stdout.strip()
    subprocess.run(["docker", "tag", sim_serving_image, second], check=True)
    env = {**os.environ, "SPARKDEPLOY_SIM_NAME": "seedtest", "SPARKDEPLOY_SIM_STATE_DIR": str(tmp_path)}
    cluster = SimCluster("seedtest", state_dir=tmp_path)
    for node in ("node1", "node2"):  # a run killed inside this test left them: a kept volume is never seeded
        containers.remove_volume(f"{cluster.prefix}-{node}-docker", "docker volume rm")
    try:
        up = subprocess.run([sys.executable, "-m", "sparkdeploy", "sim", "up", "--nodes", "2", "--no-engine-image",
                             "--with-image", sim_serving_image, "--with-image", second, "--json"],
                            capture_output=True, text=True, env=env, timeout=900)
        assert up.returncode == 0, up.stderr[-2000:]
        assert "seed nodes' Docker volumes" in json.loads(up.stdout)["timings"]

        def image_on(node: str, ref: str) -> str:
            """The image ID `ref` names on the node; "" when it names none (any other failure is the test's)."""
            done = cluster.run_on(node, f"docker image inspect -f '{{{{.Id}}}}' {ref}", check=False)
            assert done.rc == 0 or "No such image" in done.err + done.out, f"{node}: {done}"
            return done.out.strip() if done.rc == 0 else ""

        assert {(n, ref): image_on(n, ref) for n in ("node1", "node2") for ref in (sim_serving_image, second)} == \
            {(n, ref): host_id for n in ("node1", "node2") for ref in (sim_serving_image, second)}
        runs = f"docker run --rm --entrypoint /bin/sh {sim_serving_image} -c 'test -x /opt/venv/bin/python && echo ran'"
        assert cluster.run_on("node1", runs, timeout=120).out.strip() == "ran"
        cluster.run_on("node1", f"docker image rm -f {host_id} && docker image prune -f >/dev/null")
        assert image_on("node1", sim_serving_image) == ""
        assert image_on("node2", sim_serving_image) == host_id
        assert cluster.run_on("node2", runs, timeout=120).out.strip() == "ran"
        cluster.up(2, with_images=[sim_serving_image])  # kept nodes, kept volumes: node1 stays without it
        assert image_on("node1", sim_serving_image) == "" and image_on("node2", sim_serving_image) == host_id
    finally:
        cluster.down()
        subprocess.run(["docker", "image", "rm", second], capture_output=True)
