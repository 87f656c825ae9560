"""Wiring of the coupled-rank watchdog (docs/supervision.md): files, units and the head->worker control key.

Head: /usr/local/lib/sparkdeploy/watchdog.py (kit code), <release>/watchdog.json (config, part of the
release), sparkdeploy-watchdog.{service,timer}, /etc/sparkdeploy/watchdog/{id_ed25519,known_hosts}.
Workers: /usr/local/lib/sparkdeploy/rank-ctl and one line in root's authorized_keys that lets the head's
watchdog key run only rank-ctl (restrict,command=...): status | restart | stop | start of the engine unit.
"""

from __future__ import annotations

import json
from pathlib import Path

from sparkdeploy import render
from sparkdeploy.layout import (CURRENT_LINK, LIB_DIR, RANK_CTL, SECRETS_ENV, WATCHDOG_CONFIG, WATCHDOG_DIR, WATCHDOG_PY,
                                WATCHDOG_SERVICE, WATCHDOG_TIMER)
from sparkdeploy.connection import Conn
from sparkdeploy.steps.base import Action

KEY_DIR = WATCHDOG_DIR
KEY = f"{KEY_DIR}/id_ed25519"
KNOWN = f"{KEY_DIR}/known_hosts"
SERVICE = WATCHDOG_SERVICE
TIMER = WATCHDOG_TIMER
CONFIG = WATCHDOG_CONFIG
SETTINGS = f"{KEY_DIR}/settings.json"  # knobs (grace, backoff, cap): not part of a release
KEY_COMMENT = "sparkdeploy-watchdog"

_FILES = Path(__file__).parent / "node_files"


def node_file(name: str) -> bytes:
    return (_FILES / name).read_bytes()


def unit_files() -> dict[str, bytes]:
    env = render.environment()
    ctx = {"watchdog": WATCHDOG_PY, "config": f"{CURRENT_LINK}/{CONFIG}"}
    return {f"/etc/systemd/system/{SERVICE}": env.get_template(f"systemd/{SERVICE}.j2").render(**ctx).encode(),
            f"/etc/systemd/system/{TIMER}": env.get_template(f"systemd/{TIMER}.j2").render(**ctx).encode()}


def config(plan, release: str) -> bytes:
    """The release's part of the watchdog configuration (what to probe and whom to restart)."""
    head = plan.head
    workers = [{"name": n.name, "host": n.ssh.host, "port": n.ssh.port, "user": "root"} for n in plan.nodes[1:]]
    cfg = {"api_url": f"http://127.0.0.1:{plan.api_port}", "model": _served(plan), "unit": head.unit_name,
           "container": head.container_name, "workers": workers, "ssh_key": KEY, "known_hosts": KNOWN,
           "release": release, "settings": SETTINGS, "secrets_env": SECRETS_ENV}
    return (json.dumps(cfg, indent=2, sort_keys=True) + "\n").encode()


def settings(*, start_grace_s: float, backoff_base_s: float, retry_cap: int) -> bytes:
    return (json.dumps({"start_grace_s": start_grace_s, "backoff_base_s": backoff_base_s, "retry_cap": retry_cap},
                       sort_keys=True) + "\n").encode()


def _served(plan) -> str:
    argv = list(plan.head.serve_argv)
    return argv[argv.index("--served-model-name") + 1] if "--served-model-name" in argv else argv[2]


def ensure_key(head: Conn, *, dry_run: bool = False) -> str:
    """The head's watchdog key pair (made on the head, never leaves it); returns the public line. A dry run
    makes none: it reads the key that exists, else names a placeholder (the workers would be authorized anew)."""
    if not head.exists(KEY):
        if dry_run:
            return "ssh-ed25519 AAAA(made-by-up) x"
        head.run(["mkdir", "-p", "-m", "0700", KEY_DIR])
        head.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", KEY_COMMENT, "-f", KEY])
    return (head.get(f"{KEY}.pub") or b"").decode().strip()


def worker_actions(worker: Conn, pubkey: str) -> list[Action]:
    acts = []
    want = node_file("rank-ctl.sh")
    if worker.get(RANK_CTL) != want:
        acts.append(Action(f"install {RANK_CTL}", lambda: (worker.run(["mkdir", "-p", LIB_DIR]),
                                                            worker.put(RANK_CTL, want, mode=0o755))))
    line = f'restrict,command="{RANK_CTL}" {" ".join(pubkey.split()[:2])} {KEY_COMMENT}'
    ak_path = "/root/.ssh/authorized_keys"
    cur = (worker.get(ak_path) or b"").decode()
    lines = [l for l in cur.splitlines() if KEY_COMMENT not in l]
    if line not in cur.splitlines():
        new = "\n".join([*lines, line]) + "\n"
        acts.append(Action("authorize the head watchdog's key for rank-ctl only",
                           lambda: (worker.run(["mkdir", "-p", "-m", "0700", "/root/.ssh"]),
                                    worker.put(ak_path, new.encode(), mode=0o600))))
    return acts


def head_actions(head: Conn, known_lines: list[str], units: dict[str, bytes], knobs: bytes) -> list[Action]:
    acts = []
    if head.get(SETTINGS) != knobs:
        acts.append(Action(f"write watchdog settings {knobs.decode().strip()}",
                           lambda: (head.run(["mkdir", "-p", "-m", "0700", KEY_DIR]), head.put(SETTINGS, knobs))))
    want_py = node_file("watchdog.py")
    if head.get(WATCHDOG_PY) != want_py:
        acts.append(Action(f"install {WATCHDOG_PY}", lambda: (head.run(["mkdir", "-p", LIB_DIR]),
                                                               head.put(WATCHDOG_PY, want_py, mode=0o755))))
    known = ("\n".join(known_lines) + "\n").encode() if known_lines else b""
    if head.get(KNOWN) != known:
        acts.append(Action("record the workers' host keys for the watchdog",
                           lambda: (head.run(["mkdir", "-p", "-m", "0700", KEY_DIR]), head.put(KNOWN, known))))
    changed = [p for p, data in units.items() if head.get(p) != data]
    if changed:
        def install():
            for p in changed:
                head.put(p, units[p])
            head.run(["systemctl", "daemon-reload"])
        acts.append(Action(f"install {', '.join(Path(p).name for p in changed)}", install))
    if head.query(["systemctl", "is-enabled", TIMER], check=False).stdout.strip() != "enabled":
        acts.append(Action(f"enable {TIMER}", lambda: head.run(["systemctl", "enable", TIMER])))
    return acts
