"""Every path and name the kit owns on a node, in one place (the layout is described in `plan/render.py`).

The planner, the steps, health, the watchdog wiring, the registry and the vocab rollout all name these; a
path written anywhere else is a bug. (The watchdog's own copy, `node/scripts/watchdog.py`, runs on the
node with the standard library only, so it repeats the few it reads; a unit test checks they agree.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ETC_DIR = "/etc/sparkdeploy"
STATE_DIR = "/var/lib/sparkdeploy"
LIB_DIR = "/usr/local/lib/sparkdeploy"
SYSTEMD_DIR = "/etc/systemd/system"

# ------------------------------------------------------------------------- in each release directory
RELEASE_META = "release.json"
HEALTHY_MARK = "HEALTHY"  # in a release directory once it passed its health gate
SENTINEL_RECORD = "sentinel.json"  # in the head's release directory: its speed record + verdict (bench/sentinel.py)
ENV_FILE = "engine.env"
LAUNCH_FILE = "launch.sh"
NODE_PLAN_FILE = "node-plan.json"  # in each release: this node's part of the plan (its exact serve argv)
WATCHDOG_CONFIG = "watchdog.json"  # in each release

# ------------------------------------------------------------------------------- shared by every service
CACHE_HOST_DIR = f"{STATE_DIR}/cache"  # warm-start caches: one per node, whatever the services
VOCAB_CONTAINER_DIR = "/opt/sparkdeploy/vocab"  # the service's vocab dir, mounted read-only in its engine
VOCAB_CONTAINER_FILE = f"{VOCAB_CONTAINER_DIR}/current.txt"
CAPTURE_SCHEDULER = "spark_overlays.capture.scheduler"  # the --scheduler-cls every release is rendered with
WATCHDOG_PY = f"{LIB_DIR}/watchdog.py"
RANK_CTL = f"{LIB_DIR}/rank-ctl"
EXPORTER_CODE_DIR = f"{LIB_DIR}/exporter"  # the kit's Python code the exporter runs (mounted read-only)
EXPORTER_PORT = 9466  # inventory ports.metrics; 0 = no exporter


def build_lock(tag: str) -> str:
    """The lock that makes builds of one image tag on one machine wait for each other (steps/image.build)."""
    return "/run/lock/sparkdeploy-build-" + re.sub(r"[^A-Za-z0-9_.-]", "_", tag) + ".lock"


@dataclass(frozen=True)
class ServiceLayout:
    """Where one service lives on a node. An inventory without `services:` is one service under the plain names
    (`sparkdeploy-engine.service`, /etc/sparkdeploy/current, ...); each entry of `services:` gets its own, named
    after it (`sparkdeploy-engine-<name>.service`, /etc/sparkdeploy/services/<name>/current, ...), so services
    can share a node: releases, units, containers, watchdog, exporter, vocab and capture never collide."""

    service: str | None = None
    etc_root: str = ETC_DIR  # the roots are moved only by tests (a temp dir through a local connection)
    state_root: str = STATE_DIR
    systemd_dir: str = SYSTEMD_DIR

    @property
    def _suffix(self) -> str:
        return "" if self.service is None else f"-{self.service}"

    @property
    def etc_dir(self) -> str:
        return self.etc_root if self.service is None else f"{self.etc_root}/services/{self.service}"

    @property
    def state_dir(self) -> str:
        return self.state_root if self.service is None else f"{self.state_root}/services/{self.service}"

    # releases
    @property
    def releases_dir(self) -> str:  # releases/NNNN/ (numbered by sparkdeploy.ops.releases at apply time)
        return f"{self.etc_dir}/releases"

    @property
    def current_link(self) -> str:  # -> releases/NNNN; the unit and launch.sh only ever name this
        return f"{self.etc_dir}/current"

    @property
    def secrets_env(self) -> str:  # root-only 0600, the engine's second --env-file
        return f"{self.etc_dir}/secrets.env"

    # engine
    @property
    def container(self) -> str:
        return f"sparkdeploy-engine{self._suffix}"

    @property
    def unit(self) -> str:
        return f"sparkdeploy-engine{self._suffix}.service"

    @property
    def unit_path(self) -> str:
        return f"{self.systemd_dir}/{self.unit}"

    # draft vocabulary and traffic capture
    @property
    def vocab_host_dir(self) -> str:
        return f"{self.state_dir}/vocab"

    @property
    def vocab_pointer(self) -> str:  # relative symlink to <sha256>.txt
        return f"{self.vocab_host_dir}/current.txt"

    @property
    def capture_dir(self) -> str:  # mounted read-write at the same path: the engine's token-id counts
        return f"{self.state_dir}/capture"

    @property
    def capture_counts(self) -> str:  # written by the head's engine core (spark_overlays.capture)
        return f"{self.capture_dir}/counts.npy"

    @property
    def capture_switch(self) -> str:  # present: the engine counts (`vocab capture on|off`, no restart)
        return f"{self.capture_dir}/on"

    # supervision
    @property
    def watchdog_dir(self) -> str:  # its SSH key, known_hosts and settings
        return f"{self.etc_dir}/watchdog"

    @property
    def watchdog_service(self) -> str:
        return f"sparkdeploy-watchdog{self._suffix}.service"

    @property
    def watchdog_timer(self) -> str:
        return f"sparkdeploy-watchdog{self._suffix}.timer"

    @property
    def watchdog_state(self) -> str:
        return f"{self.state_dir}/watchdog.json"

    @property
    def watchdog_key_comment(self) -> str:  # marks its line in a worker's authorized_keys
        return f"sparkdeploy-watchdog{self._suffix}"

    # monitoring
    @property
    def exporter_unit(self) -> str:  # on the head (steps/monitoring.py)
        return f"sparkdeploy-exporter{self._suffix}.service"

    @property
    def exporter_unit_path(self) -> str:
        return f"{self.systemd_dir}/{self.exporter_unit}"

    @property
    def exporter_container(self) -> str:
        return f"sparkdeploy-exporter{self._suffix}"


PLAIN = ServiceLayout()  # an inventory without `services:`


# ------------------------------------------------------------------------------------- image registry
REGISTRY_PORT = 5443  # on the head's data-plane address
REGISTRY_CONFIG_DIR = f"{ETC_DIR}/registry"
REGISTRY_STORAGE_DIR = f"{STATE_DIR}/registry"
REGISTRY_UNIT = "sparkdeploy-registry.service"

# --------------------------------------------------------------------------------------------- router
ROUTER_UNIT = "sparkdeploy-router.service"  # on inventory router.node (steps/router.py)
ROUTER_DIR = f"{LIB_DIR}/router"  # vllm_router_rs.abi3.so from the vllm-router wheel + the launcher
ROUTER_CONFIG = f"{ETC_DIR}/router/router.json"
ROUTER_SECRETS = f"{ETC_DIR}/router/secrets.env"  # root-only 0600: the services' API key, which it requires
ROUTER_METRICS_PORT = 29080  # its Prometheus endpoint, on loopback
ROUTER_KEY_CHECK_PORT = 29081  # the launcher's key check the router asks, on loopback
ROUTER_CORE_PORT = 29082  # the router core, on loopback: the launcher's OpenAI front (router.port) forwards to it
