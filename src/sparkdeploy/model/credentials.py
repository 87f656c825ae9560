"""Secrets the inventory points at (`auth.api_key_file`, `auth.hf_token_file`): read, checked, never shown.

A secret lives only in its own file on this machine (0600, like an SSH key) and, on the nodes, in one
root-owned 0600 env file per service (`ServiceLayout.secrets_env`) that docker reads with `--env-file`: vLLM takes `VLLM_API_KEY` from
its environment. It never reaches argv, `plan`/`render` output, logs or the release identity; the plan carries a
fingerprint instead, so a changed key is a new release that restarts the engine with it.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from sparkdeploy.errors import InventoryError

MAX_SECRET_BYTES = 4096


@dataclass(frozen=True)
class Auth:
    api_key_file: Path | None = None
    hf_token_file: Path | None = None

    def api_key(self) -> str | None:
        return read_secret(self.api_key_file, "auth.api_key_file") if self.api_key_file else None

    def hf_token(self) -> str | None:
        return read_secret(self.hf_token_file, "auth.hf_token_file") if self.hf_token_file else None

    def engine_env(self) -> dict[str, str]:
        """What the engine container gets from its secrets env file."""
        key = self.api_key()
        return {"VLLM_API_KEY": key} if key else {}

    def fingerprints(self) -> dict[str, str]:
        """{env name: sha256:<12 hex>} of what the secrets env file holds: safe to show, changes when a secret does."""
        return {name: fingerprint(value) for name, value in self.engine_env().items()}


def fingerprint(secret: str) -> str:
    return "sha256:" + hashlib.sha256(secret.encode()).hexdigest()[:12]


def read_secret(path: Path, field: str) -> str:
    """The one-line secret in `path`; InventoryError naming the field when it is missing, shared or malformed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as err:
        raise InventoryError(f"cannot read the secret file {path}: {err.strerror}", field=field) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InventoryError(f"{path} is not a regular file", field=field)
        if st.st_mode & 0o077:
            raise InventoryError(f"{path} is readable by others (mode {stat.S_IMODE(st.st_mode):04o}); "
                                 f"run: chmod 600 {path}", field=field)
        data = os.read(fd, MAX_SECRET_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_SECRET_BYTES:
        raise InventoryError(f"{path} is over {MAX_SECRET_BYTES} bytes; expected one line holding the secret",
                             field=field)
    try:
        lines = data.decode("ascii").strip().splitlines()
    except UnicodeDecodeError:
        raise InventoryError(f"{path} is not ASCII text; expected one line holding the secret", field=field) from None
    if len(lines) != 1 or not lines[0] or any(ch.isspace() or not ch.isprintable() for ch in lines[0]):
        raise InventoryError(f"{path} must hold exactly one line: the secret, with no spaces", field=field)
    return lines[0]


def env_file(values: dict[str, str]) -> bytes:
    return "".join(f"{k}={v}\n" for k, v in sorted(values.items())).encode()
