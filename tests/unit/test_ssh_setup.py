"""SSH as a user's own machine is set up: `~` and `$HOME` key paths, ~/.ssh/config Host aliases, the ssh-agent,
ProxyJump. Against a real OpenSSH server on loopback; HOME points at a temporary home for each test."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from sparkdeploy.errors import RemoteError
from sparkdeploy.model import inventory
from sparkdeploy.remote import connection
from sparkdeploy.remote import ssh as remote
from sparkdeploy.remote.ssh import target_of
from tests.support.sshd import sshd  # noqa: F401 - the loopback sshd fixture

SIM_INVENTORY = Path(__file__).parent / "fixtures" / "inventory.sim.yaml"
VOCAB = Path(__file__).parent / "fixtures" / "vocab-1k.txt"


@pytest.fixture
def home(tmp_path, monkeypatch, sshd):
    """A home with the client key in ~/.ssh and the server's host key in ~/.ssh/known_hosts; no agent."""
    h = tmp_path / "home"
    (h / ".ssh").mkdir(parents=True, mode=0o700)
    shutil.copy(sshd.client_key, h / ".ssh" / "id_test")
    os.chmod(h / ".ssh" / "id_test", 0o600)
    (h / ".ssh" / "known_hosts").write_text(f"[127.0.0.1]:{sshd.port} {sshd.host_pub}\n")
    monkeypatch.setenv("HOME", str(h))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return h


def _inventory(tmp_path: Path, ssh: dict) -> inventory.Inventory:
    """The sim fixture inventory with every node's ssh block replaced (one node per host:port must differ)."""
    data = yaml.safe_load(SIM_INVENTORY.read_text())
    data["vocab"] = str(VOCAB)
    for i, node in enumerate(data["nodes"]):
        node["ssh"] = {**ssh, "port": 1} if i else dict(ssh)
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    return inventory.load(path)


def _whoami(node) -> str:
    with remote.connect(target_of(node.name, node.ssh)) as c:
        assert isinstance(c, remote.SSHConn)
        return c.run(["id", "-un"]).stdout.strip()


def test_tilde_key_and_known_hosts_paths_from_the_inventory(home, sshd, tmp_path):
    # The shipped inventory's form: paramiko got the literal '~/.ssh/id_ed25519' ([Errno 2]) before.
    inv = _inventory(tmp_path, {"host": "127.0.0.1", "port": sshd.port, "key": "~/.ssh/id_test",
                                "known_hosts": "~/.ssh/known_hosts"})
    head = inv.nodes[0]
    assert (head.ssh.key, head.ssh.known_hosts) == ("~/.ssh/id_test", "~/.ssh/known_hosts")  # expanded at connect
    assert _whoami(head) == "root"


def test_dollar_home_key_path_reaches_paramiko_expanded(home, sshd):
    t = connection.Target("n1", "127.0.0.1", port=sshd.port, identity="$HOME/.ssh/id_test", local=False,
                      known_hosts="${HOME}/.ssh/known_hosts")
    with remote.connect(t) as c:
        assert c.run(["echo", "ok"]).stdout == "ok\n"


def test_ssh_config_host_alias_gives_hostname_user_port_and_key(home, sshd, tmp_path):
    (home / ".ssh" / "config").write_text(
        f"Host spark1\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User root\n  IdentityFile ~/.ssh/id_test\n")
    inv = _inventory(tmp_path, {"host": "spark1", "known_hosts": "~/.ssh/known_hosts"})
    head = inv.nodes[0]
    assert (head.ssh.host, head.ssh.port, head.ssh.user) == ("127.0.0.1", sshd.port, "root")
    assert remote.local_path(head.ssh.key) == str(home / ".ssh" / "id_test")
    assert _whoami(head) == "root"


def test_inventory_values_win_over_ssh_config(home, sshd, tmp_path):
    (home / ".ssh" / "config").write_text("Host 127.0.0.1\n  Port 1\n  User nobody\n")
    inv = _inventory(tmp_path, {"host": "127.0.0.1", "port": sshd.port, "user": "root", "key": "~/.ssh/id_test"})
    assert (inv.nodes[0].ssh.port, inv.nodes[0].ssh.user) == (sshd.port, "root")


@pytest.fixture
def agent(home, monkeypatch, tmp_path):
    """An ssh-agent holding the client key; the private key file is then removed from ~/.ssh."""
    sock = tmp_path / "agent.sock"
    out = subprocess.run(["ssh-agent", "-a", str(sock), "-s"], capture_output=True, text=True, check=True).stdout
    pid = int(out.split("SSH_AGENT_PID=")[1].split(";")[0])
    monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
    key = home / ".ssh" / "id_test"
    subprocess.run(["ssh-add", "-q", str(key)], check=True, capture_output=True)
    subprocess.run(["ssh-keygen", "-y", "-f", str(key)], check=True, stdout=open(str(key) + ".pub", "w"))
    key.unlink()
    yield sock
    os.kill(pid, signal.SIGTERM)


def test_agent_key_with_no_key_given(agent, sshd):
    t = connection.Target("n1", "127.0.0.1", port=sshd.port, local=False, known_hosts="~/.ssh/known_hosts")
    with remote.connect(t) as c:
        assert c.run(["echo", "agent"]).stdout == "agent\n"


def test_agent_key_when_the_key_given_is_its_public_half(agent, sshd):
    t = connection.Target("n1", "127.0.0.1", port=sshd.port, identity="~/.ssh/id_test.pub", local=False,
                      known_hosts="~/.ssh/known_hosts")
    with remote.connect(t) as c:
        assert c.run(["echo", "agent"]).stdout == "agent\n"


def test_missing_key_without_agent_names_the_key(home, sshd):
    t = connection.Target("n1", "127.0.0.1", port=sshd.port, identity="~/.ssh/id_nope", local=False,
                      known_hosts="~/.ssh/known_hosts")
    with pytest.raises(RemoteError, match=r"^n1: ssh key ~/.ssh/id_nope \(.*/home/.ssh/id_nope\) does not exist"):
        remote.connect(t)


def test_proxy_jump_from_ssh_config(home, sshd, tmp_path):
    # The jump host is the same sshd: the node is reached through a direct-tcpip channel opened on it.
    (home / ".ssh" / "config").write_text(
        f"Host bastion\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User root\n  IdentityFile ~/.ssh/id_test\n"
        f"Host spark2\n  HostName 127.0.0.1\n  Port {sshd.port}\n  ProxyJump bastion\n")
    inv = _inventory(tmp_path, {"host": "spark2", "key": "~/.ssh/id_test", "known_hosts": "~/.ssh/known_hosts"})
    head = inv.nodes[0]
    assert head.ssh.proxy_jump == "bastion"
    with remote.connect(target_of(head.name, head.ssh)) as c:
        assert c.jump is not None
        peer = c.run(["sh", "-c", "echo ${SSH_CLIENT%% *}"]).stdout.strip()
        assert peer == "127.0.0.1" and c.run(["id", "-un"]).stdout.strip() == "root"


def test_only_loopback_as_the_kit_user_runs_locally(monkeypatch):
    import getpass

    me = getpass.getuser()
    assert isinstance(remote.connect(connection.Target("a", "127.0.0.1", user=me)), remote.LocalConn)
    assert isinstance(remote.connect(connection.Target("a", "localhost", user=me)), remote.LocalConn)
    # A loopback login as another user or on another port, and any other address of this machine, go over SSH
    # (host key checked); nothing listens on port 1 or (in the test) 22 for them, so the attempt shows it.
    assert not remote.is_local(connection.Target("b", "127.0.0.1", user="nvidia"))
    assert not remote.is_local(connection.Target("c", _own_lan_address() or "192.0.2.7", user=me))
    for target in (connection.Target("d", "127.0.0.1", port=1, user=me), connection.Target("e", "localhost", port=1)):
        assert not remote.is_local(target)
        with pytest.raises(RemoteError, match="ssh .*:1"):
            remote.connect(target)


def _own_lan_address() -> str | None:
    import psutil

    return next((a.address for addrs in psutil.net_if_addrs().values() for a in addrs
                 if a.family.name == "AF_INET" and not a.address.startswith("127.")), None)
