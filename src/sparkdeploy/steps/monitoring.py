"""The head's Prometheus exporter (docs/monitoring.md) as a supervised unit, installed by `up`.

The nodes have no Python packages of the kit's, and need none: the exporter is the kit's own code, copied to
`layout.EXPORTER_CODE_DIR` on the head and run by the serving image's Python (vLLM depends on everything the
exporter imports), in a container that the service's `sparkdeploy-exporter[-<service>].service` supervises
(the code is one copy per node, whatever the services there). The unit names the serving
image of the release `up` put live; a rollback leaves it on that newer image, which is still on the head.
`ports.metrics: 0` removes it, and so does a node that is no longer the head (the head role moved).
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import sparkdeploy
from sparkdeploy.node.layout import EXPORTER_CODE_DIR, ServiceLayout
from sparkdeploy.remote.connection import Conn
from sparkdeploy.steps.base import Action, Outcome, run_step
from sparkdeploy.steps.context import Context

DIGEST_FILE = f"{EXPORTER_CODE_DIR}/DIGEST"


def code_archive() -> tuple[bytes, str, int]:
    """The kit's Python modules as a tar (stable bytes: sorted, no times or owners), its digest, file count."""
    root = Path(sparkdeploy.__file__).parent
    files = sorted(p for p in root.rglob("*.py") if "_data" not in p.relative_to(root).parts)
    buf = io.BytesIO()
    digest = hashlib.sha256()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in files:
            data = path.read_bytes()
            name = f"sparkdeploy/{path.relative_to(root).as_posix()}"
            digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue(), digest.hexdigest(), len(files)


def actions(head: Conn, lay: ServiceLayout, unit: bytes | None,
            unwanted_because: str = "ports.metrics is 0") -> list[Action]:
    """What makes this node's exporter of the service `lay` match `unit` (None: no exporter wanted here,
    `unwanted_because`). The code goes with the node's last exporter unit."""
    name, unit_path = lay.exporter_unit, lay.exporter_unit_path
    have_unit = head.get(unit_path)
    if unit is None:
        if have_unit is None:
            return []
        return [Action(f"stop, disable and remove {name} ({unwanted_because})", lambda: head.sh(
            f"systemctl disable --now {name}; docker rm -f {lay.exporter_container} >/dev/null 2>&1; "
            f"rm -f {unit_path}; ls {lay.systemd_dir}/sparkdeploy-exporter*.service >/dev/null 2>&1 || "
            f"rm -rf {EXPORTER_CODE_DIR}; systemctl daemon-reload", timeout=120, check=False))]
    acts = []
    archive, digest, count = code_archive()
    have_digest = (head.get(DIGEST_FILE) or b"").decode().strip()
    if have_digest != digest:
        def install_code() -> None:
            new = f"{EXPORTER_CODE_DIR}.new"
            head.run(["sh", "-c", f'rm -rf "$1" && mkdir -p "$1" && tar -xf - -C "$1" && echo {digest} > "$1/DIGEST" '
                                  f'&& rm -rf "$2" && mv "$1" "$2"', "install", new, EXPORTER_CODE_DIR],
                     input=archive, timeout=120)
        acts.append(Action(f"install the exporter's code ({count} modules, {len(archive) // 1024} KiB) in "
                           f"{EXPORTER_CODE_DIR}", install_code))
    if have_unit != unit:
        acts.append(Action(f"install {name} + daemon-reload",
                           lambda: (head.put(unit_path, unit), head.run(["systemctl", "daemon-reload"]))))
    if head.query(["systemctl", "is-enabled", name], check=False).stdout.strip() != "enabled":
        acts.append(Action(f"enable {name}", lambda: head.run(["systemctl", "enable", name])))
    if acts or not head.query(["systemctl", "is-active", "--quiet", name], check=False).ok:
        acts.append(Action(f"(re)start {name}", lambda: head.run(["systemctl", "restart", name], timeout=120)))
    return acts


def step_monitoring(cx: Context, out: list[Outcome]) -> None:
    """The head gets the exporter; every other node of the plan loses one it kept from a time it was the head."""
    def diff(n: str) -> list[Action]:
        if n == cx.head:
            return actions(cx.conn(n), cx.lay, cx.files.get(f"{n}/monitoring/{cx.lay.exporter_unit}"))
        return actions(cx.conn(n), cx.lay, None, f"{n} is not the head")
    out += run_step("monitoring", cx.names, diff, dry_run=cx.opts.dry_run, log=cx.log)
