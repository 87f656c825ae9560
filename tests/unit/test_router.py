"""The router: `router:` in the inventory, its plan (workers by model), its unit and files, and the launcher that
runs vLLM's real router core (`vllm_router_rs` from the vllm-router wheel) on the node.

The launcher test runs the real router; the two engines behind it are stand-ins (stdlib HTTP servers that say
which of them answered and what Authorization they were sent), because what is checked is where the router
sends each request. The four-node cluster test (tests/cluster/test_services.py) routes to real vLLM engines."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests
import yaml

from sparkdeploy.cli import main
from sparkdeploy.model import inventory
from sparkdeploy.node import layout
from sparkdeploy.plan.router import plan_router, router_files
from sparkdeploy.steps import router as router_step
from tests.support.http_json import send_json
from tests.support.vllm_server import venv_python
from tests.unit.test_services import FIXTURES, _sim_services, _write

KEY = "sk-test-0123456789"


def _with_router(**router) -> dict:
    data = _sim_services()
    data["services"][1]["served_name"] = "tiny-b"
    data.update(router={"node": "node1", **router}, auth={"api_key_file": "api_key"})
    return data


def test_the_router_plan_sends_each_model_to_its_service_head(tmp_path):
    views = inventory.load_services(_write(tmp_path, _with_router(port=8090)))
    rp = plan_router(views)
    assert rp.url == "http://172.30.97.11:8090" and rp.models == ("tiny", "tiny-b")
    assert [(w.service, w.model, w.url) for w in rp.workers] == [
        ("a", "tiny", "http://172.30.97.11:8000"), ("b", "tiny-b", "http://172.30.97.13:8001")]
    cfg = json.loads(rp.config())
    assert cfg["port"] == 8090 and cfg["host"] == "0.0.0.0"
    assert cfg["workers"] == [{"url": "http://172.30.97.11:8000", "model_id": "tiny"},
                              {"url": "http://172.30.97.13:8001", "model_id": "tiny-b"}]
    assert cfg["health"]["interval_s"] < 60  # the router's own default keeps a dead engine ~3 min
    unit = router_files(rp)[layout.ROUTER_UNIT].decode()
    assert f"EnvironmentFile={layout.ROUTER_SECRETS}" in unit
    assert f"ExecStart=/usr/bin/python3 {layout.ROUTER_DIR}/router.py {layout.ROUTER_CONFIG}" in unit
    assert "Restart=always" in unit and "DynamicUser=yes" in unit
    assert plan_router(inventory.load_services(_write(tmp_path, _sim_services()))) is None


def test_a_router_without_services_exits_2(tmp_path, capsys):
    data = yaml.safe_load((FIXTURES / "inventory.sim.yaml").read_text())
    data.update(router={"node": "node1"}, auth={"api_key_file": "api_key"})
    assert main(["plan", "--inventory", str(_write(tmp_path, data))]) == 2
    assert "router" in (err := capsys.readouterr().err) and "needs `services:`" in err


def test_two_profiles_under_one_model_name_exit_2_naming_the_field(tmp_path, capsys):
    data = _with_router()
    data["services"][1].update(profile="sim-tiny-next-mtp", served_name="tiny")
    assert main(["plan", "--inventory", str(_write(tmp_path, data))]) == 2
    err = capsys.readouterr().err
    assert "services[1].served_name" in err and "also service a's model name" in err


def test_served_name_overrides_the_profiles(tmp_path):
    a, b = inventory.load_services(_write(tmp_path, _with_router()))
    assert (a.profile.served_name, b.profile.served_name) == ("tiny", "tiny-b")


# ----------------------------------------------------------------------------------- the real router core
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Engine:
    """A stand-in engine: serves one model, records the Authorization of each completion it answers."""

    def __init__(self, model: str):
        self.model, self.seen = model, []
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                send_json(self, {"object": "list", "data": [{"id": engine.model}]} if self.path == "/v1/models"
                          else {})

            def do_POST(self):
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                engine.seen.append(self.headers.get("Authorization"))
                if req.get("stream"):  # three server-sent events half a second apart, as a slow decode sends them
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.end_headers()
                    for i in range(3):
                        self.wfile.write(f"data: {json.dumps({'served_by': engine.model, 'i': i})}\n\n".encode())
                        self.wfile.flush()
                        time.sleep(0.5)
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.close_connection = True
                    return
                send_json(self, {"model": req["model"], "served_by": engine.model, "choices": [{"text": "x"}]})

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def router_code(tmp_path_factory):
    """The files `up` installs on a node of this machine's kind, unpacked as on the node."""
    archive, digest = router_step.code_archive(os.uname().machine)
    dest = tmp_path_factory.mktemp("router")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        names = tar.getnames()
        tar.extractall(dest)
    assert "router.py" in names and "vllm_router_rs.abi3.so" in names
    assert any(n.startswith("vllm_router.libs/") for n in names)  # the libssl etc. the .so loads
    assert router_step.code_archive(os.uname().machine)[1] == digest  # stable: an unchanged node is left alone
    return dest


SDK_CLIENT = """
import sys, openai
client = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key=sys.argv[2])
ids = " ".join(m.id for m in client.models.list())
try:
    client.completions.create(model=sys.argv[3], prompt="hi", max_tokens=1)
    print(ids + "; answered")
except openai.APIStatusError as err:
    print(ids + "; " + type(err).__name__ + " " + err.body["code"])
"""


def openai_sdk(url: str, key: str = KEY, unknown: str = "model-z") -> str | None:
    """What OpenAI's own SDK (from the vLLM venv: a dependency of vLLM) makes of the router: the ids its
    models.list() parses, and the error a request for an unknown model raises; None without that venv."""
    python = venv_python()
    if python is None:
        return None
    r = subprocess.run([str(python), "-c", SDK_CLIENT, url, key, unknown], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.strip()


def start_launcher(router_code: Path, tmp_path: Path, workers: dict[str, str],
                   owners: dict[str, str]) -> tuple[subprocess.Popen, str]:
    """The launcher as the unit runs it, on this machine's loopback, with `workers` (url -> model) and `owners`
    (model -> service) and a health check every second; returns the process (its own session: the router
    core it forks goes with it) and its URL."""
    port = _free_port()
    cfg = {"host": "127.0.0.1", "port": port, "core_port": _free_port(), "key_check_port": _free_port(),
           "metrics_port": _free_port(), "request_timeout_s": 60,
           "health": {"interval_s": 1, "timeout_s": 1, "failures": 1, "successes": 1},
           "workers": [{"url": u, "model_id": m} for u, m in workers.items()],
           "models": [{"id": m, "owned_by": o} for m, o in owners.items()]}
    (tmp_path / "router.json").write_text(json.dumps(cfg))
    proc = subprocess.Popen([sys.executable, str(router_code / "router.py"), str(tmp_path / "router.json")],
                            env={**os.environ, "VLLM_API_KEY": KEY, "PYTHONPATH": str(router_code)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    return proc, f"http://127.0.0.1:{port}"


@pytest.mark.slow
def test_the_launcher_routes_by_model_behind_the_key_and_stops_sending_to_a_dead_engine(router_code, tmp_path):
    a, b = _Engine("model-a"), _Engine("model-b")
    proc, url = start_launcher(router_code, tmp_path, {a.url: "model-a", b.url: "model-b"},
                               {"model-a": "svc-a", "model-b": "svc-b"})
    auth = {"Authorization": f"Bearer {KEY}"}
    try:
        listed = {}
        for _ in range(100):
            try:
                listed = requests.get(f"{url}/v1/models", headers=auth, timeout=2).json()
            except (requests.RequestException, ValueError):
                pass
            if listed.get("data"):
                break
            time.sleep(0.2)
        # OpenAI's list, as its SDK's models.list() parses it
        assert listed["object"] == "list" and [(m["id"], m["object"], m["owned_by"]) for m in listed["data"]] == [
            ("model-a", "model", "svc-a"), ("model-b", "model", "svc-b")]
        assert all(isinstance(m["created"], int) for m in listed["data"])
        assert requests.get(f"{url}/v1/models/model-b", headers=auth, timeout=5).json()["id"] == "model-b"
        assert openai_sdk(url) in (None, "model-a model-b; NotFoundError model_not_found")
        # every route needs the key, the admin API that adds workers too
        assert requests.get(f"{url}/v1/models", timeout=5).status_code == 401
        assert requests.get(f"{url}/workers", headers={"Authorization": "Bearer wrong"}, timeout=5).status_code == 401
        assert requests.post(f"{url}/workers", json={"url": "http://127.0.0.1:9", "model_id": "evil"},
                             timeout=5).status_code == 401

        def ask(model: str) -> requests.Response:
            return requests.post(f"{url}/v1/completions", headers=auth, timeout=10,
                                 json={"model": model, "prompt": "hi", "max_tokens": 1})

        for _ in range(3):
            for model in ("model-a", "model-b"):
                r = ask(model)
                assert r.status_code == 200 and r.json()["served_by"] == model
        assert a.seen == [f"Bearer {KEY}"] * 3 and b.seen == [f"Bearer {KEY}"] * 3  # the key reaches the engine

        # a model nobody serves: OpenAI's 404 naming it, sent to no engine
        r = ask("model-z")
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        assert "`model-z`" in r.json()["error"]["message"] and r.json()["error"]["param"] == "model"
        assert requests.get(f"{url}/v1/models/model-z", headers=auth, timeout=5).status_code == 404
        assert len(a.seen) == len(b.seen) == 3

        # a stream passes through event by event: the first arrives before the engine sends the last
        t0 = time.monotonic()
        with requests.post(f"{url}/v1/chat/completions", headers=auth, stream=True, timeout=10,
                           json={"model": "model-b", "messages": [], "stream": True}) as r:
            assert r.headers["Content-Type"] == "text/event-stream"
            events = [(time.monotonic() - t0, line) for line in r.iter_lines() if line]
        assert [json.loads(e[len(b"data: "):])["i"] for _, e in events[:3]] == [0, 1, 2]
        assert events[-1][1] == b"data: [DONE]" and events[0][0] < 0.4 < 1.0 < events[-1][0], events
        b.seen.pop()

        a.stop()
        codes = []
        for _ in range(10):
            codes.append(ask("model-a").status_code)
            assert ask("model-b").json()["served_by"] == "model-b"  # the other model never stops answering
            time.sleep(0.3)
        assert codes[-1] == 503, codes  # out of the rotation: refused at once, not sent to the dead engine
        assert len(b.seen) == 13

        # the router dies: the launcher (the unit's main process) ends with it, so systemd restarts both
        child = int(open(f"/proc/{proc.pid}/task/{proc.pid}/children").read().split()[0])
        os.kill(child, signal.SIGKILL)
        assert proc.wait(timeout=20) != 0
    finally:
        proc.kill()
        out = proc.communicate(timeout=20)[0]
        b.stop()
    assert "registered" in out and "model-b" in out
