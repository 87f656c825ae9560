"""What the user's SSH setup says about a host: `~`/`$VAR` expansion of local paths and `~/.ssh/config`
(paramiko's reading of it). Local files only, so the inventory loader can use it without the remote layer."""

from __future__ import annotations

import os
from pathlib import Path

import paramiko

from sparkdeploy.errors import RemoteError


def local_path(path: str) -> str:
    """A local path as a shell would read it: `~`, `~user` and `$VAR`/`${VAR}` expanded."""
    return os.path.expanduser(os.path.expandvars(path))


def ssh_config(host: str) -> dict:
    """What `~/.ssh/config` says for `host` (paramiko's reading of it, the one fabric uses).

    Keys as paramiko gives them: hostname (always; `host` itself without a match or a file), user, port,
    identityfile (a list, `~` expanded), proxyjump.
    """
    path = Path(local_path("~/.ssh/config"))
    if not path.is_file():
        return {"hostname": host}
    try:
        return dict(paramiko.SSHConfig.from_path(str(path)).lookup(host))
    except (OSError, paramiko.SSHException, ValueError) as err:
        raise RemoteError(f"reading {path} failed: {err}") from None


def identity_of(cfg: dict) -> str | None:
    """The first IdentityFile of an ssh_config entry that exists (else the first named): OpenSSH tries them in
    order, the kit takes one key file and the agent for the rest."""
    keys = list(cfg.get("identityfile") or ())
    return next((k for k in keys if os.path.isfile(local_path(k))), keys[0] if keys else None)
