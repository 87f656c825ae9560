"""`up`'s router step, after the services: vLLM's router as `sparkdeploy-router.service` on inventory
`router.node` (the plan: sparkdeploy/router.py), and gone from every other node.

The node needs no Python package: the router's Rust core (`vllm_router_rs.abi3.so` and the libraries auditwheel
bundled with it) is taken from the vllm-router wheel for the node's machine (`pip download` on this machine,
kept in the cache) and run by the node's own python3 through node/scripts/router_launcher.py. The API key goes to a
root-only file that systemd reads. Any change of code, config, key or unit restarts the router (it starts in
about half a second and registers the workers again); then `up` waits until it lists every service's model.
"""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import requests

from sparkdeploy import paths, poll
from sparkdeploy.errors import SparkdeployError
from sparkdeploy.model import credentials
from sparkdeploy.model.inventory import Inventory
from sparkdeploy.node import layout
from sparkdeploy.node.scripts import SCRIPTS
from sparkdeploy.ops import health
from sparkdeploy.plan.router import ROUTER_VERSION, RouterPlan, plan_router, unit
from sparkdeploy.remote.connection import Conn
from sparkdeploy.remote.ssh import Pool, target_of
from sparkdeploy.steps.base import Action, Outcome, run_step

UNIT_PATH = f"/etc/systemd/system/{layout.ROUTER_UNIT}"
DIGEST_FILE = f"{layout.ROUTER_DIR}/DIGEST"
LAUNCHER = SCRIPTS / "router_launcher.py"
READY_TIMEOUT_S = 60


class RouterError(SparkdeployError):
    pass


def wheel(machine: str) -> Path:
    """The vllm-router wheel for `machine` (uname -m), downloaded once into the cache."""
    dest = paths.cache_dir() / "wheels"
    pattern = f"vllm_router-{ROUTER_VERSION}-cp38-abi3-manylinux_2_28_{machine}.whl"
    if not (dest / pattern).is_file():
        argv = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                "--implementation", "cp", "--python-version", "3.8", "--abi", "abi3",
                "--platform", f"manylinux_2_28_{machine}", f"vllm-router=={ROUTER_VERSION}", "-d", str(dest)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        if done.returncode != 0 or not (dest / pattern).is_file():
            raise RouterError(f"could not download vllm-router {ROUTER_VERSION} for {machine}: "
                              f"{(done.stderr or done.stdout).strip()[-300:]} (put {pattern} in {dest} to go on "
                              "without an index)")
    return dest / pattern


def code_archive(machine: str) -> tuple[bytes, str]:
    """The router's files for the node as a tar (the wheel's native part + the launcher) and its digest."""
    buf, digest = io.BytesIO(), hashlib.sha256()
    with zipfile.ZipFile(wheel(machine)) as whl, tarfile.open(fileobj=buf, mode="w") as tar:
        members = [(m, whl.read(m)) for m in sorted(whl.namelist())
                   if (m.startswith("vllm_router_rs") or m.startswith("vllm_router.libs/")) and not m.endswith("/")]
        for name, data in [*members, ("router.py", LAUNCHER.read_bytes())]:
            digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755 if name.endswith(".so") or ".so." in name else 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue(), digest.hexdigest()


def install(c: Conn, rp: RouterPlan, secrets: bytes) -> list[Action]:
    """What makes this node run the router of `rp`."""
    acts: list[Action] = []
    machine = c.query(["uname", "-m"]).stdout.strip()
    archive, digest = code_archive(machine)
    if (c.get(DIGEST_FILE) or b"").decode().strip() != digest:
        def install_code() -> None:
            new = f"{layout.ROUTER_DIR}.new"
            c.run(["sh", "-c", f'rm -rf "$1" && mkdir -p "$1" && tar -xf - -C "$1" && echo {digest} > "$1/DIGEST" '
                               f'&& rm -rf "$2" && mv "$1" "$2"', "install", new, layout.ROUTER_DIR],
                  input=archive, timeout=300)
        acts.append(Action(f"install vllm-router {ROUTER_VERSION} ({machine}, {len(archive) >> 20} MiB) in "
                           f"{layout.ROUTER_DIR}", install_code))
    for path, data, mode, what in ((layout.ROUTER_CONFIG, rp.config(), 0o644, "its workers: " + ", ".join(
            f"{w.model} at {w.url}" for w in rp.workers)), (layout.ROUTER_SECRETS, secrets, 0o600, "the API key"),
            (UNIT_PATH, unit(rp), 0o644, "the unit")):
        if c.get(path) != data:
            acts.append(Action(f"write {path} ({what})", lambda path=path, data=data, mode=mode: (
                c.run(["mkdir", "-p", str(Path(path).parent)]), c.put(path, data, mode=mode, owner="root:root"))))
    if acts:
        acts.append(Action("daemon-reload", lambda: c.run(["systemctl", "daemon-reload"])))
    if c.query(["systemctl", "is-enabled", layout.ROUTER_UNIT], check=False).stdout.strip() != "enabled":
        acts.append(Action(f"enable {layout.ROUTER_UNIT}", lambda: c.run(["systemctl", "enable", layout.ROUTER_UNIT])))
    if acts or not c.query(["systemctl", "is-active", "--quiet", layout.ROUTER_UNIT], check=False).ok:
        acts.append(Action(f"(re)start {layout.ROUTER_UNIT} on port {rp.port}",
                           lambda: c.run(["systemctl", "restart", layout.ROUTER_UNIT], timeout=60)))
    return acts


def retire(c: Conn, why: str) -> list[Action]:
    if not c.exists(UNIT_PATH):
        return []
    return [Action(f"stop, disable and remove {layout.ROUTER_UNIT} ({why})", lambda: c.sh(
        f"systemctl disable --now {layout.ROUTER_UNIT}; rm -rf {UNIT_PATH} {layout.ROUTER_DIR} "
        f"{Path(layout.ROUTER_CONFIG).parent}; systemctl daemon-reload", check=False))]


def step_router(views: tuple[Inventory, ...], *, dry_run: bool, trust_new_hosts: bool = False,
                log=print) -> list[Outcome]:
    """Converge the router of `views` (every service of an inventory with `services:`); then, unless a dry run,
    wait until it lists every service's model. Raises StepFailed / RouterError."""
    rp = plan_router(views)
    nodes = {n.name: n for v in views for n in v.nodes}
    if rp is not None:
        nodes.setdefault(rp.node.name, rp.node)
    secrets = credentials.env_file(views[0].auth.engine_env())
    with Pool([target_of(n.name, n.ssh) for n in nodes.values()], trust_new_hosts=trust_new_hosts) as pool:
        errors = pool.open()
        if errors:
            raise RouterError("router: cannot reach " + "; ".join(f"{n}: {e}" for n, e in errors.items()))

        def diff(name: str) -> list[Action]:
            c = pool.conns[name]
            if rp is not None and name == rp.node.name:
                return install(c, rp, secrets)
            return retire(c, "the inventory names no router" if rp is None else f"the router is on {rp.node.name}")

        out = run_step("router", list(nodes), diff, dry_run=dry_run, log=log)
    if rp is not None and not dry_run:
        wait_listing(rp, views[0].auth.api_key())
    return out


def wait_listing(rp: RouterPlan, api_key: str | None, timeout: float = READY_TIMEOUT_S) -> list[str]:
    """Until the router lists every model it routes (it registers them once it listens)."""
    def attempt() -> list[str]:
        try:
            listed = listed_models(rp, api_key)
        except (requests.RequestException, ValueError) as err:
            raise poll.NotYet(f"{type(err).__name__}: {err}") from None
        if not set(rp.models) <= set(listed):
            raise poll.NotYet(f"lists {listed}")
        return listed

    try:
        return poll.until(attempt, timeout=timeout, interval=0.5)
    except poll.TimedOut as out:
        raise RouterError(f"the router at {rp.url} did not list {', '.join(rp.models)} within {timeout:.0f} s "
                          f"({out.last}); see `journalctl -u {layout.ROUTER_UNIT}` on {rp.node.name}") from None


def listed_models(rp: RouterPlan, api_key: str | None) -> list[str]:
    """The model ids of the router's /v1/models (OpenAI's list, which the launcher's front serves once the
    workers are registered)."""
    r = requests.get(f"{rp.url}/v1/models", headers=health.bearer(api_key), timeout=5)
    r.raise_for_status()
    return [m["id"] for m in r.json()["data"]]
