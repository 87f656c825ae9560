#!/usr/bin/env python3
"""What the router costs, measured side by side in one run on a deployed inventory with `router:`:

  latency      one request at a time, alternating router / direct to the service's head (same prompt, same
               model, temperature 0, --max-tokens): p50 and p99 of each, and the p50 the router adds
  throughput   --concurrency clients for --seconds on each path, alternating paths per round: completed
               requests per second of each and router / direct

Goals (issue 16): p50 added <= 2 ms, throughput ratio >= 0.95. Usage:
  bench/router.py --inventory INVENTORY [--model NAME] [--requests 200] [--concurrency 4] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from sparkdeploy import inventory  # noqa: E402
from sparkdeploy.health import bearer  # noqa: E402
from sparkdeploy.router import plan_router  # noqa: E402


def one(session: requests.Session, base: str, model: str, headers: dict, max_tokens: int) -> float:
    t0 = time.perf_counter()
    r = session.post(f"{base}/v1/completions", headers=headers, timeout=120, json={
        "model": model, "prompt": "The capital of France is", "max_tokens": max_tokens, "temperature": 0})
    dt = time.perf_counter() - t0
    r.raise_for_status()
    return dt


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def latency(paths: dict[str, str], model: str, headers: dict, n: int, max_tokens: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {p: [] for p in paths}
    sessions = {p: requests.Session() for p in paths}
    for p, base in paths.items():  # one warm-up each: connections, the router's first key check
        one(sessions[p], base, model, headers, max_tokens)
    for i in range(n):
        order = list(paths) if i % 2 == 0 else list(reversed(paths))
        for p in order:
            out[p].append(one(sessions[p], paths[p], model, headers, max_tokens))
    return out


def throughput(base: str, model: str, headers: dict, clients: int, seconds: float, max_tokens: int) -> float:
    done = [0] * clients
    stop = time.perf_counter() + seconds

    def client(i: int) -> None:
        s = requests.Session()
        while time.perf_counter() < stop:
            one(s, base, model, headers, max_tokens)
            done[i] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inventory", "-i", required=True)
    ap.add_argument("--model", help="a model the router routes (default: the first service's)")
    ap.add_argument("--requests", type=int, default=200, help="latency: requests per path")
    ap.add_argument("--max-tokens", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=10, help="throughput: per path per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    views = inventory.load_services(args.inventory)
    rp = plan_router(views)
    if rp is None:
        print(f"{args.inventory}: no `router:` in the inventory", file=sys.stderr)
        return 2
    worker = next((w for w in rp.workers if w.model == args.model), None) if args.model else rp.workers[0]
    if worker is None:
        print(f"the router routes no model {args.model!r} ({', '.join(rp.models)})", file=sys.stderr)
        return 2
    headers = bearer(views[0].auth.api_key())
    paths = {"router": rp.url, "direct": worker.url}
    lat = latency(paths, worker.model, headers, args.requests, args.max_tokens)
    rps: dict[str, list[float]] = {p: [] for p in paths}
    for r in range(args.rounds):
        for p in (list(paths) if r % 2 == 0 else list(reversed(paths))):
            rps[p].append(throughput(paths[p], worker.model, headers, args.concurrency, args.seconds,
                                     args.max_tokens))
    res = {"model": worker.model, "router": rp.url, "direct": worker.url, "requests": args.requests,
           "max_tokens": args.max_tokens, "concurrency": args.concurrency}
    for p in paths:
        res[p] = {"p50_ms": round(1000 * statistics.median(lat[p]), 2), "p99_ms": round(1000 * pct(lat[p], 0.99), 2),
                  "rps": round(statistics.median(rps[p]), 2)}
    res["p50_added_ms"] = round(res["router"]["p50_ms"] - res["direct"]["p50_ms"], 2)
    res["throughput_ratio"] = round(res["router"]["rps"] / res["direct"]["rps"], 3)
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print(f"model {worker.model}: router {rp.url} vs direct {worker.url}, {args.requests} requests each "
          f"(max_tokens {args.max_tokens}); throughput: {args.concurrency} clients, {args.rounds} x {args.seconds:.0f} s")
    print(f"{'path':<8} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8}")
    for p in paths:
        print(f"{p:<8} {res[p]['p50_ms']:>8} {res[p]['p99_ms']:>8} {res[p]['rps']:>8}")
    print(f"p50 added by the router: {res['p50_added_ms']} ms (goal <= 2); throughput router/direct: "
          f"{res['throughput_ratio']} (goal >= 0.95)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
