"""Wiring of the coupled-rank watchdog (docs/supervision.md): files, units and the head->worker control key.

Head: /usr/local/lib/sparkdeploy/watchdog.py (kit code), <release>/watchdog.json (config, part of the
release), sparkdeploy-watchdog.{service,timer}, /etc/sparkdeploy/watchdog/{id_ed25519,known_hosts}; with
`services:`, each service its own (sparkdeploy-watchdog-<name>.*, under /etc/sparkdeploy/services/<name>).
Workers: /usr/local/lib/sparkdeploy/rank-ctl and one line per service in root's authorized_keys that lets that
service's watchdog key run only rank-ctl for that service (restrict,command="rank-ctl [<name>]"): status |
restart | stop | start of its engine unit.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
from pathlib import Path

from sparkdeploy.node.layout import LIB_DIR, PLAIN, RANK_CTL, WATCHDOG_CONFIG, WATCHDOG_PY, ServiceLayout
from sparkdeploy.node.scripts import SCRIPTS
from sparkdeploy.plan import render
from sparkdeploy.remote.connection import Conn
from sparkdeploy.steps.base import Action

CONFIG = WATCHDOG_CONFIG
AUTHORIZED_KEYS = "/root/.ssh/authorized_keys"  # a worker's: the watchdog acts as root there

_FILES = SCRIPTS


def key(lay: ServiceLayout) -> str:
    return f"{lay.watchdog_dir}/id_ed25519"


def known_hosts(lay: ServiceLayout) -> str:
    return f"{lay.watchdog_dir}/known_hosts"


def settings_path(lay: ServiceLayout) -> str:  # knobs (grace, backoff, cap): not part of a release
    return f"{lay.watchdog_dir}/settings.json"


def node_file(name: str) -> bytes:
    return (_FILES / name).read_bytes()


def unit_files(lay: ServiceLayout) -> dict[str, bytes]:
    env = render.environment()
    ctx = {"watchdog": WATCHDOG_PY, "config": f"{lay.current_link}/{CONFIG}", "state": lay.watchdog_state,
           "service": lay.service}
    return {f"/etc/systemd/system/{unit}": env.get_template(f"systemd/{template}.j2").render(**ctx).encode()
            for unit, template in ((lay.watchdog_service, "sparkdeploy-watchdog.service"),
                                   (lay.watchdog_timer, "sparkdeploy-watchdog.timer"))}


def config(plan, release: str) -> bytes:
    """The release's part of the watchdog configuration (what to probe and whom to restart)."""
    head, lay = plan.head, plan.layout
    workers = [{"name": n.name, "host": n.ssh.host, "port": n.ssh.port, "user": "root"} for n in plan.nodes[1:]]
    cfg = {"api_url": f"http://127.0.0.1:{plan.api_port}", "model": plan.served_name, "unit": head.unit_name,
           "container": head.container_name, "workers": workers, "ssh_key": key(lay), "known_hosts": known_hosts(lay),
           "release": release, "settings": settings_path(lay), "secrets_env": lay.secrets_env}
    return (json.dumps(cfg, indent=2, sort_keys=True) + "\n").encode()


def settings(*, start_grace_s: float, backoff_base_s: float, retry_cap: int, wedge=None) -> bytes:
    """The watchdog's knobs: `up`'s options, and the inventory's `watchdog:` thresholds (`wedge`, a
    WatchdogConfig) for a GPU busy at low power."""
    knobs = {"start_grace_s": start_grace_s, "backoff_base_s": backoff_base_s, "retry_cap": retry_cap}
    if wedge is not None:
        knobs.update(dataclasses.asdict(wedge))
    return (json.dumps(knobs, sort_keys=True) + "\n").encode()


def ensure_key(head: Conn, lay: ServiceLayout) -> str:
    """The service's watchdog key pair (made on its head, never leaves it); returns the public line. A key this
    run makes is, in a dry run (which makes none), the recorder's placeholder: the workers would be authorized
    anew."""
    made = not head.exists(key(lay))
    if made:
        head.run(["mkdir", "-p", "-m", "0700", lay.watchdog_dir])
        head.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", lay.watchdog_key_comment, "-f", key(lay)])
    return head.query(["cat", f"{key(lay)}.pub"], check=False, answer=(
        f"ssh-ed25519 <public key ssh-keygen makes on {head.name}> {lay.watchdog_key_comment}" if made else None
    )).stdout.strip()


def worker_actions(worker: Conn, lay: ServiceLayout, pubkey: str) -> list[Action]:
    """rank-ctl, and the service's key allowed to run it for this service's rank only (its name is rank-ctl's
    argument: a service's watchdog never touches another's ranks on a shared node). A service also revokes the
    plain-named watchdog's key: `up` disabled that watchdog (steps/units.py, step_stale), so the key only
    opened the node to a retired head."""
    acts = []
    want = node_file("rank-ctl.sh")
    if worker.get(RANK_CTL) != want:
        acts.append(Action(f"install {RANK_CTL}", lambda: (worker.run(["mkdir", "-p", LIB_DIR]),
                                                            worker.put(RANK_CTL, want, mode=0o755))))
    command = RANK_CTL if lay.service is None else f"{RANK_CTL} {lay.service}"
    comment = lay.watchdog_key_comment
    line = f'restrict,command="{command}" {" ".join(pubkey.split()[:2])} {comment}'
    ak_path = AUTHORIZED_KEYS
    cur = (worker.get(ak_path) or b"").decode().splitlines()
    replaced = {comment, PLAIN.watchdog_key_comment}  # by the comment at the end of the line
    kept = [l for l in cur if not l.split() or l.split()[-1] not in replaced]
    if line not in cur or len(kept) != len(cur) - 1:  # ours is missing, or another line of ours is there
        new = "\n".join([*kept, line]) + "\n"
        acts.append(Action("authorize the head watchdog's key for rank-ctl only",
                           lambda: (worker.run(["mkdir", "-p", "-m", "0700", posixpath.dirname(ak_path)]),
                                    worker.put(ak_path, new.encode(), mode=0o600))))
    return acts


def head_actions(head: Conn, lay: ServiceLayout, known_lines: list[str], knobs: bytes) -> list[Action]:
    acts = []
    settings_file, known_file, units = settings_path(lay), known_hosts(lay), unit_files(lay)
    if head.get(settings_file) != knobs:
        acts.append(Action(f"write watchdog settings {knobs.decode().strip()}",
                           lambda: (head.run(["mkdir", "-p", "-m", "0700", lay.watchdog_dir]),
                                    head.put(settings_file, knobs))))
    want_py = node_file("watchdog.py")
    if head.get(WATCHDOG_PY) != want_py:
        acts.append(Action(f"install {WATCHDOG_PY}", lambda: (head.run(["mkdir", "-p", LIB_DIR]),
                                                               head.put(WATCHDOG_PY, want_py, mode=0o755))))
    known = ("\n".join(known_lines) + "\n").encode() if known_lines else b""
    if head.get(known_file) != known:
        acts.append(Action("record the workers' host keys for the watchdog",
                           lambda: (head.run(["mkdir", "-p", "-m", "0700", lay.watchdog_dir]),
                                    head.put(known_file, known))))
    changed = [p for p, data in units.items() if head.get(p) != data]
    if changed:
        def install():
            for p in changed:
                head.put(p, units[p])
            head.run(["systemctl", "daemon-reload"])
        acts.append(Action(f"install {', '.join(Path(p).name for p in changed)}", install))
    timer = lay.watchdog_timer
    if head.query(["systemctl", "is-enabled", timer], check=False).stdout.strip() != "enabled":
        acts.append(Action(f"enable {timer}", lambda: head.run(["systemctl", "enable", timer])))
    return acts
