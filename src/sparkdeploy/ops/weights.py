"""Weights: copy the checkpoint head -> other nodes over the data plane, evict its page cache, guard memory.

sync    Manifests first (size + sha256 per file, hashed on each node by `node/scripts/weights.py` and cached by
        size/mtime/inode, so an unchanged checkpoint is listed without reading it). Identical manifests: skip.
        Otherwise rsync runs *on the head* and pushes only the differing files to the other node's data_ip
        (the CX-7 link, not the management NIC), whole-file, temp-then-rename per file, resumable
        (`--partial-dir`). The head reaches the node with a one-time key: generated here, placed on the head,
        authorized on the node with `from="<head data_ip>",restrict` and removed afterwards; the node's host
        key is the one the kit's own (verified) connection saw, pinned, so host-key checking stays on. After
        the copy the node's hash cache is seeded with the head's hashes (rsync verified every file it wrote)
        and the node's manifest is compared with the head's once more.
evict   posix_fadvise(DONTNEED) on every file of the checkpoint (after fdatasync), on every node; no root.
        On GB10 the page cache of a just-read checkpoint counts as used GPU memory (cudaMemGetInfo = MemFree).
guard   Refuse to start when MemAvailable after eviction is below weights + activations + KV + the reserve:
        the same figures `memory.budget` put in the plan (imported, never recomputed here).
"""

from __future__ import annotations

import json
import re
import secrets
import shlex
import threading
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping, Sequence

from sparkdeploy.errors import PlanError, RemoteError, SparkdeployError
from sparkdeploy.fanout import parallel
from sparkdeploy.node import memguard, probes
from sparkdeploy.node.scripts import SCRIPTS
from sparkdeploy.remote.connection import effect, recording
from sparkdeploy.remote.ssh import host_key_line
from sparkdeploy.verdict import Result, Status

HELPER_SOURCE = (SCRIPTS / "weights.py").read_text()
GIB = 1 << 30
SSH_CIPHER = "aes128-gcm@openssh.com"  # AES-GCM: hardware-accelerated on x86 and on the GB10's Arm cores
MAX_STREAMS = 4
CORES_PER_STREAM = 4  # a stream keeps ssh + rsync busy on both ends


def auto_streams(cores: int) -> int:
    """Parallel rsync streams for a head with `cores` CPUs. One SSH stream is bound by one core's cipher speed
    (a CX-7 is not), but every stream also costs CPU on both ends: on a 2-core host 1 stream moved 0.82-0.90 of
    `cat | ssh`'s rate and 4 streams 0.68-0.75 (bench/weights_sync.py). A GB10's 20 cores get 4. Pure."""
    return max(1, min(MAX_STREAMS, cores // CORES_PER_STREAM))


@dataclass(frozen=True)
class Manifest:
    files: dict[str, tuple[int, str]]
    bytes: int = 0
    hashed: int = 0  # bytes read to hash now (0 when the cache covered everything)
    exists: bool = True

    @classmethod
    def from_json(cls, data: Mapping) -> "Manifest":
        files = {k: (int(v[0]), str(v[1])) for k, v in data.get("files", {}).items()}
        return cls(files, int(data.get("bytes", 0)), int(data.get("hashed", 0)), bool(data.get("exists", True)))


def diff_manifests(src: Manifest, dst: Manifest) -> tuple[list[str], list[str]]:
    """(files to send: missing or different size/hash on dst, files only on dst). Pure; sorted."""
    send = sorted(rel for rel, sig in src.files.items() if dst.files.get(rel) != sig)
    extra = sorted(rel for rel in dst.files if rel not in src.files)
    return send, extra


def helper(conn, *args: str, input: bytes | None = None, timeout: float = 3600, reads_only: bool = False,
           answer: dict | None = None) -> dict:
    """Run the node-side helper with the node's python3; returns its JSON answer (a dry run records the command,
    carries nothing out and answers `answer`, default {}). `reads_only`: a fact, carried out and never recorded."""
    argv = ["python3", "-c", HELPER_SOURCE, *args]
    if reads_only:
        res = conn.query(argv, check=False, timeout=timeout)
    else:
        res = conn.run(argv, input=input, check=False, timeout=timeout, answer=json.dumps(answer or {}))
    if not res.ok:
        tail = (res.stderr or res.stdout).strip().splitlines()[-2:]
        raise RemoteError(f"weights helper `{args[0]}` exited {res.rc}: {' | '.join(tail)}", node=conn.name)
    try:
        return json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise RemoteError(f"weights helper `{args[0]}` printed no JSON: {res.stdout[-200:]!r}", node=conn.name) from None


def manifest(conn, directory: str) -> Manifest:
    return Manifest.from_json(helper(conn, "manifest", directory, reads_only=True))


def evict(conn, directory: str) -> dict:
    """Drop the page cache of `directory`'s files; the report (a dry run's names what was not measured)."""
    return helper(conn, "evict", directory, timeout=1800,
                  answer={"evicted": f"<page cache of {directory} on {conn.name}, dropped at the start>"})


# ----------------------------------------------------------------------------------------------- rsync
def ssh_command(key: str, known_hosts: str) -> list[str]:
    return ["ssh", "-i", key, "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={known_hosts}",
            "-o", "StrictHostKeyChecking=yes", "-o", "GlobalKnownHostsFile=/dev/null", "-o", "Compression=no",
            "-o", "ControlMaster=no", "-o", "ConnectTimeout=10", "-c", SSH_CIPHER]


def rsync_argv(src_dir: str, user: str, ip: str, dst_dir: str, ssh: Sequence[str]) -> list[str]:
    """rsync on the head pushing a NUL-separated file list (stdin) from src_dir to user@ip:dst_dir."""
    src = src_dir.rstrip("/") + "/"
    dst = dst_dir.rstrip("/") + "/"
    return ["rsync", "-a", "--whole-file", "--partial-dir=.rsync-partial", "--info=progress2", "--no-inc-recursive",
            "--from0", "--files-from=-", "-e", shlex.join(ssh), src, f"{user}@{ip}:{dst}"]


_PROGRESS = re.compile(r"^\s*([\d,]+)\s+(\d+)%\s+(\S+/s)")


def parse_progress(text: str) -> tuple[int, int, str] | None:
    """The last `--info=progress2` record in `text`: (bytes done, percent, rate)."""
    last = None
    for rec in re.split(r"[\r\n]", text):
        m = _PROGRESS.match(rec)
        if m:
            last = (int(m.group(1).replace(",", "")), int(m.group(2)), m.group(3))
    return last


def one_time_key(comment: str) -> tuple[bytes, str]:
    """A fresh ed25519 key pair made here, so no node spends a round trip on ssh-keygen:
    (OpenSSH private key, public key line ending in `comment`)."""
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.OpenSSH, ser.NoEncryption())
    public = key.public_key().public_bytes(ser.Encoding.OpenSSH, ser.PublicFormat.OpenSSH).decode()
    return private, f"{public} {comment}"


# On the head: a private directory holding the key (stdin) and the pinned host key ($1); prints it.
_HEAD_SETUP = ('d=$(mktemp -d /tmp/sparkdeploy-sync-XXXXXX) && umask 077 && cat > "$d/key" && '
               'printf %s "$1" > "$d/known_hosts" && echo "$d"')


@dataclass
class Channel:
    """What the head needs to reach one node over the data plane: key, pinned host key, ssh argv."""

    head: object  # connection.Conn
    node: object  # connection.Conn
    tmpdir: str
    marker: str
    closed: bool = False

    @property
    def ssh(self) -> list[str]:
        return ssh_command(f"{self.tmpdir}/key", f"{self.tmpdir}/known_hosts")

    def finish(self, directory: str, verified: Mapping[str, Sequence], expected: Mapping[str, Sequence]) -> Manifest:
        """Seed the node's hash cache with what rsync verified, revoke the key, list the result; the head's key
        directory goes at the same time. Returns the node's manifest (`expected`, its files once rsync made
        them, is what a dry run, where rsync made nothing, answers)."""
        out = self._close(lambda: helper(self.node, "finish", directory, self.marker,
                                         input=json.dumps(verified).encode(),
                                         answer={"manifest": {"files": expected}}))
        return Manifest.from_json(out["manifest"])

    def close(self) -> None:
        if not self.closed:
            self._close(lambda: helper(self.node, "unauthorize", self.marker, timeout=30))

    def _close(self, at_node: Callable[[], dict]) -> dict:
        self.closed = True
        res = parallel([at_node, lambda: self.head.run(["rm", "-rf", self.tmpdir], check=False, timeout=30)],
                       lambda fn: fn())
        if isinstance(res[0], Exception):
            raise res[0]
        return res[0]


@contextmanager
def data_plane_channel(head, head_ip: str, node, node_ip: str) -> Iterator[Channel]:
    """A one-time key for the head, authorized on `node` only from `head_ip`, with the node's host key pinned
    (as our own verified connection saw it); revoked and removed on exit, even on failure. Opening and closing
    are one round trip each: head and node are reached at the same time."""
    marker = f"sparkdeploy-weights-{secrets.token_hex(6)}"
    private, public = one_time_key(marker)
    known = host_key_line(node, node_ip) + "\n"
    line = f'from="{head_ip}",restrict {public}\n'.encode()
    res = parallel([lambda: head.run(["sh", "-c", _HEAD_SETUP, "setup", known], input=private, timeout=60,
                                     answer=f"<directory mktemp makes on {head.name}>"),
                    lambda: helper(node, "authorize", input=line)],
                   lambda fn: fn())
    at_head, at_node = res[0], res[1]
    if isinstance(at_head, Exception):
        with suppress(SparkdeployError):  # the head's error is the one to report
            helper(node, "unauthorize", marker, timeout=30)
        raise at_head
    ch = Channel(head, node, at_head.stdout.strip(), marker)
    try:
        if isinstance(at_node, Exception):
            raise at_node
        yield ch
    finally:
        ch.close()


def run_rsync(head, argv: Sequence[str], files: Sequence[str], total: int,
              progress: Callable[[int, int], None] | None = None, timeout: float = 24 * 3600) -> None:
    """rsync on the head, its file list fed on stdin: an effect through the recorder (a dry run lists it)."""
    effect(f"{head.name}: run {shlex.join(argv)} <{len(files)} files, {total} bytes listed on stdin>",
           lambda: _rsync(head, argv, files, total, progress, timeout), None)


def _rsync(head, argv: Sequence[str], files: Sequence[str], total: int,
           progress: Callable[[int, int], None] | None, timeout: float) -> None:
    proc = head.popen(argv)
    buf = ""
    try:
        proc.write(b"".join(f.encode() + b"\0" for f in files))
        proc.close_stdin()
        deadline = time.monotonic() + timeout
        while True:
            chunk = proc.read(65536)
            if not chunk:
                break
            buf = (buf + chunk.decode(errors="replace"))[-4096:]
            got = parse_progress(buf)
            if got and progress:
                progress(min(got[0], total), total)
            if time.monotonic() > deadline:
                proc.kill()
                raise RemoteError(f"rsync did not finish within {timeout:.0f} s", node=head.name)
        rc, err = proc.wait(60)
    except (OSError, EOFError) as e:
        proc.kill()
        raise RemoteError(f"rsync broke: {e}", node=head.name) from None
    if rc != 0:
        raise RemoteError(f"rsync exited {rc}: {err.strip()[-400:]}", node=head.name)
    if progress:
        progress(total, total)


# ------------------------------------------------------------------------------------------------ sync
@dataclass
class SyncResult:
    node: str
    status: Status  # OK (identical already), CHANGED (synced) or WOULD_CHANGE (a dry run): the one vocabulary
    files: int = 0
    bytes: int = 0
    seconds: float = 0.0
    transfer_seconds: float = 0.0  # rsync alone (the rest: manifests, one-time key, verification)
    extra: list[str] = field(default_factory=list)
    detail: str = ""
    streams: int = 0  # parallel rsync streams used (0: nothing sent)
    effects: list[str] = field(default_factory=list)  # the exact commands (a dry run: would run)

    @property
    def rate(self) -> float:
        return self.bytes / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return {"node": self.node, "status": self.status.value, "files": self.files, "bytes": self.bytes,
                "seconds": round(self.seconds, 3), "transfer_seconds": round(self.transfer_seconds, 3),
                "streams": self.streams, "extra": self.extra, "detail": self.detail, "effects": self.effects}


@dataclass(frozen=True)
class Endpoint:
    conn: object  # connection.Conn
    name: str
    data_ip: str
    user: str = "root"


def split_streams(files: Mapping[str, int], streams: int) -> list[list[str]]:
    """Files (rel -> size) into at most `streams` groups of near-equal bytes (largest first). Pure."""
    groups: list[tuple[int, list[str]]] = [(0, []) for _ in range(max(1, min(streams, len(files))))]
    for rel, size in sorted(files.items(), key=lambda kv: (-kv[1], kv[0])):
        i = min(range(len(groups)), key=lambda k: groups[k][0])
        groups[i] = (groups[i][0] + size, groups[i][1] + [rel])
    return [sorted(g) for _, g in groups if g]


def run_streams(head, argv: Sequence[str], groups: Sequence[Sequence[str]], sizes: Mapping[str, int],
                progress: Callable[[int, int], None] | None = None) -> None:
    """One rsync per group, at once (one SSH stream is bound by one core's cipher speed; a CX-7 is not)."""
    total = sum(sizes.values())
    done = [0] * len(groups)
    lock = threading.Lock()

    def one(i: int) -> None:
        def cb(d: int, _t: int) -> None:
            with lock:
                done[i] = d
                if progress:
                    progress(sum(done), total)
        run_rsync(head, argv, groups[i], sum(sizes[f] for f in groups[i]), cb)

    if len(groups) == 1:
        one(0)
        return
    errors = [e for e in parallel(range(len(groups)), one).values() if isinstance(e, Exception)]
    if errors:
        raise errors[0]


def sync(head: Endpoint, targets: Sequence[Endpoint], directory: str, *, dry_run: bool = False,
         head_manifest: Manifest | None = None, streams: int | None = None,
         progress: Callable[[str, int, int], None] | None = None) -> list[SyncResult]:
    """Make `directory` on every target identical (for the head's files) to the head's; see the module doc.
    `streams` None: `auto_streams` of the head's core count."""
    src = head_manifest or manifest(head.conn, directory)
    if not src.exists:
        raise PlanError(f"checkpoint directory {directory} does not exist on the head {head.name}")
    if not src.files:
        raise PlanError(f"checkpoint directory {directory} on the head {head.name} holds no files")
    results = []
    for t in targets:
        t0 = time.monotonic()
        send, extra = diff_manifests(src, manifest(t.conn, directory))
        if not send:
            results.append(_identical(t.name, src, extra, t0))
            continue
        sizes = {f: src.files[f][0] for f in send}
        groups = split_streams(sizes, streams or auto_streams(int(head.conn.query(["nproc"]).stdout)))
        with recording(dry=dry_run) as made:
            t.conn.run(["mkdir", "-p", directory])
            with data_plane_channel(head.conn, head.data_ip, t.conn, t.data_ip) as ch:
                cb = (lambda done, total, n=t.name: progress(n, done, total)) if progress else None
                t1 = time.monotonic()
                run_streams(head.conn, rsync_argv(directory, t.user, t.data_ip, directory, ch.ssh), groups, sizes, cb)
                transfer = time.monotonic() - t1
                after = ch.finish(directory, {f: list(src.files[f]) for f in send},
                                  {f: list(sig) for f, sig in src.files.items()})
        still, _ = diff_manifests(src, after)
        if still:
            raise RemoteError(f"after rsync {len(still)} files still differ from the head's: {', '.join(still[:3])}",
                              node=t.name)
        results.append(SyncResult(t.name, Status.WOULD_CHANGE if dry_run else Status.CHANGED, len(send),
                                  sum(sizes.values()),
                                  time.monotonic() - t0, transfer, extra,
                                  f"{len(send)} of {len(src.files)} files, {len(groups)} rsync stream(s)",
                                  len(groups), list(made)))
    return results


def _identical(node: str, src: Manifest, extra: list[str], t0: float) -> SyncResult:
    return SyncResult(node, Status.OK, 0, 0, time.monotonic() - t0, 0.0, extra,
                      f"identical: {len(src.files)} files, {src.bytes / GIB:.2f} GiB")


# ----------------------------------------------------------------------------------------------- guard
class MemoryGuardError(SparkdeployError):
    """Starting now would eat the host reserve on a node (exit 1): the start is refused."""


def guard(node: str, mem_available: int, budget, *, mem_free: int | None = None) -> Result:
    """The start-time memory guard on one node. `budget` is the plan's `memory.MemoryBudget` for that node:
    need = its engine budget (weights + activations + KV), reserve = its reserve.

    On a GB10 CUDA reports MemFree, not MemAvailable, as free device memory, so other page cache still
    resident makes vLLM's own start check fail even when MemAvailable is fine: a warning with the fix."""
    need = int(round(budget.engine_gib * GIB))
    reserve = int(round(budget.reserve_gib * GIB))
    res = memguard.memory_margin("memory-guard", node, mem_available, need, reserve)
    if res.status is not Status.FAILED and budget.gpu and mem_free is not None and mem_free < need:
        return Result(
            "memory-guard", node, Status.WARN,
            res.reason + f"; but MemFree {mem_free / GIB:.1f} GiB < engine {need / GIB:.1f} GiB: CUDA on GB10 counts "
            "page cache as used, so vLLM's start check may refuse",
            "drop other caches before the start: `sync; echo 3 | sudo tee /proc/sys/vm/drop_caches`")
    return res


def enforce(results: Sequence[Result]) -> None:
    """Raise (refuse to start) when any node's guard failed."""
    bad = [r for r in results if r.status is Status.FAILED]
    if bad:
        raise MemoryGuardError("refusing to start: " + "; ".join(f"{r.node}: {r.reason}" for r in bad) +
                        f" -- {bad[0].fix}")


def evict_and_guard(pool, plan, directory: str | None) -> tuple[dict[str, dict], list[Result]]:
    """Before a start: evict the checkpoint's page cache on every planned node (when there is a host
    directory), then judge MemAvailable after eviction against each node's planned budget. Returns
    ({node: evict report}, guard results); `enforce(results)` refuses the start. For `up` and `weights evict`.
    A report without a measure (a dry run's answer: with the engine still running, MemAvailable would say
    nothing about the start) gets no guard result; the real start judges it."""
    names = [np.name for np in plan.nodes]
    if directory:
        out = pool.map(lambda c: evict(c, directory), names)
    else:  # model baked into the image: nothing to evict, still measure
        def measure(c) -> dict:
            # read once this run stopped the engine; a dry run stopped none, and the recorder's answer holds no
            # measure
            mem = probes.parse_meminfo(c.query(["cat", "/proc/meminfo"], timeout=30, answer="").stdout)
            return {"files": 0, "bytes": 0, "cached_before": None, "cached_after": None} | (
                {"mem_available_before": mem["MemAvailable"], "mem_available_after": mem["MemAvailable"],
                 "mem_free_after": mem.get("MemFree")} if "MemAvailable" in mem else {})

        out = pool.map(measure, names)
    for name, res in out.items():
        if isinstance(res, Exception):
            raise res
    guards = [guard(np.name, out[np.name]["mem_available_after"], np.memory,
                    mem_free=out[np.name].get("mem_free_after")) for np in plan.nodes
              if "mem_available_after" in out[np.name]]
    return out, guards
