"""Connections to nodes: run argv lists, upload files atomically, stream bytes between nodes, in parallel.

Every command is an argv list joined with `shlex.join`, so no inventory value ever reaches a remote shell
unquoted. A login other than root runs every command through passwordless `sudo -n --` (DGX OS: the user made
at first boot). Only `localhost` or a loopback address with the user running the kit gets a `LocalConn`
(subprocess, no SSH to self); every other node, this machine's own LAN address included, gets an `SSHConn`
(paramiko) with host-key verification on: unknown keys are refused unless `trust_new_hosts` is set, in which
case they are accepted and recorded in the kit's known_hosts file. Changed keys are always refused.

SSH as OpenSSH does it: `~`/`$HOME` in key and known_hosts paths, the ssh-agent (with or without a key file),
and `~/.ssh/config` (HostName, User, Port, IdentityFile, ProxyJump) through `paramiko.SSHConfig`.

What a connection is (`Conn`, `Target`, the effects recorder) is in `connection`; byte streams in `streams`.
"""

from __future__ import annotations

import getpass
import ipaddress
import os
import select
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence, TypeVar

import paramiko

from sparkdeploy import poll
from sparkdeploy.errors import RemoteError
from sparkdeploy.fanout import parallel
from sparkdeploy.model.sshconfig import local_path, ssh_config
from sparkdeploy.remote.connection import CHUNK, Conn, Proc, Result, Target

T = TypeVar("T")

CONNECT_TIMEOUT = 10.0


def default_known_hosts() -> Path:
    return Path(local_path(os.environ.get("SPARKDEPLOY_KNOWN_HOSTS", "~/.config/sparkdeploy/known_hosts")))


def target_of(name: str, ssh) -> Target:
    """The SSH target of an inventory node (its `ssh:` block)."""
    return Target(name, ssh.host, port=ssh.port, user=ssh.user, identity=ssh.key and str(ssh.key),
                  known_hosts=ssh.known_hosts and str(ssh.known_hosts), proxy_jump=ssh.proxy_jump)


def is_local(target: Target) -> bool:
    """Run without SSH only when asked (`local=True`) or for `localhost`/a loopback literal on port 22, as the kit's
    own user and with no ProxyJump.

    A LAN address or host name of this machine still goes over SSH, so its host key is checked like any node's
    and the inventory's user (with sudo) is the one that acts; so does another port on loopback (a tunnel, a
    container's sshd).
    """
    if target.local is not None:
        return target.local
    if target.port != 22 or target.proxy_jump:
        return False
    if target.host != "localhost":
        try:
            if not ipaddress.ip_address(target.host).is_loopback:
                return False
        except ValueError:
            return False
    return target.user == getpass.getuser()


# --------------------------------------------------------------------------------------------- local
class _LocalProc(Proc):
    def __init__(self, argv: Sequence[str]):
        self.p = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self._err = b""
        self._t = threading.Thread(target=self._drain_err, daemon=True)
        self._t.start()

    def _drain_err(self):
        self._err = self.p.stderr.read()

    def write(self, data: bytes) -> None:
        self.p.stdin.write(data)

    def read(self, n: int = CHUNK) -> bytes:
        return self.p.stdout.read1(n) if hasattr(self.p.stdout, "read1") else self.p.stdout.read(n)

    def close_stdin(self) -> None:
        try:
            self.p.stdin.close()
        except BrokenPipeError:
            pass

    def wait(self, timeout: float | None = None) -> tuple[int, str]:
        rc = self.p.wait(timeout)
        self._t.join(5)
        return rc, self._err.decode(errors="replace")

    def kill(self) -> None:
        self.p.kill()


class LocalConn(Conn):
    """This machine: subprocess for commands (no SSH to self); files through the same commands."""

    def __init__(self, target: Target):
        self.target = target

    def _run(self, argv, *, timeout, check, input) -> Result:
        try:
            p = subprocess.run([*self.target.sudo, *argv], input=input, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise RemoteError(f"`{shlex.join(argv)}` did not finish within {timeout:.0f} s", node=self.name) from None
        except FileNotFoundError as err:
            res = Result(argv, 127, "", str(err), self.name)
            return res.check() if check else res
        res = Result(argv, p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace"), self.name)
        return res.check() if check else res

    def popen(self, argv) -> Proc:
        return _LocalProc([*self.target.sudo, *(str(a) for a in argv)])


# ----------------------------------------------------------------------------------------------- ssh
class _TrustNewPolicy(paramiko.MissingHostKeyPolicy):
    """Accept an unknown host key and record it; a changed key is never reached here (paramiko raises)."""

    def __init__(self, path: Path):
        self.path = path

    def missing_host_key(self, client, hostname, key):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        with _KH_LOCK, open(self.path, "a") as f:
            f.write(line)
        client.get_host_keys().add(hostname, key.get_name(), key)


class _RefusePolicy(paramiko.MissingHostKeyPolicy):
    def __init__(self, path: Path):
        self.path = path

    def missing_host_key(self, client, hostname, key):
        raise RemoteError(
            f"host key of {hostname} ({key.get_name()}) is not in {self.path} or ~/.ssh/known_hosts; "
            "check it and re-run with --trust-new-hosts to record it",
            node=hostname,
        )


_KH_LOCK = threading.Lock()


class _ChanProc(Proc):
    def __init__(self, chan: paramiko.Channel):
        self.chan = chan

    def write(self, data: bytes) -> None:
        self.chan.sendall(data)

    def read(self, n: int = CHUNK) -> bytes:
        return self.chan.recv(n)

    def close_stdin(self) -> None:
        self.chan.shutdown_write()

    def wait(self, timeout: float | None = None) -> tuple[int, str]:
        deadline = None if timeout is None else time.monotonic() + timeout
        err = bytearray()
        while not (self.chan.exit_status_ready() and (self.chan.eof_received or self.chan.closed)):
            if self.chan.recv_stderr_ready():
                err += self.chan.recv_stderr(CHUNK)
            elif self.chan.recv_ready():
                self.chan.recv(CHUNK)
            else:
                time.sleep(0.02)
            if deadline and time.monotonic() > deadline:
                raise TimeoutError("remote command did not exit")
        while self.chan.recv_stderr_ready():
            err += self.chan.recv_stderr(CHUNK)
        rc = self.chan.recv_exit_status()
        self.chan.close()
        return rc, err.decode(errors="replace")

    def kill(self) -> None:
        self.chan.close()


def _key_files(target: Target) -> list[str]:
    """The target's key files that exist, `~`/`$VAR` expanded. A missing one is an error unless an ssh-agent
    runs (it may hold the key: `key: ~/.ssh/id_ed25519.pub` with the private half only in the agent)."""
    given = [target.identity] if isinstance(target.identity, str) else list(target.identity or ())
    found = [local_path(k) for k in given if os.path.isfile(local_path(k))]
    missing = [k for k in given if not os.path.isfile(local_path(k))]
    if missing and not found and not os.environ.get("SSH_AUTH_SOCK"):
        raise RemoteError(f"ssh key {missing[0]} ({local_path(missing[0])}) does not exist and no ssh-agent runs "
                          "(SSH_AUTH_SOCK unset); fix the node's ssh.key", node=target.name)
    return found


def _jump_target(target: Target) -> Target:
    """The target's ProxyJump hop `[user@]host[:port]` (the first of a list) as ~/.ssh/config resolves it; its
    host key is checked against the target's known_hosts."""
    hop = target.proxy_jump.split(",")[0].strip()
    user, _, hostport = hop.rpartition("@")
    host, _, port = hostport.partition(":")
    cfg = ssh_config(host)
    return Target(f"{target.name} (ProxyJump {hop})", cfg["hostname"], port=int(port or cfg.get("port", 22)),
                  user=user or cfg.get("user") or getpass.getuser(), identity=tuple(cfg.get("identityfile", ())),
                  known_hosts=target.known_hosts)


class SSHConn(Conn):
    """A node over SSH (paramiko). Host keys: the kit's known_hosts file plus ~/.ssh/known_hosts."""

    def __init__(self, target: Target, *, trust_new_hosts: bool = False, connect_timeout: float = CONNECT_TIMEOUT):
        self.target = target
        kh = Path(local_path(target.known_hosts)) if target.known_hosts else default_known_hosts()
        keys = _key_files(target)
        self.jump = SSHConn(_jump_target(target), trust_new_hosts=trust_new_hosts) \
            if target.proxy_jump and target.proxy_jump != "none" else None
        self.client = paramiko.SSHClient()
        try:
            self.client.load_system_host_keys()
        except (OSError, paramiko.SSHException):
            pass
        if kh.exists():
            self.client.load_host_keys(str(kh))  # kit file wins for add; never saved wholesale
            self.client._host_keys_filename = None  # we append ourselves, paramiko must not rewrite it
        self.client.set_missing_host_key_policy(_TrustNewPolicy(kh) if trust_new_hosts else _RefusePolicy(kh))
        user = target.user or getpass.getuser()
        try:
            sock = self.jump.client.get_transport().open_channel(
                "direct-tcpip", (target.host, target.port), ("127.0.0.1", 0), timeout=connect_timeout) \
                if self.jump else None
            self.client.connect(
                target.host,
                port=target.port,
                username=user,
                key_filename=keys or None,
                timeout=connect_timeout,
                banner_timeout=connect_timeout,
                auth_timeout=connect_timeout,
                allow_agent=True,  # after the key files, as OpenSSH: the agent may hold the key
                look_for_keys=not target.identity,
                sock=sock,
            )
        except RemoteError as err:
            raise RemoteError(str(err).split(": ", 1)[-1], node=target.name) from None
        except paramiko.BadHostKeyException as err:
            raise RemoteError(
                f"host key of {target.host} CHANGED (got {err.key.get_name()} {err.key.get_fingerprint().hex()}); "
                "refusing to connect; if the node was reinstalled remove its line from the known_hosts file",
                node=target.name,
            ) from None
        except (OSError, paramiko.SSHException, EOFError) as err:
            via = f" via {target.proxy_jump}" if self.jump else ""
            raise RemoteError(f"ssh {user}@{target.host}:{target.port}{via}: {err or type(err).__name__}",
                              node=target.name) from None
        self.client.get_transport().set_keepalive(15)

    def _chan(self, argv) -> paramiko.Channel:
        try:
            chan = self.client.get_transport().open_session(timeout=CONNECT_TIMEOUT)
            chan.exec_command(shlex.join([*self.target.sudo, *(str(a) for a in argv)]))
        except (OSError, paramiko.SSHException, AttributeError, EOFError) as err:
            raise RemoteError(f"ssh session lost: {err or type(err).__name__}", node=self.name) from None
        return chan

    def _run(self, argv, *, timeout, check, input) -> Result:
        chan = self._chan(argv)
        out, err = bytearray(), bytearray()
        deadline = time.monotonic() + timeout
        try:
            if input is not None:
                chan.sendall(input)
            chan.shutdown_write()
            while True:
                if chan.recv_ready():
                    out += chan.recv(CHUNK)
                    continue
                if chan.recv_stderr_ready():
                    err += chan.recv_stderr(CHUNK)
                    continue
                if chan.exit_status_ready() and (chan.eof_received or chan.closed):
                    break  # not on the exit status alone: sshd sends it when the child exits, output may follow
                if chan.closed or self.client.get_transport() is None or not self.client.get_transport().is_active():
                    raise RemoteError(f"ssh connection dropped while running `{shlex.join(argv)}`", node=self.name)
                if time.monotonic() > deadline:
                    chan.close()
                    raise RemoteError(f"`{shlex.join(argv)}` did not finish within {timeout:.0f} s", node=self.name)
                select.select([chan], [], [], 0.2)
            rc = chan.recv_exit_status()
        except (OSError, paramiko.SSHException, EOFError) as err_:
            raise RemoteError(f"ssh connection dropped while running `{shlex.join(argv)}`: {err_}", node=self.name) from None
        finally:
            chan.close()
        if rc == -1:
            raise RemoteError(f"ssh connection dropped while running `{shlex.join(argv)}`", node=self.name)
        res = Result(argv, rc, out.decode(errors="replace"), err.decode(errors="replace"), self.name)
        return res.check() if check else res

    def popen(self, argv) -> Proc:
        return _ChanProc(self._chan(argv))

    def alive(self) -> bool:
        t = self.client.get_transport()
        return t is not None and t.is_active()

    def close(self) -> None:
        self.client.close()
        if self.jump:
            self.jump.close()


# -------------------------------------------------------------------------------------------- helpers
def connect(target: Target, *, trust_new_hosts: bool = False) -> Conn:
    return LocalConn(target) if is_local(target) else SSHConn(target, trust_new_hosts=trust_new_hosts)


def host_key_line(conn: Conn, host: str, port: int = 22) -> str:
    """A known_hosts line for `conn`'s sshd reached as host:port, from the key our own verified connection saw
    (no trust-on-first-use by whoever uses the line)."""
    if isinstance(conn, SSHConn):
        key = conn.client.get_transport().get_remote_server_key()
        kt, kb = key.get_name(), key.get_base64()
    else:
        kt, kb = conn.query(["cat", "/etc/ssh/ssh_host_ed25519_key.pub"]).stdout.split()[:2]
    name = host if port == 22 else f"[{host}]:{port}"
    return f"{name} {kt} {kb}"


@dataclass
class Pool:
    """Open connections to a set of targets (in parallel) and run per-node functions across them."""

    targets: list[Target]
    trust_new_hosts: bool = False
    conns: dict[str, Conn] = field(default_factory=dict)

    def open(self, names: Iterable[str] | None = None) -> dict[str, Exception]:
        """Connect to every target (or those named) not yet connected; return {node: error} for those that
        failed."""
        wanted = None if names is None else set(names)
        todo = [t for t in self.targets if t.name not in self.conns and (wanted is None or t.name in wanted)]
        res = parallel(todo, lambda t: connect(t, trust_new_hosts=self.trust_new_hosts))
        errors = {}
        for i, t in enumerate(todo):
            if isinstance(res[i], Exception):
                errors[t.name] = res[i]
            else:
                self.conns[t.name] = res[i]
        return errors

    def get(self, name: str, *, wait: float = 180.0) -> Conn:
        """The node's connection; if its SSH session died (node rebooted, link cut), connect again, retrying
        for up to `wait` seconds while the node comes back."""
        c = self.conns.get(name)
        if c is not None and c.alive():
            return c
        target = next(t for t in self.targets if t.name == name)
        if c is not None:
            c.close()
            del self.conns[name]
        failed: list[RemoteError] = []

        def attempt() -> Conn:
            try:
                c = connect(target, trust_new_hosts=self.trust_new_hosts)
            except RemoteError as err:
                if "host key" in str(err):
                    raise
                failed[:] = [err]
                raise poll.NotYet(str(err)) from None
            self.conns[name] = c
            return c

        try:
            return poll.until(attempt, timeout=wait, interval=2)
        except poll.TimedOut:
            raise failed[0] from None

    def map(self, fn: Callable[[Conn], T], names: Iterable[str] | None = None) -> dict[str, T | Exception]:
        names = list(names) if names is not None else [t.name for t in self.targets if t.name in self.conns]

        def one(n: str):
            return fn(self.get(n))

        res = parallel(names, one)
        return {n: res[i] for i, n in enumerate(names)}

    def close(self) -> None:
        for c in self.conns.values():
            try:
                c.close()
            except Exception:  # noqa: BLE001
                pass
        self.conns.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


