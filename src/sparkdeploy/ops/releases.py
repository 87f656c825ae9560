"""Numbered releases on every node, Kamal style: keep the last few, switch with one symlink, roll back.

Layout on each node (root `/etc/sparkdeploy`, or `/etc/sparkdeploy/services/<name>` for each of `services:`):

    releases/0007/            the rendered files of release 7 for this node (launch.sh, env, ...)
    releases/0007/release.json  written LAST: number, plan fingerprint, image, files' sha256; its presence
                                means the release directory is complete
    releases/0007/HEALTHY       written after the health gate passed (holds the recorded probe)
    current -> releases/0007    switched atomically (new link + rename) only when every node holds release 7

A release that lacks release.json is debris of an interrupted `up`; it is never switched to and is removed
by the next `up`. Only the newest `KEEP` complete releases are kept (plus whichever is current).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import time
from dataclasses import dataclass, field

from sparkdeploy.errors import RemoteError
from sparkdeploy.node import probes
from sparkdeploy.node.layout import HEALTHY_MARK, RELEASE_META, SENTINEL_RECORD, ServiceLayout
from sparkdeploy.remote.connection import Conn

KEEP = 5


def rdir(lay: ServiceLayout, number: int) -> str:
    return f"{lay.releases_dir}/{number:04d}"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class NodeReleases:
    """What one node holds: complete releases (number -> meta), incomplete ones, current, healthy set."""

    complete: dict[int, dict] = field(default_factory=dict)
    incomplete: list[int] = field(default_factory=list)
    current: int | None = None
    healthy: set[int] = field(default_factory=set)

    @property
    def newest(self) -> int:
        return max([0, *self.complete, *self.incomplete])


#: A node's releases, one section of a probe (`probes.named_probe_argv`; variables from `scan_values`): list
#: release dirs, which have release.json / HEALTHY, print metas, and resolve `current`. Read by `parse_scan`.
SCAN = r"""
exec 2>/dev/null
cd "$releases" || { echo END; exit 0; }
for d in [0-9][0-9][0-9][0-9]; do
  [ -d "$d" ] || continue
  if [ -f "$d/release.json" ]; then printf 'META %s ' "$d"; tr -d '\n' < "$d/release.json"; echo; else echo "PART $d"; fi
  [ -f "$d/HEALTHY" ] && echo "OKAY $d"
done
printf 'CURR %s\n' "$(readlink "$current")"
echo END
"""


def scan_values(lay: ServiceLayout) -> dict[str, str]:
    """The shell variables SCAN reads."""
    return {"releases": lay.releases_dir, "current": lay.current_link}


def scan(conn: Conn, lay: ServiceLayout) -> NodeReleases:
    out = conn.query(probes.named_probe_argv("scan", {"releases": SCAN}, scan_values(lay)), timeout=30).stdout
    return parse_scan(probes.section_text(probes.split_sections(out), "releases"), conn.name)


def parse_scan(out: str, node: str) -> NodeReleases:
    """Output cut short must never pass for a node's state: a half-read META line would look like an
    incomplete release, and prune removes those."""
    lines = out.splitlines()
    if not lines or lines[-1] != "END":
        raise RemoteError("the list of releases came back cut short (output lost on the way); run it again",
                          node=node)
    nr = NodeReleases()
    for line in lines[:-1]:
        tag, _, rest = line.partition(" ")
        if tag == "META":
            num, _, js = rest.partition(" ")
            try:
                nr.complete[int(num)] = json.loads(js)
            except ValueError:
                nr.incomplete.append(int(num))
        elif tag == "PART":
            nr.incomplete.append(int(rest))
        elif tag == "OKAY":
            nr.healthy.add(int(rest))
        elif tag == "CURR" and rest.strip():
            base = posixpath.basename(rest.strip().rstrip("/"))
            if base.isdigit():
                nr.current = int(base)
    nr.healthy &= set(nr.complete)
    return nr


def file_digests(conn: Conn, lay: ServiceLayout, number: int) -> dict[str, str]:
    """sha256 of every file in a release directory (relative names), without release.json/HEALTHY."""
    res = conn.query(["sh", "-c", 'cd "$1" 2>/dev/null && find . -type f -exec sha256sum {} +', "d", rdir(lay, number)],
                   check=False, timeout=30)
    digests = {}
    for line in res.stdout.splitlines():
        h, _, name = line.partition("  ")
        name = name[2:] if name.startswith("./") else name
        if name not in (RELEASE_META, HEALTHY_MARK, SENTINEL_RECORD):
            digests[name] = h
    return digests


def write(conn: Conn, lay: ServiceLayout, number: int, files: dict[str, tuple[bytes, int]], meta: dict) -> None:
    """Write a release directory: every file atomically, then release.json last (the completeness mark).

    `files` maps a relative name to (content, mode). An earlier incomplete directory of that number is
    cleared first so nothing stale mixes in.
    """
    d = rdir(lay, number)
    conn.run(["rm", "-rf", d])
    dirs = sorted({posixpath.dirname(posixpath.join(d, n)) for n in files} | {d})
    conn.run(["mkdir", "-p", *dirs])
    for name, (data, mode) in sorted(files.items()):
        conn.put(posixpath.join(d, name), data, mode=mode)
    full = dict(meta, number=number, files={n: sha(b) for n, (b, _) in files.items()}, written_at=time.time())
    conn.put(posixpath.join(d, RELEASE_META), json.dumps(full, sort_keys=True).encode() + b"\n", mode=0o644)


def switch(conn: Conn, lay: ServiceLayout, number: int) -> None:
    """Point `current` at a complete release (atomic rename of a new symlink)."""
    if not conn.exists(posixpath.join(rdir(lay, number), RELEASE_META)):
        raise RemoteError(f"release {number} is incomplete here; refusing to switch to it", node=conn.name)
    conn.symlink(lay.current_link, f"releases/{number:04d}")


def mark_healthy(conn: Conn, lay: ServiceLayout, number: int, record: dict) -> None:
    conn.put(posixpath.join(rdir(lay, number), HEALTHY_MARK), json.dumps(record, sort_keys=True).encode() + b"\n")


def read_healthy(conn: Conn, lay: ServiceLayout, number: int) -> dict | None:
    data = conn.get(posixpath.join(rdir(lay, number), HEALTHY_MARK))
    return json.loads(data) if data else None


def write_sentinel(conn: Conn, lay: ServiceLayout, number: int, record: dict) -> None:
    """The release's speed record (kept on the head, with the release, pruned with it)."""
    conn.put(posixpath.join(rdir(lay, number), SENTINEL_RECORD), json.dumps(record, sort_keys=True).encode() + b"\n")


def read_sentinel(conn: Conn, lay: ServiceLayout, number: int) -> dict | None:
    data = conn.get(posixpath.join(rdir(lay, number), SENTINEL_RECORD))
    try:
        return json.loads(data) if data else None
    except ValueError:
        return None


def prune(conn: Conn, lay: ServiceLayout, nr: NodeReleases, keep: int = KEEP) -> list[int]:
    """Remove incomplete releases and all but the newest `keep` complete ones (never the current)."""
    drop = [n for n in nr.incomplete if n != nr.current]
    drop += [n for n in sorted(nr.complete)[:-keep] if n != nr.current]
    if drop:
        conn.run(["rm", "-rf", *[rdir(lay, n) for n in drop]])
    return drop


def last_healthy(per_node: dict[str, NodeReleases], *, before: int | None = None) -> int | None:
    """Newest release that is complete and marked healthy on every node (optionally older than `before`)."""
    common = None
    for nr in per_node.values():
        common = set(nr.healthy) if common is None else common & nr.healthy
    cands = [n for n in (common or ()) if before is None or n < before]
    return max(cands) if cands else None


def common_complete(per_node: dict[str, NodeReleases]) -> set[int]:
    common = None
    for nr in per_node.values():
        common = set(nr.complete) if common is None else common & set(nr.complete)
    return common or set()
