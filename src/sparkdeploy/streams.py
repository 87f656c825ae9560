"""Bytes into a remote process (a build context into `docker build -`): raw processes and channels with an
explicit end of input (`close_stdin`), one read fanned out to several writers."""

from __future__ import annotations

import shlex
import threading
import time
from typing import Iterable, Sequence

import paramiko

from sparkdeploy.connection import CHUNK, Conn
from sparkdeploy.errors import RemoteError


def stream(src: Conn, src_argv: Sequence[str], dst: Conn, dst_argv: Sequence[str], *, timeout: float = 3600) -> int:
    """Pipe stdout of `src_argv` on `src` into stdin of `dst_argv` on `dst` (e.g. docker save | docker load).

    Ends input with an explicit EOF; returns the bytes moved; raises RemoteError naming the side that failed.
    """
    moved = stream_many(src, src_argv, [dst], dst_argv, timeout=timeout)[dst.name]
    if isinstance(moved, Exception):
        raise moved
    return moved


def stream_many(src: Conn, src_argv: Sequence[str], dsts: Sequence[Conn], dst_argv: Sequence[str], *,
                timeout: float = 3600) -> dict[str, int | Exception]:
    """One read of `src_argv` fanned out to `dst_argv` on every destination (docker save once, load on N nodes).

    A destination that fails is dropped (its error returned) and the others continue. Returns
    {destination name: bytes moved or the RemoteError}.
    """
    p_src = src.popen(src_argv)
    live = {d.name: (d, d.popen(dst_argv)) for d in dsts}
    result: dict[str, int | Exception] = {}
    moved = 0
    deadline = time.monotonic() + timeout
    try:
        while live:
            chunk = p_src.read(CHUNK)
            if not chunk:
                break
            moved += len(chunk)
            for name, (d, p) in list(live.items()):
                try:
                    p.write(chunk)
                except (OSError, paramiko.SSHException, EOFError) as err:
                    p.kill()
                    result[name] = RemoteError(f"stream from {src.name} broke after {moved} bytes: {err}", node=name)
                    del live[name]
            if time.monotonic() > deadline:
                raise RemoteError(f"stream from {src.name} did not finish within {timeout:.0f} s", node=src.name)
        for name, (d, p) in live.items():
            p.close_stdin()
        rc_src, err_src = p_src.wait(60)
        for name, (d, p) in live.items():
            rc, err = p.wait(max(60.0, deadline - time.monotonic()))
            result[name] = moved if rc == 0 else RemoteError(
                f"`{shlex.join(dst_argv)}` exited {rc}: {err.strip()[-300:]}", node=name)
    except (OSError, paramiko.SSHException, EOFError, TimeoutError, RemoteError) as err:
        p_src.kill()
        for name, (d, p) in live.items():
            p.kill()
            result.setdefault(name, err if isinstance(err, RemoteError) else RemoteError(str(err), node=name))
        return result
    if rc_src != 0:
        e = RemoteError(f"`{shlex.join(src_argv)}` exited {rc_src}: {err_src.strip()[-300:]}", node=src.name)
        return {name: e for name in result}
    return result


def stream_bytes(dst: Conn, dst_argv: Sequence[str], chunks: Iterable[bytes], *, timeout: float = 3600) -> tuple[int, str]:
    """Feed locally produced bytes (e.g. a tar build context) into a command on `dst`; returns (rc, stderr+stdout tail)."""
    p = dst.popen(dst_argv)
    out = bytearray()

    def drain():
        while True:
            try:
                b = p.read(CHUNK)
            except (OSError, paramiko.SSHException, ValueError):
                return
            if not b:
                return
            out.extend(b)

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    try:
        for c in chunks:
            p.write(c)
        p.close_stdin()
        t.join(timeout)
        rc, err = p.wait(timeout)
    except (OSError, paramiko.SSHException, EOFError, TimeoutError) as e:
        p.kill()
        raise RemoteError(f"`{shlex.join(dst_argv)}` broke: {e}", node=dst.name) from None
    return rc, (out.decode(errors="replace") + err)[-4000:]
