"""remote/ssh.py against a real OpenSSH server on loopback, and the local connection."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sparkdeploy.errors import RemoteError
from sparkdeploy.remote import connection
from sparkdeploy.remote import ssh as remote
from tests.support.sshd import sshd  # noqa: F401 - the loopback sshd fixture

NASTY = ["a b", "$(touch /tmp/pwned-sparkdeploy)", "; rm -rf /", "'quote'", '"dq"', "back`tick`", "*", "\\n"]


@pytest.fixture
def known_hosts(tmp_path, sshd):
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[127.0.0.1]:{sshd.port} {sshd.host_pub}\n")
    return kh


def _target(sshd, kh, **kw):
    return connection.Target("n1", "127.0.0.1", port=sshd.port, identity=str(sshd.client_key), local=False,
                         known_hosts=str(kh), **kw)


@pytest.fixture
def ssh(sshd, known_hosts):
    c = remote.connect(_target(sshd, known_hosts))
    yield c
    c.close()


@pytest.fixture
def local():
    return remote.connect(connection.Target("me", "127.0.0.1", local=True))


@pytest.fixture(params=["ssh", "local"])
def conn(request):
    return request.getfixturevalue(request.param)


def test_run_passes_argv_verbatim(conn):
    res = conn.run([sys.executable if conn.name == "me" else "python3", "-c",
                    "import sys, json; print(json.dumps(sys.argv[1:]))", *NASTY])
    import json

    assert json.loads(res.stdout) == NASTY
    assert not os.path.exists("/tmp/pwned-sparkdeploy")


def test_run_reports_exit_and_stderr(conn):
    res = conn.run(["sh", "-c", "echo oops >&2; exit 3"], check=False)
    assert res.rc == 3 and "oops" in res.stderr
    with pytest.raises(RemoteError, match="exited 3: oops"):
        conn.run(["sh", "-c", "echo oops >&2; exit 3"])


@pytest.mark.slow  # several seconds: out of the fast unit run, still in `make test`
def test_run_returns_all_output_of_a_command_that_exits_at_once(ssh):
    # sshd sends the exit status when the child exits; output still in its pipe may follow it. Reading that
    # stopped at the exit status lost the tail in 7 of these 40 runs on a busy host (in CI: a release scan
    # cut short, and prune deleted the release whose line was cut).
    script = "head -c 60000 /dev/zero | tr '\\0' a; echo; echo END"
    cut = [len(r.stdout) for r in (ssh.run(["sh", "-c", script]) for _ in range(40)) if not r.stdout.endswith("a\nEND\n")]
    assert cut == []


def test_run_input_and_timeout(conn):
    assert conn.run(["cat"], input=b"hello\n").stdout == "hello\n"
    with pytest.raises(RemoteError, match="did not finish within 1 s"):
        conn.run(["sleep", "5"], timeout=1)


def test_put_is_atomic_with_mode(conn, tmp_path):
    tmp_path = tmp_path / "d"
    tmp_path.mkdir()
    p = str(tmp_path / "f.env")
    conn.put(p, b"A=1\n", mode=0o600)
    assert open(p, "rb").read() == b"A=1\n"
    assert oct(os.stat(p).st_mode & 0o777) == "0o600"
    conn.put(p, b"A=2\n", mode=0o644, owner="root:root")
    assert open(p, "rb").read() == b"A=2\n" and oct(os.stat(p).st_mode & 0o777) == "0o644"
    assert sorted(os.listdir(tmp_path)) == ["f.env"]  # no temp file left behind
    assert conn.get(p) == b"A=2\n"
    assert conn.get(str(tmp_path / "missing")) is None


def test_put_on_full_disk_leaves_old_file(conn, tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        p = str(mnt / "launch.sh")
        conn.put(p, b"old\n")
        with pytest.raises(RemoteError, match="writing .*launch.sh failed"):
            conn.put(p, b"x" * 200_000)
        assert open(p, "rb").read() == b"old\n"
        assert os.listdir(mnt) == ["launch.sh"]
    finally:
        subprocess.run(["umount", str(mnt)])


def test_unknown_host_key_refused_then_trusted_and_recorded(sshd, tmp_path):
    kh = tmp_path / "kh"
    with pytest.raises(RemoteError, match="--trust-new-hosts"):
        remote.connect(_target(sshd, kh))
    c = remote.connect(_target(sshd, kh), trust_new_hosts=True)
    c.close()
    assert sshd.host_pub.split()[1] in kh.read_text()
    remote.connect(_target(sshd, kh)).close()  # now known


def test_changed_host_key_always_refused(sshd, tmp_path):
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    kh = tmp_path / "kh"
    kh.write_text(f"[127.0.0.1]:{sshd.port} {' '.join(open(str(other) + '.pub').read().split()[:2])}\n")
    with pytest.raises(RemoteError, match="CHANGED"):
        remote.connect(_target(sshd, kh), trust_new_hosts=True)


def test_connection_refused_names_node(tmp_path):
    with pytest.raises(RemoteError, match="^n9: ssh root@127.0.0.1:1"):
        remote.connect(connection.Target("n9", "127.0.0.1", port=1, local=False, known_hosts=str(tmp_path / "k")))


def test_pool_parallel_and_errors(sshd, known_hosts):
    ts = [_target(sshd, known_hosts), connection.Target("bad", "127.0.0.1", port=1, local=False)]
    ts[0] = connection.Target("a", ts[0].host, ts[0].port, identity=ts[0].identity, local=False, known_hosts=ts[0].known_hosts)
    with remote.Pool(ts) as pool:
        errs = pool.open()
        assert list(errs) == ["bad"]
        out = pool.map(lambda c: c.run(["echo", c.name]).stdout.strip())
        assert out == {"a": "a"}


def test_pool_reconnects_a_dropped_session(sshd, known_hosts):
    t = _target(sshd, known_hosts)
    with remote.Pool([t]) as pool:
        assert pool.open() == {}
        pool.conns["n1"].client.get_transport().close()  # the node rebooted / the link dropped
        assert pool.map(lambda c: c.run(["echo", "back"]).stdout.strip()) == {"n1": "back"}
        assert pool.conns["n1"].alive()


@pytest.mark.slow  # several seconds: out of the fast unit run, still in `make test`
def test_registry_tunnel_survives_many_connections_the_server_closes_first(ssh):
    """docker push opens many short connections through the tunnel; some clients hang up first, some servers
    answer and close first. Every answer arrives whole, every hang-up ends, and the SSH session lives on. (The
    CI-seen race, an EOF sent after the server's CLOSE so that OpenSSH dropped the session, needs a loaded
    host's timing and did not reproduce here; image.push_through_tunnel retries over a fresh connection.)"""
    import socket
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from sparkdeploy.ops import registry

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)

    def answer():
        while True:
            try:
                c, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=talk, args=(c,), daemon=True).start()

    def talk(c):
        with c:
            if c.recv(64) == b"":  # a client that connects and hangs up (as docker's probes do)
                return
            c.sendall(b"hello\n")  # answers and closes first


    threading.Thread(target=answer, daemon=True).start()

    def one(i_port: tuple[int, int]) -> bytes:
        i, port = i_port
        with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
            if i % 2:
                return b"hello\n"  # hangs up at once
            s.sendall(b"hi\n")
            got = b""
            while chunk := s.recv(64):
                got += chunk
            return got

    try:
        with registry.tunnel(ssh, "127.0.0.1", server.getsockname()[1]) as opened:
            with ThreadPoolExecutor(8) as pool:
                answers = list(pool.map(one, [(i, opened.port) for i in range(120)]))
        assert answers == [b"hello\n"] * 120
        assert opened.sent == 60 * len(b"hi\n")  # what the far end received: the 60 talkers' greetings
        assert ssh.run(["echo", "still connected"]).stdout.strip() == "still connected"
    finally:
        server.close()
