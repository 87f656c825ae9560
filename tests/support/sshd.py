"""A throwaway OpenSSH server on loopback for testing remote/ssh.py against the real protocol (no docker).

Runs as the current user with its own host key, authorized key and port; stopped by PID. Test modules take the
`sshd` fixture with `from tests.support.sshd import sshd  # noqa: F401`.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def available() -> bool:
    return os.path.exists(SSHD) and shutil.which("ssh-keygen") is not None and os.geteuid() == 0


@dataclass
class Sshd:
    dir: Path
    port: int
    proc: subprocess.Popen
    client_key: Path
    host_pub: str

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(workdir: Path, host_key: Path | None = None, options: tuple[str, ...] = ()) -> Sshd:
    """`options`: more sshd_config lines as `-o` values (e.g. `SetEnv=NAME=VALUE` for every session)."""
    workdir.mkdir(parents=True, exist_ok=True)
    hk = host_key or workdir / "hostkey"
    if not hk.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(hk)], check=True)
    ck = workdir / "client"
    if not ck.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ck)], check=True)
    (workdir / "authorized_keys").write_text((workdir / "client.pub").read_text())
    os.chmod(workdir / "authorized_keys", 0o600)
    Path("/run/sshd").mkdir(exist_ok=True)
    port = _free_port()
    proc = subprocess.Popen(
        [SSHD, "-D", "-e", "-f", "/dev/null", "-h", str(hk), "-p", str(port),
         "-o", "ListenAddress=127.0.0.1", "-o", f"AuthorizedKeysFile={workdir}/authorized_keys",
         "-o", f"PidFile={workdir}/sshd.pid", "-o", "StrictModes=no", "-o", "PermitRootLogin=yes",
         "-o", "PasswordAuthentication=no", "-o", "UsePAM=no", "-o", "MaxSessions=50", "-o", "MaxStartups=50",
         *(arg for o in options for arg in ("-o", o))],
        stdout=subprocess.DEVNULL, stderr=open(workdir / "sshd.log", "ab"),
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    pub = Path(str(hk) + ".pub").read_text().split()
    return Sshd(workdir, port, proc, ck, f"{pub[0]} {pub[1]}")


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    """A running loopback sshd for the module (skipped without openssh-server or root)."""
    if not available():
        pytest.skip("needs /usr/sbin/sshd (openssh-server) and root")
    s = start(tmp_path_factory.mktemp("sshd"))
    yield s
    s.stop()
