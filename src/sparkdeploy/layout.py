"""Every path and name the kit owns on a node, in one place (the layout is described in `render.py`).

The planner, the steps, health, the watchdog wiring, the registry and the vocab rollout all name these; a
path written anywhere else is a bug. (The watchdog's own copy, `steps/node_files/watchdog.py`, runs on the
node with the standard library only, so it repeats the few it reads; a unit test checks they agree.)
"""

from __future__ import annotations

# ---------------------------------------------------------------------------------------------- releases
ETC_DIR = "/etc/sparkdeploy"
RELEASES_DIR = f"{ETC_DIR}/releases"  # releases/NNNN/ (numbered by sparkdeploy.releases at apply time)
CURRENT_LINK = f"{ETC_DIR}/current"  # -> releases/NNNN; the unit and launch.sh only ever name this
RELEASE_META = "release.json"
HEALTHY_MARK = "HEALTHY"  # in a release directory once it passed its health gate
SENTINEL_RECORD = "sentinel.json"  # in the head's release directory: its speed record + verdict (bench/sentinel.py)
ENV_FILE = "engine.env"
LAUNCH_FILE = "launch.sh"
NODE_PLAN_FILE = "node-plan.json"  # in each release: this node's part of the plan (its exact serve argv)
SECRETS_ENV = f"{ETC_DIR}/secrets.env"  # root-only 0600, the engine's second --env-file

# ------------------------------------------------------------------------------------------------ engine
CONTAINER_NAME = "sparkdeploy-engine"
UNIT_NAME = "sparkdeploy-engine.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT_NAME}"

# ---------------------------------------------------------------------------------------- state, caches
STATE_DIR = "/var/lib/sparkdeploy"
CACHE_HOST_DIR = f"{STATE_DIR}/cache"
VOCAB_HOST_DIR = f"{STATE_DIR}/vocab"
VOCAB_POINTER = f"{VOCAB_HOST_DIR}/current.txt"  # relative symlink to <sha256>.txt
VOCAB_CONTAINER_DIR = "/opt/sparkdeploy/vocab"  # VOCAB_HOST_DIR mounted read-only
VOCAB_CONTAINER_FILE = f"{VOCAB_CONTAINER_DIR}/current.txt"
CAPTURE_DIR = f"{STATE_DIR}/capture"  # mounted read-write at the same path: the engine's token-id counts
CAPTURE_COUNTS = f"{CAPTURE_DIR}/counts.npy"  # written by the head's engine core (spark_overlays.capture)
CAPTURE_SWITCH = f"{CAPTURE_DIR}/on"  # present: the engine counts (`vocab capture on|off`, no restart)
CAPTURE_SCHEDULER = "spark_overlays.capture.scheduler"  # the --scheduler-cls every release is rendered with

# ----------------------------------------------------------------------------------------- supervision
LIB_DIR = "/usr/local/lib/sparkdeploy"
WATCHDOG_PY = f"{LIB_DIR}/watchdog.py"
RANK_CTL = f"{LIB_DIR}/rank-ctl"
WATCHDOG_DIR = f"{ETC_DIR}/watchdog"  # its SSH key, known_hosts and settings
WATCHDOG_SERVICE = "sparkdeploy-watchdog.service"
WATCHDOG_TIMER = "sparkdeploy-watchdog.timer"
WATCHDOG_CONFIG = "watchdog.json"  # in each release
WATCHDOG_STATE = f"{STATE_DIR}/watchdog.json"

# ------------------------------------------------------------------------------------------ monitoring
EXPORTER_UNIT = "sparkdeploy-exporter.service"  # on the head (steps/monitoring.py)
EXPORTER_CONTAINER = "sparkdeploy-exporter"
EXPORTER_CODE_DIR = f"{LIB_DIR}/exporter"  # the kit's Python code the exporter runs (mounted read-only)
EXPORTER_PORT = 9466  # inventory ports.metrics; 0 = no exporter

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
