"""Traffic capture on the nodes (`vocab capture on|off|clear|status`, and the counts `vocab learn` pulls).

Every release is rendered with the capture overlay wired in (`plan._capture_wired`); whether the engine counts is
one file, the service's `capture_switch` (`layout.ServiceLayout`), that the engine looks for every second. So switching costs no restart, and
clearing is deleting the counts files (the engine starts a new one at its next flush). Only a node that runs an
engine core writes counts (the head with the mp backend; each replica's head with data parallelism), but the
switch is set on every node so that a node that becomes a head counts the same way.
"""

from __future__ import annotations

import hashlib
import posixpath
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sparkdeploy.errors import SparkdeployError
from sparkdeploy.node import probes
from sparkdeploy.node.layout import CAPTURE_SCHEDULER, PLAIN, ServiceLayout
from sparkdeploy.remote.connection import Conn
from sparkdeploy.steps.base import Action, Outcome, run_step
from sparkdeploy.steps.context import Context

COUNTS_GLOB = posixpath.basename(PLAIN.capture_counts).replace(".npy", "*.npy")  # counts.npy, counts.dp1.npy, ...
MODES = ("on", "off", "clear")
OFF_SETTLE_S = 2.5  # > the engine's switch poll (spark_overlays.capture.SWITCH_POLL_S = 1 s) + one flush


class CaptureError(SparkdeployError):
    """Capture cannot do what was asked on this cluster (not wired, nothing captured); exit 1."""


@dataclass
class NodeCapture:
    """What one node says about capture: wired into its current release, switched on, its counts files."""

    node: str
    wired: bool
    on: bool
    files: dict[str, int] = field(default_factory=dict)  # path -> bytes

    def to_dict(self) -> dict:
        return asdict(self)


#: One section of a probe (`probes.named_probe_argv`): is the current release wired, is the switch there, which
#: counts files (size path).
_READ = r'''
grep -qF "$scheduler" "$cur/node-plan.json" 2>/dev/null && echo wired
test -e "$switch" && echo on
find "$dir" -maxdepth 1 -type f -name "$glob" -printf 'file %s %p\n' 2>/dev/null
true
'''


def read(conn: Conn, lay: ServiceLayout) -> NodeCapture:
    argv = probes.named_probe_argv("read-capture", {"capture": _READ}, {
        "scheduler": CAPTURE_SCHEDULER, "cur": lay.current_link, "switch": lay.capture_switch, "dir": lay.capture_dir,
        "glob": COUNTS_GLOB})
    out = probes.section_text(probes.split_sections(conn.query(argv).stdout), "capture").splitlines()
    files = {}
    for line in out:
        if line.startswith("file "):
            _, size, path = line.split(" ", 2)
            files[path] = int(size)
    return NodeCapture(conn.name, "wired" in out, "on" in out, dict(sorted(files.items())))


def states(cx: Context) -> dict[str, NodeCapture]:
    return cx.each(lambda c: read(c, cx.lay), "reading the capture state")


def switch(cx: Context, mode: str, *, dry_run: bool = False) -> list[Outcome]:
    """`on`, `off` or `clear` on every node; a node already so is left alone (idempotent)."""
    if mode not in MODES:
        raise ValueError(mode)
    now = states(cx)
    if mode == "on":
        unwired = [n for n, s in now.items() if not s.wired]
        if unwired:
            raise CaptureError(f"{', '.join(unwired)}: the release serving there was deployed without traffic "
                               "capture (an older kit, or a vLLM pin without the capture overlay); run "
                               "`sparkdeploy up` first, then `vocab capture on`")

    def diff(n: str) -> list[Action]:
        c, s, lay = cx.conn(n), now[n], cx.lay
        if mode == "on" and not s.on:
            return [Action(f"create {lay.capture_switch}", lambda: (c.run(["mkdir", "-p", lay.capture_dir]),
                                                                   c.put(lay.capture_switch, b"")))]
        if mode == "off" and s.on:
            return [Action(f"remove {lay.capture_switch}", lambda: c.run(["rm", "-f", lay.capture_switch]))]
        if mode == "clear" and s.files:
            return [Action(f"remove {', '.join(s.files)}", lambda: c.run(["rm", "-f", *s.files]))]
        return []

    outcomes = run_step(f"capture {mode}", cx.names, diff, dry_run=dry_run, log=cx.log)
    if mode == "off" and not dry_run and any(o.actions for o in outcomes):
        time.sleep(OFF_SETTLE_S)  # the engine's last flush (it looks for the switch every second) lands before we return
    return outcomes


def pull(cx: Context, dest: str | Path | None = None) -> list[Path]:
    """Copy every node's counts files here (`dest`, default a new temp dir), named `<node>.<file>`."""
    found = {n: s.files for n, s in states(cx).items() if s.files}
    if not found:
        raise CaptureError("no counts on any node: turn capture on (`sparkdeploy vocab capture on`), let the "
                           f"service answer traffic, and wait up to the flush interval; files: {cx.lay.capture_dir}/"
                           f"{COUNTS_GLOB}")
    out = Path(dest) if dest else Path(tempfile.mkdtemp(prefix="sparkdeploy-counts-"))
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for n, files in sorted(found.items()):
        for path in files:
            data = cx.conn(n).get(path)
            if data is None:  # cleared between the listing and the copy
                continue
            local = out / f"{n}.{posixpath.basename(path)}"
            local.write_bytes(data)
            paths.append(local)
    return paths


def live_list(cx: Context) -> tuple[str, bytes]:
    """(a name, the bytes) of the draft list live on the head: what `vocab learn` adds to by default."""
    from sparkdeploy.ops import vocab_live

    head = cx.conn(cx.head)
    state = vocab_live.read_state(head, cx.lay)
    data = vocab_live.read_list(head, cx.lay, state.content) if state.content else None
    if data is None or hashlib.sha256(data).hexdigest() != state.content:
        raise CaptureError(f"{cx.head}: no readable live draft list ({state.problem() or 'current.txt missing'}); "
                           "pass --vocab")
    return f"the live list {state.version} on {cx.head}", data
