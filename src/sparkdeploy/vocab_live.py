"""The draft vocabulary on a node: a content-addressed store, one `current` pointer, and a history.

On-node layout (`/var/lib/sparkdeploy/vocab`, per service `layout.ServiceLayout.vocab_host_dir`, mounted read-only at `/opt/sparkdeploy/vocab` in the engine):

    <sha256>.txt        one list per version, named by the sha256 of its bytes; never rewritten
    <sha256>.json       what is known about it (source file name, size, tokenizer hash, when it arrived)
    current.txt      -> <sha256>.txt   relative symlink, switched atomically (new link + rename)
    history.jsonl       one JSON line per switch: rollout, rollback (automatic or asked for), with the reason

A version is the first 12 hex digits of the sha256. The release says which list it expects: the engine gets
`spark_overlays.shortlist.sha256` in `--additional-config` (and refuses a list with another hash, falling back
to the stock draft head), so `current.txt` and the current release must name the same sha256.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

from sparkdeploy.errors import RemoteError
from sparkdeploy.layout import ServiceLayout
from sparkdeploy.connection import Conn

KEEP = 8  # stored versions kept besides the live one and those a kept release names


def version_of(sha: str | None) -> str | None:
    return sha[:12] if sha else None


def file_name(sha: str) -> str:
    return f"{sha}.txt"


@dataclass
class LiveVocab:
    """What one node serves: where the pointer goes, what the file hashes to, what the release expects."""

    node: str
    pointer: str | None = None  # target of current.txt ("<sha>.txt"), None if there is no pointer
    content: str | None = None  # sha256 of the bytes current.txt resolves to (None: missing/unreadable)
    configured: str | None = None  # sha256 in the current release's --additional-config (None: shortlist off)
    release: int | None = None
    stored: list[str] = field(default_factory=list)  # sha256 of every stored version

    @property
    def sha256(self) -> str | None:
        return self.content

    @property
    def version(self) -> str | None:
        return version_of(self.content)

    def problem(self) -> str | None:
        """Why this node's live list is not the one its release expects (None when it is)."""
        if self.configured is None:
            return None if self.pointer is None or self.content else "current.txt points at a missing file"
        if self.content is None:
            return f"current.txt is missing or dangling (release {self.release} expects {version_of(self.configured)})"
        if self.pointer and self.pointer != file_name(self.content) and self.pointer.endswith(".txt") \
                and len(self.pointer) == 68:
            return f"{self.pointer} does not hash to its name (content {self.version}): the file was altered"
        if self.content != self.configured:
            return (f"live list {self.version} differs from the one release {self.release} expects "
                    f"({version_of(self.configured)}): the engine's shortlist falls back to the stock head")
        return None

    def to_dict(self) -> dict:
        return dict(asdict(self), version=self.version, problem=self.problem())


# One round trip. $1 = the vocab dir, $2 = the service's `current` link. The configured hash is the
# `"sha256":"<hex>"` of the shortlist settings
# inside the release's node-plan.json (JSON inside a JSON string, hence the escaped quotes in between).
_STATE = r"""
d=$1
echo "pointer $(readlink "$d/current.txt" 2>/dev/null)"
echo "content $(sha256sum "$d/current.txt" 2>/dev/null | cut -d' ' -f1)"
echo "stored $(cd "$d" 2>/dev/null && ls 2>/dev/null | grep -E '^[0-9a-f]{64}\.txt$' | cut -c1-64 | tr '\n' ' ')"
echo "release $(readlink "$2" 2>/dev/null)"
echo "configured $(grep -o 'sha256[^0-9a-f]\{1,8\}[0-9a-f]\{64\}' "$2/node-plan.json" 2>/dev/null | head -1 | grep -o '[0-9a-f]\{64\}$')"
"""


def parse_state(node: str, out: str) -> LiveVocab:
    lv = LiveVocab(node)
    for line in out.splitlines():
        key, _, val = line.partition(" ")
        val = val.strip()
        if key == "pointer":
            lv.pointer = val or None
        elif key == "content":
            lv.content = val or None
        elif key == "stored":
            lv.stored = sorted(val.split())
        elif key == "release":
            base = val.rstrip("/").rsplit("/", 1)[-1]
            lv.release = int(base) if base.isdigit() else None
        elif key == "configured":
            lv.configured = val or None
    return lv


def read_state(conn: Conn, lay: ServiceLayout) -> LiveVocab:
    out = conn.query(["sh", "-c", _STATE, "vocab", lay.vocab_host_dir, lay.current_link], check=False, timeout=30).stdout
    return parse_state(conn.name, out)


def read_list(conn: Conn, lay: ServiceLayout, sha: str | None = None) -> bytes | None:
    """Bytes of a stored version (default: the live one); None if absent."""
    return conn.get(f"{lay.vocab_host_dir}/{file_name(sha)}" if sha else f"{lay.vocab_host_dir}/current.txt")


def has(conn: Conn, lay: ServiceLayout, sha: str, *, written: bool = False) -> bool:
    """The stored file exists and hashes to its name. `written`: this run has just written it, so a dry run,
    which wrote nothing, answers with the hash the write would have left."""
    path = f"{lay.vocab_host_dir}/{file_name(sha)}"
    out = conn.query(["sha256sum", path], check=False, timeout=30, answer=f"{sha}  {path}" if written else None)
    return out.stdout.split()[:1] == [sha]


def store(conn: Conn, lay: ServiceLayout, data: bytes, sha: str, meta: dict) -> bool:
    """Put a version into the store (atomic write; skipped when present and intact). True if written."""
    if has(conn, lay, sha):
        return False
    conn.run(["mkdir", "-p", lay.vocab_host_dir])
    conn.put(f"{lay.vocab_host_dir}/{file_name(sha)}", data, mode=0o644)
    conn.put(f"{lay.vocab_host_dir}/{sha}.json", json.dumps(dict(meta, sha256=sha, stored_at=time.time()), sort_keys=True).encode()
             + b"\n", mode=0o644)
    if not has(conn, lay, sha, written=True):
        raise RemoteError(f"{lay.vocab_host_dir}/{file_name(sha)} does not hash to {sha[:12]} after writing it", node=conn.name)
    return True


def point(conn: Conn, lay: ServiceLayout, sha: str) -> None:
    """Switch current.txt to a stored version (atomic rename of a new relative symlink)."""
    if not conn.exists(f"{lay.vocab_host_dir}/{file_name(sha)}"):
        raise RemoteError(f"version {sha[:12]} is not stored in {lay.vocab_host_dir}; refusing to point current.txt at it",
                          node=conn.name)
    conn.symlink(f"{lay.vocab_host_dir}/current.txt", file_name(sha))


def record(conn: Conn, lay: ServiceLayout, entry: dict) -> None:
    """Append one line to history.jsonl (read + atomic rewrite: no half-written line after a crash)."""
    old = conn.get(f"{lay.vocab_host_dir}/history.jsonl") or b""
    if old and not old.endswith(b"\n"):
        old += b"\n"
    line = json.dumps(dict(entry, at=entry.get("at", time.time())), sort_keys=True).encode() + b"\n"
    conn.run(["mkdir", "-p", lay.vocab_host_dir])
    conn.put(f"{lay.vocab_host_dir}/history.jsonl", old + line, mode=0o644)


def history(conn: Conn, lay: ServiceLayout) -> list[dict]:
    out = []
    for line in (conn.get(f"{lay.vocab_host_dir}/history.jsonl") or b"").decode("utf-8", "replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def meta(conn: Conn, lay: ServiceLayout, sha: str) -> dict:
    data = conn.get(f"{lay.vocab_host_dir}/{sha}.json")
    try:
        return json.loads(data) if data else {}
    except ValueError:
        return {}


def prune(conn: Conn, lay: ServiceLayout, state: LiveVocab, keep_shas: set[str], keep: int = KEEP) -> list[str]:
    """Drop stored versions beyond the newest `keep` (by history order), never one in `keep_shas` or live."""
    order = [e.get("sha256") for e in history(conn, lay) if e.get("sha256")]
    rank = {s: i for i, s in enumerate(order)}  # later switches rank higher
    protected = set(keep_shas) | {s for s in (state.content, state.configured) if s}
    candidates = sorted((s for s in state.stored if s not in protected), key=lambda s: rank.get(s, -1), reverse=True)
    drop = candidates[keep:]
    if drop:
        conn.run(["rm", "-f", *[f"{lay.vocab_host_dir}/{s}{ext}" for s in drop for ext in (".txt", ".json")]])
    return drop


def from_snapshot(node: str, snap: dict) -> LiveVocab:
    """The live vocab from `health`'s node snapshot (its vocab_* lines)."""
    cur = (snap.get("current") or "").rstrip("/").rsplit("/", 1)[-1]
    return LiveVocab(node, pointer=snap.get("vocab_pointer") or None, content=snap.get("vocab_content") or None,
                     configured=snap.get("vocab_configured") or None, release=int(cur) if cur.isdigit() else None)


def check(report, node: str, snap: dict) -> None:
    """Health checks: this node serves the list its release expects, and the same list as the nodes before it."""
    lv = from_snapshot(node, snap)
    if lv.configured is None and lv.pointer is None:
        return  # no shortlist in this release and no list on the node: nothing to check
    problem = lv.problem()
    report.add("draft vocab", problem is None,
               problem or (f"list {lv.version} (sha256 {lv.content}) live, as release {lv.release} expects"
                           if lv.configured else
                           f"list {lv.version} on the node; release {lv.release} has no shortlist"),
               node)
    others = {n: s for n, s in report.vocab.items() if n != node}
    report.vocab[node] = lv.content
    differ = {n: s for n, s in others.items() if s != lv.content}
    if others:
        report.add("vocab agreement", not differ,
                   "same list as " + ", ".join(others) if not differ else
                   f"live list {lv.version} differs from "
                   + ", ".join(f"{n} ({version_of(s)})" for n, s in differ.items())
                   + ": every rank must draft from the same list", node)


def follow_release(conn: Conn, lay: ServiceLayout) -> str | None:
    """Point current.txt at the list the current release expects, when it is stored here and not live yet.

    For release switches made outside a rollout (`rollback`, `up`'s automatic rollback): the release names
    its list by sha256, the pointer must follow or the engine's shortlist falls back to the stock head.
    Returns the sha256 switched to, or None when nothing changed (or the list is not stored here).
    """
    st = read_state(conn, lay)
    if not st.configured or st.content == st.configured or st.configured not in st.stored:
        return None
    point(conn, lay, st.configured)
    record(conn, lay, {"action": "follow-release", "sha256": st.configured, "version": version_of(st.configured),
                  "from": st.content, "release": st.release, "result": "live"})
    return st.configured
