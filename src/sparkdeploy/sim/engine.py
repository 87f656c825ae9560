"""Start the tiny vLLM engine across sim nodes by hand (no plan, no units): the proven two-node layout.

Rank >= 1 runs `vllm serve ... --headless` first, rank 0 last and serves the API; every container is
`--network host --ipc host --init` inside its node's own Docker engine, with `GLOO_SOCKET_IFNAME=eth0` (else gloo
may bind loopback and the pair hangs). Used by bench/sim_setup.py (the engine-start figure); deployments go through
plan/render/steps instead.
"""

from __future__ import annotations

import json
import shlex
import time
import urllib.error
import urllib.request
from typing import Sequence

from sparkdeploy import poll
from sparkdeploy.errors import SimError

CONTAINER = "sparkdeploy-sim-vllm"
API_PORT = 8000
MASTER_PORT = 29511
NGRAM = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


def serve_argv(image: str, node_ip: str, head_ip: str, rank: int, nnodes: int, *, model: str = "/models/tiny-qwen3",
               speculative: dict | None = None, extra: Sequence[str] = (), name: str = CONTAINER,
               api_port: int = API_PORT, master_port: int = MASTER_PORT) -> list[str]:
    """The `docker run` argv for one rank (run it inside the node)."""
    argv = ["docker", "run", "-d", "--name", name, "--network", "host", "--ipc", "host", "--init",
            "--restart", "unless-stopped", "--stop-timeout", "30",
            "-e", "GLOO_SOCKET_IFNAME=eth0", "-e", "TP_SOCKET_IFNAME=eth0", "-e", f"VLLM_HOST_IP={node_ip}",
            image, "vllm", "serve", model, "--served-model-name", "tiny", "--max-model-len", "512",
            "--enforce-eager"]
    if nnodes > 1:
        argv += ["-tp", str(nnodes), "--nnodes", str(nnodes), "--node-rank", str(rank), "--master-addr", head_ip,
                 "--master-port", str(master_port)]
    if speculative:
        argv += ["--speculative-config", json.dumps(speculative, separators=(",", ":"))]
    argv += list(extra)
    argv += ["--headless"] if rank > 0 else ["--host", "0.0.0.0", "--port", str(api_port)]
    return argv


def start_pair(cluster, image: str, *, speculative: dict | None = None, model: str = "/models/tiny-qwen3",
               extra: Sequence[str] = (), name: str = CONTAINER, api_port: int = API_PORT,
               master_port: int = MASTER_PORT) -> str:
    """Remove old engine containers, start workers (rank >= 1) then the head; return the API base URL."""
    state = cluster.load_state()
    nodes = state.nodes
    head = nodes[0]
    for node in nodes:
        cluster.run_on(node.name, f"docker rm -f {shlex.quote(name)} >/dev/null 2>&1; true", timeout=120)
    for rank in [*range(1, len(nodes)), 0]:
        node = nodes[rank]
        argv = serve_argv(image, node.ip, head.ip, rank, len(nodes), model=model, speculative=speculative,
                          extra=extra, name=name, api_port=api_port, master_port=master_port)
        cluster.run_on(node.name, shlex.join(argv), timeout=120)
    return f"http://{head.ip}:{api_port}"


def stop_pair(cluster, *, name: str = CONTAINER) -> None:
    for node in cluster.load_state().nodes:
        cluster.run_on(node.name, f"docker rm -f {shlex.quote(name)} >/dev/null 2>&1; true", timeout=120, check=False)


def wait_healthy(base: str, timeout: float = 420) -> float:
    """Poll `GET /health` until 200; return the seconds it took. Raises SimError on timeout."""
    t0 = time.monotonic()

    def attempt() -> None:
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=5) as resp:
                if resp.status == 200:
                    return
                raise poll.NotYet(f"HTTP {resp.status}")
        except (urllib.error.URLError, OSError) as err:
            raise poll.NotYet(type(err).__name__) from None

    try:
        poll.until(attempt, timeout=timeout, interval=1)
    except poll.TimedOut:
        raise SimError(f"{base}/health not 200 after {timeout:.0f} s; see the engine logs (`sparkdeploy sim ssh "
                       f"node1 -- docker logs {CONTAINER}`)") from None
    return time.monotonic() - t0
