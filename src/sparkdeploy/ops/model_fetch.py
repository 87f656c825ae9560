"""`weights fetch`: put the profile's Hugging Face repo (`model.id`) at `model.host_dir` on the head, once.

huggingface_hub runs on the head inside a container of the pinned base image (`image.base`, which ships it with
vLLM): nothing is installed on the node, its version is the one the engine is tested with, and `up` needs that
image on the head anyway. The container sees only the head's HF home (the same directory the engine mounts at
`/root/.cache/huggingface`), downloads into its hub cache with `snapshot_download` (a re-run keeps every file completed before,
progress as JSON lines, `HF_TOKEN` from a root-only 0600 env file removed afterwards: never argv, never logs), and prints the
commit. Then, on the head itself, each file of that snapshot is hard-linked into `host_dir` (no second copy on
disk; copied across file systems): `host_dir` holds plain files that `weights sync` and the engine's read-only
mount see, and no huggingface_hub metadata.

Offline (`--offline`, or HF_HUB_OFFLINE set where sparkdeploy runs) the files come from the head's HF cache
only; a repo id that is not there is an InventoryError naming `model.id`. The profile's own `env` is the
engine's, which always runs offline on mounted weights, so its HF_HUB_OFFLINE does not decide here. HF_ENDPOINT
(a mirror of the Hub) set where sparkdeploy runs is handed to the container.
"""

from __future__ import annotations

import json
import re
import secrets
import shlex
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Mapping

from sparkdeploy import plan as plan_mod
from sparkdeploy.errors import InputError, InventoryError, RemoteError
from sparkdeploy.model import credentials
from sparkdeploy.node import layout
from sparkdeploy.node.scripts import SCRIPTS
from sparkdeploy.remote.connection import Conn

HELPER_SOURCE = (SCRIPTS / "model_fetch.py").read_text()
HF_HOME = f"{layout.CACHE_HOST_DIR}/huggingface"  # the head's HF home, the engine's /root/.cache/huggingface
CONTAINER_HF_HOME = dict(plan_mod.CACHE_MOUNTS)["huggingface"]
TOKEN_DIR = f"{layout.STATE_DIR}/fetch"  # root-only: the token's env file lives here while the container runs
TRUE_VALUES = ("1", "on", "yes", "true")  # huggingface_hub's reading of HF_HUB_OFFLINE
REPO_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
HF_HOME_RE = re.compile(r"^/[A-Za-z0-9_.~/+-]*$")  # a docker -v source: no ':'
ENDPOINT_RE = re.compile(r"^https?://[A-Za-z0-9.:\[\]_-]+(/[A-Za-z0-9._~/-]*)?$")
REVISION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}(/[A-Za-z0-9][A-Za-z0-9_.-]{0,127})*$")


@dataclass(frozen=True)
class FetchSpec:
    """What to fetch and where, from the inventory and the command line."""

    repo_id: str
    revision: str
    host_dir: str
    image: str
    python: str
    offline: bool
    hf_home: str
    profile_file: str
    token: str | None = field(default=None, repr=False)  # never shown
    endpoint: str | None = None  # HF_ENDPOINT (a mirror of the Hub), as the head reaches it

    @property
    def cache(self) -> str:
        return f"{self.hf_home}/hub"

    def snapshot_dir(self, commit: str) -> str:
        """Where huggingface_hub keeps this commit's files on the head (symlinks into blobs/)."""
        return f"{self.cache}/models--{self.repo_id.replace('/', '--')}/snapshots/{commit}"


@dataclass(frozen=True)
class FetchResult:
    repo_id: str
    revision: str
    commit: str | None  # None: not in the cache (dry run)
    host_dir: str
    offline: bool
    token_used: bool = False  # the helper saw HF_TOKEN (auth.hf_token_file)
    files: int = 0
    bytes: int = 0
    present: int = 0
    linked: int = 0
    copied: int = 0

    @property
    def already_there(self) -> bool:
        return self.commit is not None and self.files > 0 and self.present == self.files

    def to_dict(self) -> dict:
        return {**asdict(self), "already_there": self.already_there}


def is_offline(flag: bool, environ: Mapping[str, str]) -> bool:
    return flag or environ.get("HF_HUB_OFFLINE", "").strip().lower() in TRUE_VALUES


def spec_of(inv, *, revision: str, offline: bool, hf_home: str = HF_HOME, endpoint: str | None = None) -> FetchSpec:
    """Check the profile's repo id, host dir, the revision and the endpoint; read the token (auth.hf_token_file).
    Pure but for reading the token file."""
    p = inv.profile
    if not REPO_ID_RE.fullmatch(p.model_id or ""):
        raise InventoryError(f"{p.model_id!r} is not a Hugging Face repo id (org/name); `weights fetch` downloads "
                             "model.id, or put the checkpoint at model.host_dir yourself", file=p.file, field="model.id")
    if not p.host_dir:
        raise InventoryError("no model.host_dir: the model is baked into the image, there is nothing to fetch",
                             file=p.file, field="model.host_dir")
    if not REVISION_RE.fullmatch(revision) or ".." in revision:
        raise InputError(f"--revision {revision!r} is not a branch, tag or commit name")
    if not HF_HOME_RE.fullmatch(hf_home):
        raise InputError(f"--hf-home {hf_home!r}: expected an absolute path on the head (no ':' or spaces)")
    if endpoint and not ENDPOINT_RE.fullmatch(endpoint):
        raise InputError(f"HF_ENDPOINT {endpoint!r} is not an http(s) URL")
    return FetchSpec(p.model_id, revision, p.host_dir, inv.image.base, inv.image.python, offline, hf_home, p.file,
                     inv.auth.hf_token(), endpoint or None)


def container_argv(spec: FetchSpec, token_env_file: str | None) -> list[str]:
    """`docker run` of the download helper in the base image: the HF home mounted where the engine mounts it,
    the token only through `--env-file`. Pure."""
    python = shlex.split(spec.python)
    argv = ["docker", "run", "--rm", "--network", "host", "--name", f"sparkdeploy-fetch-{secrets.token_hex(4)}",
            "-v", f"{spec.hf_home}:{CONTAINER_HF_HOME}", "-e", f"HF_HOME={CONTAINER_HF_HOME}",
            "-e", "HF_HUB_DISABLE_TELEMETRY=1", "-e", f"HF_HUB_OFFLINE={int(spec.offline)}"]
    if spec.endpoint:
        argv += ["-e", f"HF_ENDPOINT={spec.endpoint}"]
    if token_env_file:
        argv += ["--env-file", token_env_file]
    return argv + ["--entrypoint", python[0], spec.image, *python[1:], "-c", HELPER_SOURCE, "download",
                   f"{CONTAINER_HF_HOME}/hub", spec.repo_id, spec.revision, str(int(spec.offline))]


def parse_line(line: str) -> dict | None:
    """One JSON object line of the helper, or None for anything else (docker's pull output, warnings). Pure."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def download_error(spec: FetchSpec, event: dict, head: str) -> Exception:
    """The helper's {"error", "message"} as the error the CLI reports (exit 2 for what the user can fix)."""
    kind, msg = event.get("error"), event.get("message", "")
    where = f"{spec.repo_id}@{spec.revision}"
    if kind == "not_cached" and spec.offline:
        return InventoryError(
            f"{where} is not in {head}'s Hugging Face cache ({spec.cache}) and the fetch is offline "
            "(--offline or HF_HUB_OFFLINE); run `sparkdeploy weights fetch` where the head reaches the Hub, or copy "
            "the model into the cache or into model.host_dir", file=spec.profile_file, field="model.id")
    if kind == "not_found":
        return InventoryError(f"{spec.repo_id} is not on the Hub, or is private (set auth.hf_token_file): {msg}",
                              file=spec.profile_file, field="model.id")
    if kind == "gated":
        return InventoryError(f"{spec.repo_id} is gated: accept its terms on huggingface.co and set "
                              f"auth.hf_token_file to a token of that account ({msg})",
                              file=spec.profile_file, field="model.id")
    if kind == "revision":
        return InputError(f"--revision {spec.revision!r}: {spec.repo_id} has no such branch, tag or commit ({msg})")
    return RemoteError(f"downloading {where} failed: {msg or 'no answer from the helper'}", node=head)


def _download(conn: Conn, spec: FetchSpec, progress: Callable[[dict], None]) -> dict:
    """Run the download container; returns its last event ({"commit"} or {"error"})."""
    token_file = None
    conn.run(["mkdir", "-p", spec.hf_home])
    if spec.token:
        conn.run(["install", "-d", "-m", "0700", TOKEN_DIR])
        token_file = f"{TOKEN_DIR}/hf-token-{secrets.token_hex(4)}.env"
        conn.put(token_file, credentials.env_file({"HF_TOKEN": spec.token}), mode=0o600)
    try:
        proc = conn.popen(container_argv(spec, token_file))
        proc.close_stdin()
        last, other, buf = None, [], b""
        while chunk := proc.read():
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for raw in lines:
                text = raw.decode(errors="replace")
                event = parse_line(text)
                if event is None:
                    other.append(text)
                elif "progress" in event:
                    progress(event)
                else:
                    last = event
        rc, stderr = proc.wait(600)
    finally:
        if token_file:
            conn.run(["rm", "-f", token_file], check=False, timeout=30)
    if last is None:
        tail = " | ".join((stderr.strip().splitlines() or other)[-3:])
        raise RemoteError(f"the fetch container in {spec.image} exited {rc}: {tail}", node=conn.name)
    return last


def fetch(conn: Conn, spec: FetchSpec, *, dry_run: bool = False,
          progress: Callable[[dict], None] = lambda event: None) -> FetchResult:
    """Download (unless offline or a dry run) into the head's HF cache, then place the snapshot at host_dir.

    A dry run resolves the revision from the cache only and counts what placing would do; it writes nothing.
    """
    run_spec = replace(spec, offline=True) if dry_run else spec
    event = _download(conn, run_spec, progress)
    if "error" in event:
        if dry_run and event["error"] == "not_cached":
            return FetchResult(spec.repo_id, spec.revision, None, spec.host_dir, spec.offline)
        raise download_error(spec, event, conn.name)
    commit = str(event["commit"])
    res = conn.run(["python3", "-c", HELPER_SOURCE, "place", spec.snapshot_dir(commit), spec.host_dir,
                    str(int(dry_run))], check=False, timeout=3600)
    counts = parse_line((res.stdout.strip().splitlines() or [""])[-1])
    if not res.ok or counts is None or "error" in counts:
        why = (counts or {}).get("message") or (res.stderr or res.stdout).strip()[-300:]
        raise RemoteError(f"placing {spec.repo_id}@{commit[:12]} at {spec.host_dir} failed: {why}", node=conn.name)
    return FetchResult(spec.repo_id, spec.revision, commit, spec.host_dir, spec.offline, bool(event.get("token")),
                       **{k: int(counts[k]) for k in ("files", "bytes", "present", "linked", "copied")})
