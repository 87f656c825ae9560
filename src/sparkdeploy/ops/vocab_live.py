"""The draft vocabulary on a node: a content-addressed store, one `current` pointer, and a history.

On-node layout (`/var/lib/sparkdeploy/vocab`, per service `layout.ServiceLayout.vocab_host_dir`, mounted read-only at `/opt/sparkdeploy/vocab` in the engine):

    <sha256>.txt        one list per version, named by the sha256 of its bytes; never rewritten
    <sha256>.json       what is known about it (source file name, size, tokenizer hash, when it arrived)
    current.txt      -> <sha256>.txt   relative symlink, switched atomically (new link + rename)
    history.jsonl       one JSON line per switch: rollout, rollback (automatic or asked for), with the reason

A version is the first 12 hex digits of the sha256. The release says which list it expects: the engine gets
`spark_overlays.shortlist.sha256` in `--additional-config` (and refuses a list with another hash, falling back
to the stock draft head), so `current.txt` and the current release must name the same sha256.

A release whose plan has `shortlist.live_check_every` takes a new list without a restart: `live_swap` moves
every node's pointer and reads back, from each engine rank's log report, whether it swapped or kept its list
(overlays/README.md "Live list swap"); on any refusal the pointers go back. A restart after a live swap
reads `current.txt` against the release's sha256, so the caller must also record a release naming the new list.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

from sparkdeploy import poll as polling
from sparkdeploy.errors import RemoteError
from sparkdeploy.node import probes
from sparkdeploy.node.layout import ServiceLayout
from sparkdeploy.remote.connection import Conn

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


#: One section of a probe (`probes.named_probe_argv`; variables from `state_values`): the live list and the one
#: the current release is configured with (`node_plan`: its node-plan.json on one line, read by `configured_sha`).
#: `health` reads it in its own probe.
STATE = r"""
echo "pointer $(readlink "$vocab_dir/current.txt" 2>/dev/null)"
echo "content $(sha256sum "$vocab_dir/current.txt" 2>/dev/null | cut -d' ' -f1)"
echo "stored $(cd "$vocab_dir" 2>/dev/null && ls 2>/dev/null | grep -E '^[0-9a-f]{64}\.txt$' | cut -c1-64 | tr '\n' ' ')"
echo "release $(readlink "$current" 2>/dev/null)"
echo "node_plan $(tr -d '\n' < "$current/node-plan.json" 2>/dev/null)"
"""


def state_values(lay: ServiceLayout) -> dict[str, str]:
    """The shell variables STATE reads."""
    return {"vocab_dir": lay.vocab_host_dir, "current": lay.current_link}


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
        elif key == "node_plan":
            lv.configured = configured_sha(loads_or_empty(val))
    return lv


def configured_sha(node_plan: dict) -> str | None:
    """The draft list's sha256 a release is configured with: the shortlist settings in `--additional-config`
    of the serve argv in its node-plan.json (None: no shortlist). The one reader of it: `vocab status`, `health`
    and the sentinel's record."""
    argv = list(node_plan.get("node", {}).get("serve_argv") or [])
    try:
        cfg = json.loads(argv[argv.index("--additional-config") + 1])
        return cfg["spark_overlays"]["shortlist"].get("sha256")
    except (ValueError, IndexError, KeyError, TypeError, AttributeError):
        return None


def loads_or_empty(text: str | bytes | None) -> dict:
    """A node-plan.json as read from a node; {} when absent or unreadable (then no list is configured)."""
    try:
        got = json.loads(text) if text else {}
    except ValueError:
        return {}
    return got if isinstance(got, dict) else {}


def read_state(conn: Conn, lay: ServiceLayout) -> LiveVocab:
    argv = probes.named_probe_argv("vocab", {"vocab": STATE}, state_values(lay))
    out = conn.query(argv, check=False, timeout=30).stdout
    return parse_state(conn.name, probes.section_text(probes.split_sections(out), "vocab"))


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
    served_check(report, node, lv, snap.get("vocab_reports", []))
    others = {n: s for n, s in report.vocab.items() if n != node}
    report.vocab[node] = lv.content
    differ = {n: s for n, s in others.items() if s != lv.content}
    if others:
        report.add("vocab agreement", not differ,
                   "same list as " + ", ".join(others) if not differ else
                   f"live list {lv.version} differs from "
                   + ", ".join(f"{n} ({version_of(s)})" for n, s in differ.items())
                   + ": every rank must draft from the same list", node)


def served_check(report, node: str, lv: LiveVocab, lines: list[str]) -> None:
    """Health check "served list": every engine rank on the node serves the list its release names (from the
    ranks' last reports; none yet, e.g. an engine still loading: no verdict)."""
    ranks = {r.rank: r for r in reports("\n".join(lines))}
    if lv.configured is None or not ranks:
        return
    wrong = {r: s for r, s in sorted(ranks.items()) if s.sha256 != lv.configured}
    names = f"{version_of(lv.configured)}, the list release {lv.release} names"
    if not wrong:
        report.add("served list", True, f"every rank ({', '.join(map(str, sorted(ranks)))}) serves {names}", node)
        return
    serving = "; ".join(f"rank {r} serves {version_of(s.sha256)}" + (f" (kept it: {s.reason})" if s.reason else "")
                        for r, s in wrong.items())
    report.add("served list", False, f"{serving}, not {names}: `sparkdeploy vocab rollout` of that list swaps it "
                                     "again, `--restart` restarts the engine on it", node)


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


# ------------------------------------------------------------------------------------------- live swap
# What each TP rank of a running engine reports it drafts from (overlays/README.md "Live list swap"): one log
# line at load ("serves"), after each swap ("swapped; serves") and after a refused one ("keeps", the old sha).
_REPORT = re.compile(r"spark_overlays: shortlist (serves|swapped; serves|keeps) sha256=([0-9a-f]{64}) rows=\d+ "
                     r"capacity=\d+ tp_rank=(\d+)(?: reason=(.*?))? pid=")


@dataclass(frozen=True)
class Served:
    """One rank's report: the list it serves after an event ("serves", "swapped" or "keeps", with why)."""

    rank: int
    sha256: str
    event: str
    reason: str = ""


def reports(log: str) -> list[Served]:
    """The engine's list reports in log order."""
    return [Served(int(m.group(3)), m.group(2), m.group(1).split(";")[0], m.group(4) or "")
            for m in _REPORT.finditer(log)]


#: One section of a probe: the engine ranks' reports of the list each serves, in log order ($ctr: its container;
#: the newest 64, far more than the ranks of a node report between two looks). `health` reads it too.
REPORTS = "docker logs \"$ctr\" 2>&1 | grep 'spark_overlays: shortlist .*sha256=' | tail -n 64"


def engine_reports(conn: Conn, lay: ServiceLayout) -> str:
    """The report lines of the node's engine container (empty when it is not running)."""
    argv = probes.named_probe_argv("reports", {"reports": REPORTS}, {"ctr": lay.container})
    return probes.section_text(probes.split_sections(conn.query(argv, check=False, timeout=60).stdout), "reports")


def served(conn: Conn, lay: ServiceLayout, logs: Callable[[Conn, ServiceLayout], str] = engine_reports
           ) -> dict[int, Served]:
    """The list each TP rank on the node serves now (its last report)."""
    return {r.rank: r for r in reports(logs(conn, lay))}


@dataclass
class LiveSwapResult:
    """Per node and rank, the first report after the pointer moved (absent: the rank had not answered)."""

    sha256: str
    answers: dict[str, dict[int, Served]]
    ranks: dict[str, list[int]]

    @property
    def ok(self) -> bool:
        return not self.problems()

    def problems(self) -> list[str]:
        out = []
        for node, ranks in self.ranks.items():
            for rank in ranks:
                got = self.answers.get(node, {}).get(rank)
                if got is None:
                    out.append(f"{node} rank {rank}: no report (an engine looks at the pointer only while it drafts)")
                elif got.event != "swapped" or got.sha256 != self.sha256:
                    out.append(f"{node} rank {rank}: keeps {version_of(got.sha256)}: {got.reason or got.event}")
        return out


def live_swap(conns: Sequence[Conn], lay: ServiceLayout, sha: str, *, timeout: float = 120, poll: float = 1.0,
              nudge: Callable[[], None] = lambda: None,
              logs: Callable[[Conn, ServiceLayout], str] = engine_reports) -> LiveSwapResult:
    """Point every node's `current.txt` at stored version `sha` and wait until every engine rank reports that it
    serves it, or that it keeps its list. `nudge` runs between looks: an engine looks at the pointer only while
    it drafts, so an idle service needs a request. On any refusal, or no answer within `timeout`, every pointer
    goes back to the list the ranks serve, so pointer and engine agree again; the result says why, per rank.
    Raises RemoteError when a node's engine reports no list (shortlist off, or a plugin without the swap)."""
    before, ranks, previous = {}, {}, {}
    for conn in conns:
        seen = reports(logs(conn, lay))
        if not seen:
            raise RemoteError("the engine reports no draft list (shortlist off, or a plugin without the live "
                              "swap): use a restart rollout", node=conn.name)
        before[conn.name] = len(seen)
        ranks[conn.name] = sorted({r.rank for r in seen})
        previous[conn.name] = read_state(conn, lay).content
    for conn in conns:
        point(conn, lay, sha)
    answers: dict[str, dict[int, Served]] = {c.name: {} for c in conns}

    def look() -> None:
        for conn in conns:
            for r in reports(logs(conn, lay))[before[conn.name]:]:
                answers[conn.name].setdefault(r.rank, r)
        if any(len(answers[n]) < len(ranks[n]) for n in ranks):
            raise polling.NotYet("a rank has not reported")

    try:
        polling.until(look, timeout=timeout, interval=poll, side=nudge, side_every=0)
    except polling.TimedOut:
        pass  # the ranks that did not report are the result's problems
    result = LiveSwapResult(sha, answers, ranks)
    for conn in conns:
        back = None if result.ok else previous[conn.name]
        if back:
            point(conn, lay, back)
        record(conn, lay, {"action": "live-swap", "sha256": sha, "version": version_of(sha),
                           "from": previous[conn.name], "result": "live" if result.ok else "refused",
                           "problems": result.problems()})
    return result
