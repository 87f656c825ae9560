#!/usr/bin/env python3
"""vLLM's router as sparkdeploy runs it on the router node (stdlib + vllm_router_rs; copied to the node).

The wheel's own launcher (`vllm-router`) needs fastapi, aiohttp and more on the node, cannot make the router
require an API key, and in inference-gateway mode (the one that routes by the request's `model`) ignores the
workers it is given at start. So this file starts the Rust router through its Python binding, with:

- `enable_igw`: each request goes to the workers registered for its `model`; round robin among them;
- `api_key_validation_urls` -> a key check on loopback, served here, that accepts only the services' key
  (VLLM_API_KEY from the unit's EnvironmentFile): every endpoint, the admin API (/workers) included, needs it;
  the router caches each answer;
- the workers registered (POST /workers with their model) once it listens: it keeps them in memory only, so a
  restart of this unit registers them again.

The router's start() holds the GIL while it serves, so it runs in a child process; this one (the unit's main
process) serves the key check, registers, and exits with the router's status. A failed registration, or a
router that exits, ends the unit; systemd restarts it whole.

Usage: router.py CONFIG.json   (rendered by sparkdeploy.router.config)
"""

from __future__ import annotations

import hmac
import json
import os
import signal
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def key_check_server(key: str, port: int) -> ThreadingHTTPServer:
    expected = f"Bearer {key}".encode()

    class KeyCheck(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            given = self.headers.get("Authorization", "").encode()
            self.send_response(200 if hmac.compare_digest(given, expected) else 401)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:  # every check would be a journal line
            pass

    return ThreadingHTTPServer(("127.0.0.1", port), KeyCheck)


def register(cfg: dict, key: str) -> None:
    """POST each worker once the router answers; raises when it cannot."""
    base = f"http://127.0.0.1:{cfg['port']}"
    auth = {"Authorization": f"Bearer {key}"}
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(urllib.request.Request(f"{base}/liveness", headers=auth), timeout=2).read()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    for worker in cfg["workers"]:
        req = urllib.request.Request(f"{base}/workers", data=json.dumps(worker).encode(), method="POST",
                                     headers={**auth, "Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=30).read()
        print(f"registered {worker['url']} for model {worker['model_id']}", flush=True)


def run_router(cfg: dict) -> None:
    from vllm_router_rs import PolicyType, Router

    health = cfg["health"]
    Router(worker_urls=[], policy=PolicyType.RoundRobin, host=cfg["host"], port=cfg["port"], enable_igw=True,
           api_key_validation_urls=[f"http://127.0.0.1:{cfg['key_check_port']}/"],
           prometheus_host="127.0.0.1", prometheus_port=cfg["metrics_port"],
           health_check_interval_secs=health["interval_s"], health_check_timeout_secs=health["timeout_s"],
           health_failure_threshold=health["failures"], health_success_threshold=health["successes"],
           request_timeout_secs=cfg["request_timeout_s"]).start()


def main() -> None:
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    key = os.environ["VLLM_API_KEY"]
    checks = key_check_server(key, cfg["key_check_port"])  # listening before the router can ask it
    child = os.fork()
    if child == 0:
        checks.socket.close()
        try:
            run_router(cfg)
        finally:
            os._exit(1)
    threading.Thread(target=checks.serve_forever, daemon=True).start()
    try:
        register(cfg, key)
    except Exception as err:  # noqa: BLE001 - any failure: restart whole (systemd), never serve half-registered
        print(f"registering the workers failed: {err}", file=sys.stderr, flush=True)
        os.kill(child, signal.SIGTERM)
        sys.exit(1)
    _, status = os.waitpid(child, 0)
    sys.exit(os.waitstatus_to_exitcode(status) or 1)


if __name__ == "__main__":
    main()
