#!/usr/bin/env python3
"""What the router costs, measured side by side in one run on a deployed inventory with `router:`:

  latency      one request at a time, alternating router / direct to the service's head (same prompt, same
               model, temperature 0, --max-tokens): p50 and p99 of each, and the p50 the router adds
  throughput   --concurrency clients for --seconds on each path, in --rounds pairs of adjacent windows (the
               order alternating, router-direct then direct-router): completed requests per second of each, the
               ratio router / direct of each pair, and per block of two pairs (each path once first, once
               second), whose median is the figure, with its distribution-free 95% interval (a noisy shared
               host drifts between pairs far more than within one, and a window runs slower second than first)
  CPU          the router unit's CPU time per request it carried, and the router node's whole busy CPU time
               per request in the direct windows (both from /proc, read over SSH): their quotient is what the
               router can cost where the node's CPU is the bottleneck (a sim node shares this host's cores,
               so there it is the whole host's; a GB10 has 20 cores beside a GPU-bound engine)

Goals (issue 16): p50 added <= 2 ms, throughput ratio >= 0.95. Usage:
  bench/router.py --inventory INVENTORY [--model NAME] [--requests 200] [--concurrency 4] [--rounds 20] [--json]
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

from sparkdeploy.bench.stats import median_ci95  # noqa: E402
from sparkdeploy.model import inventory
from sparkdeploy.node import layout
from sparkdeploy.ops.health import bearer  # noqa: E402
from sparkdeploy.plan.router import plan_router  # noqa: E402
from sparkdeploy.remote.ssh import connect, target_of  # noqa: E402


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


def throughput(base: str, model: str, headers: dict, clients: int, seconds: float, max_tokens: int) -> tuple[float, int]:
    """Completed requests per second, and how many completed."""
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
    return sum(done) / (time.perf_counter() - t0), sum(done)


# The router unit's processes (the launcher and the router it forks), their user + system CPU ticks summed, and
# the tick rate: from /proc, as systemd's CPUUsageNSec needs CPU accounting (off on cgroup v1 hosts, the sim's).
_CPU_TICKS = r"""
main=$(systemctl show -p MainPID --value "$1")
[ "${main:-0}" -gt 0 ] || exit 1
t=0
for p in $main $(pgrep -P "$main"); do t=$((t + $(cut -d')' -f2 /proc/$p/stat | awk '{print $12 + $13}'))); done
echo "$t $(getconf CLK_TCK)"
"""


# The node's busy CPU ticks (user, nice, system, irq, softirq, steal) and the tick rate.
_NODE_TICKS = "awk '/^cpu /{print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat; getconf CLK_TCK"


def cpu_ns(conn, what: str) -> int | None:
    """CPU time so far, in ns, of the router (`what` = "router") or of the whole node (None: not readable)."""
    argv = ["sh", "-c", _CPU_TICKS, "cpu", layout.ROUTER_UNIT] if what == "router" else ["sh", "-c", _NODE_TICKS]
    res = conn.query(argv, check=False)
    parts = res.stdout.split()
    return int(parts[0]) * 10**9 // int(parts[1]) if res.rc == 0 and len(parts) == 2 else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inventory", "-i", required=True)
    ap.add_argument("--model", help="a model the router routes (default: the first service's)")
    ap.add_argument("--requests", type=int, default=200, help="latency: requests per path")
    ap.add_argument("--max-tokens", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=5, help="throughput: per path per round")
    ap.add_argument("--rounds", type=int, default=20, help="throughput: pairs of windows")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.rounds < 2 or args.rounds % 2:
        ap.error("--rounds: an even number >= 2 (blocks of two pairs, each path first once)")

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
    conn = connect(target_of(rp.node.name, rp.node.ssh))
    rps: dict[str, list[float]] = {p: [] for p in paths}
    ratios = []
    cpu = {"router": [0, 0], "direct": [0, 0]}  # ns, requests: the router's own in router windows, the node's in
    for r in range(args.rounds):                # direct windows
        pair = {}
        for p in (list(paths) if r % 2 == 0 else list(reversed(paths))):
            what = "router" if p == "router" else "node"
            before = cpu_ns(conn, what)
            pair[p], n = throughput(paths[p], worker.model, headers, args.concurrency, args.seconds, args.max_tokens)
            after = cpu_ns(conn, what) if before is not None else None
            if after is not None:
                cpu[p] = [cpu[p][0] + after - before, cpu[p][1] + n]
            rps[p].append(pair[p])
        ratios.append(pair["router"] / pair["direct"])
    # Each block of two pairs (router first, then direct first) has each path once in each position, which
    # cancels a position effect the pairs show on a loaded host (the second window runs slower).
    blocks = [sum(rps["router"][i:i + 2]) / sum(rps["direct"][i:i + 2]) for i in range(0, args.rounds - 1, 2)]
    res = {"model": worker.model, "router": rp.url, "direct": worker.url, "requests": args.requests,
           "max_tokens": args.max_tokens, "concurrency": args.concurrency, "rounds": args.rounds}
    for p in paths:
        res[p] = {"p50_ms": round(1000 * statistics.median(lat[p]), 2), "p99_ms": round(1000 * pct(lat[p], 0.99), 2),
                  "rps": round(statistics.median(rps[p]), 2)}
    res["p50_added_ms"] = round(res["router"]["p50_ms"] - res["direct"]["p50_ms"], 2)
    res["pair_ratios"] = [round(x, 3) for x in ratios]
    res["block_ratios"] = [round(x, 3) for x in blocks]
    res["throughput_ratio"] = round(statistics.median(blocks), 3)
    res["throughput_ratio_ci95"] = [round(x, 3) for x in median_ci95(blocks)]
    per_request = {p: cpu[p][0] / cpu[p][1] / 1e6 if cpu[p][1] else None for p in cpu}
    res["router_cpu_ms_per_request"] = per_request["router"] and round(per_request["router"], 3)
    res["node_cpu_ms_per_request"] = per_request["direct"] and round(per_request["direct"], 3)
    res["router_cpu_share"] = (round(per_request["router"] / per_request["direct"], 4)
                               if per_request["router"] and per_request["direct"] else None)
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print(f"model {worker.model}: router {rp.url} vs direct {worker.url}, {args.requests} requests each "
          f"(max_tokens {args.max_tokens}); throughput: {args.concurrency} clients, {args.rounds} x {args.seconds:.0f} s")
    print(f"{'path':<8} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8}")
    for p in paths:
        print(f"{p:<8} {res[p]['p50_ms']:>8} {res[p]['p99_ms']:>8} {res[p]['rps']:>8}")
    lo, hi = res["throughput_ratio_ci95"]
    print(f"p50 added by the router: {res['p50_added_ms']} ms (goal <= 2); throughput router/direct, median of "
          f"{len(blocks)} blocks: {res['throughput_ratio']}, 95% interval {lo}-{hi} (goal >= 0.95; blocks "
          f"{res['block_ratios']}, pairs {res['pair_ratios']})")
    print(f"CPU per request: the router's {res['router_cpu_ms_per_request']} ms, the router node's whole (direct "
          f"windows) {res['node_cpu_ms_per_request']} ms: the router's share {res['router_cpu_share']} (on a "
          "CPU-bound node, the throughput the router's CPU can cost)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
