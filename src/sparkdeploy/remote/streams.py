"""Bytes into a remote process (a build context into `docker build -`): a raw process or channel with an explicit
end of input (`close_stdin`)."""

from __future__ import annotations

import shlex
import threading
from typing import Iterable, Sequence

import paramiko

from sparkdeploy.errors import RemoteError
from sparkdeploy.remote.connection import CHUNK, Conn


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
