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
  restart of this unit registers them again;
- an OpenAI front on the public port, the router core on loopback behind it: the core lists models as
  `{"models": [...]}`, which OpenAI's SDK, Open WebUI and agent frameworks cannot parse, and sends a model no
  worker serves to any worker. The front answers `GET /v1/models` (and `/v1/models/ID`) in OpenAI's shape and a
  request naming an unknown `model` with OpenAI's 404, after checking the key; every other request, streams
  included, goes to the core unchanged, chunk by chunk.

The router's start() holds the GIL while it serves, so it runs in a child process; this one (the unit's main
process) serves the key check and the front, registers, and exits with the router's status. A failed registration, or a
router that exits, ends the unit; systemd restarts it whole.

Usage: router.py CONFIG.json   (rendered by sparkdeploy.plan.router.config)
"""

from __future__ import annotations

import hmac
import http.client
import json
import os
import signal
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-authorization",
              "proxy-authenticate", "content-length", "host"}


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


def openai_error(message: str, kind: str, code: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def front_server(cfg: dict, key: str, created: int, registered: threading.Event) -> ThreadingHTTPServer:
    """The public port: OpenAI's model list (once the workers are `registered` with the core: a list is a promise
    that the models answer) and 404 for an unknown model here, the rest to the core."""
    expected = f"Bearer {key}".encode()
    models = {m["id"]: {"id": m["id"], "object": "model", "created": created, "owned_by": m["owned_by"]}
              for m in cfg["models"]}

    class Front(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive for clients; chunked streams back

        def _json(self, code: int, obj: dict) -> None:
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _handle(self) -> None:
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():  # OpenAI clients send a length
                self.close_connection = True
                return self._json(411, openai_error("send the request body with a Content-Length",
                                                    "invalid_request_error", "length_required"))
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if not hmac.compare_digest(self.headers.get("Authorization", "").encode(), expected):
                return self._json(401, openai_error("a valid API key is required (Authorization: Bearer KEY)",
                                                    "invalid_request_error", "invalid_api_key"))
            path = self.path.split("?", 1)[0].rstrip("/")
            if self.command == "GET" and path == "/v1/models":
                if not registered.is_set():
                    return self._json(503, openai_error("the router is starting: its workers are not registered "
                                                        "yet", "server_error", "router_starting"))
                return self._json(200, {"object": "list", "data": list(models.values())})
            if self.command == "GET" and path.startswith("/v1/models/"):
                return self._known(path[len("/v1/models/"):], lambda m: self._json(200, models[m]))
            if self.command == "POST" and path.startswith("/v1/"):
                try:
                    asked = json.loads(body).get("model")
                except (ValueError, AttributeError):
                    asked = None
                if isinstance(asked, str):
                    return self._known(asked, lambda _m: self._forward(body))
            self._forward(body)

        def _known(self, model: str, then) -> None:
            if model in models:
                return then(model)
            self._json(404, openai_error(f"The model `{model}` does not exist (served here: "
                                         f"{', '.join(models)}).", "invalid_request_error", "model_not_found",
                                         "model"))

        def _forward(self, body: bytes) -> None:
            core = http.client.HTTPConnection("127.0.0.1", cfg["core_port"], timeout=cfg["request_timeout_s"])
            answered = False
            try:
                core.request(self.command, self.path, body=body or None,
                             headers={k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP})
                resp = core.getresponse()
                answered = True
                self.send_response(resp.status, resp.reason)
                for k, v in resp.getheaders():
                    if k.lower() not in HOP_BY_HOP:
                        self.send_header(k, v)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                while chunk := resp.read1(65536):  # as the core sends it: a stream's events are not held back
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
            except OSError as err:  # the core down, or the client gone mid-stream
                print(f"{self.command} {self.path}: {err}", file=sys.stderr, flush=True)
                if answered:
                    self.close_connection = True
                else:
                    self._json(502, openai_error(f"the router core did not answer: {err}", "server_error",
                                                 "router_unavailable"))
            finally:
                core.close()

        do_GET = do_POST = do_PUT = do_DELETE = _handle

        def log_message(self, *args) -> None:  # the core logs each request already
            pass

    return ThreadingHTTPServer((cfg["host"], cfg["port"]), Front)


def register(cfg: dict, key: str) -> None:
    """POST each worker once the router core answers; raises when it cannot."""
    base = f"http://127.0.0.1:{cfg['core_port']}"
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
    Router(worker_urls=[], policy=PolicyType.RoundRobin, host="127.0.0.1", port=cfg["core_port"], enable_igw=True,
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
    registered = threading.Event()
    front = front_server(cfg, key, int(time.time()), registered)
    child = os.fork()
    if child == 0:
        checks.socket.close()
        front.socket.close()
        try:
            run_router(cfg)
        finally:
            os._exit(1)
    threading.Thread(target=checks.serve_forever, daemon=True).start()
    threading.Thread(target=front.serve_forever, daemon=True).start()
    try:
        register(cfg, key)
        registered.set()
    except Exception as err:  # noqa: BLE001 - any failure: restart whole (systemd), never serve half-registered
        print(f"registering the workers failed: {err}", file=sys.stderr, flush=True)
        os.kill(child, signal.SIGTERM)
        sys.exit(1)
    _, status = os.waitpid(child, 0)
    sys.exit(os.waitstatus_to_exitcode(status) or 1)


if __name__ == "__main__":
    main()
