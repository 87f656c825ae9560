#!/usr/bin/env python3
"""CPU-seconds and wall time of one sim engine start, vLLM's processes spawned (the CPU platform's way) against
forked (as on a GB10: images/sim-engine/sim_gb10.py), side by side in one run, alternating.

Each start is a container of the sim engine image on this host's Docker serving tiny-qwen3 until /health
answers; its CPU is the container's cgroup total at that moment. After it, 256 greedy tokens: decode speed and
the text's digest, which must be the same either way. Reads the cgroup (v2) files of this host's Docker.

Usage: python bench/sim_engine_start.py [--rounds 3] [--json]
Run it on an idle host (the cluster tests use the same cores).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

MODEL = "/models/tiny-qwen3"


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def container_cpu_s(cid: str) -> float:
    """CPU-seconds a container used so far: its cgroup's (v2) usage."""
    stat = next(Path("/sys/fs/cgroup").glob(f"**/docker-{cid}.scope/cpu.stat"), None) or \
        next(Path("/sys/fs/cgroup").glob(f"**/{cid}/cpu.stat"))
    return int(dict(line.split() for line in stat.read_text().splitlines())["usage_usec"]) / 1e6


def start_once(client, image: str, cache: str, spawn: bool) -> dict:
    env = {"SPARKDEPLOY_SIM_SPAWN": "1"} if spawn else {}
    c = client.containers.run(image, ["vllm", "serve", MODEL, "--port", "8000", "--max-model-len", "512",
                                      "--enforce-eager"], detach=True, shm_size="1g", environment=env,
                              volumes={cache: {"bind": "/root/.cache/vllm", "mode": "rw"}})
    try:
        t0 = time.monotonic()
        c.reload()
        base = f"http://{c.attrs['NetworkSettings']['IPAddress']}:8000"
        while True:
            c.reload()
            if c.status != "running":
                raise SystemExit(f"the engine exited: {c.logs(tail=20).decode(errors='replace')}")
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        wall = time.monotonic() - t0
        cpu = container_cpu_s(c.id)
        ask = {"model": MODEL, "prompt": "hello world, this is", "temperature": 0, "ignore_eos": True}
        _post(f"{base}/v1/completions", {**ask, "max_tokens": 8})
        t0 = time.monotonic()
        text = _post(f"{base}/v1/completions", {**ask, "max_tokens": 256})["choices"][0]["text"]
        return {"cpu_s": cpu, "wall_s": wall, "decode_tok_s": 256 / (time.monotonic() - t0),
                "text_sha": hashlib.sha256(text.encode()).hexdigest()[:12]}
    finally:
        c.remove(force=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    from sparkdeploy.sim import host_docker, images

    images.ensure_engine_image(None)
    client = host_docker.sdk().from_env()
    runs: dict[str, list[dict]] = {"spawn": [], "fork": []}
    with tempfile.TemporaryDirectory(prefix="sim-engine-start-") as cache:
        start_once(client, images.ENGINE_IMAGE, cache, spawn=True)  # fills vLLM's model-info cache, as a node's
        for i in range(args.rounds):
            for how in ("spawn", "fork"):
                runs[how].append(start_once(client, images.ENGINE_IMAGE, cache, spawn=how == "spawn"))
                print(f"round {i + 1} {how:5} {runs[how][-1]}", file=sys.stderr)
    med = {how: {k: statistics.median(r[k] for r in rs) for k in ("cpu_s", "wall_s", "decode_tok_s")}
           for how, rs in runs.items()}
    same = len({r["text_sha"] for rs in runs.values() for r in rs}) == 1
    if args.json:
        print(json.dumps({"median": med, "same_text": same, "runs": runs}, indent=2))
        return 0 if same else 1
    print(f"{'median of ' + str(args.rounds):<16} {'spawn':>8} {'fork':>8} {'fork/spawn':>11}")
    for k in ("cpu_s", "wall_s", "decode_tok_s"):
        print(f"{k:<16} {med['spawn'][k]:8.1f} {med['fork'][k]:8.1f} {med['fork'][k] / med['spawn'][k]:11.2f}")
    print(f"greedy text identical in every start: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
