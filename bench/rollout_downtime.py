#!/usr/bin/env python3
"""Downtime of `sparkdeploy vocab rollout` as a client sees it, and how long the rollout takes, in one run.

A client thread sends short temperature-0 completions back to back (each with a timeout) while the rollout
runs on the main thread. Printed:

  rollout       wall time of the whole rollout (validate, golden, distribute, restart, gate, verify, finish)
  downtime      the longest window with no successful request: from the last success before a gap to the
                first success after it (the restart of both ranks, workers first)
  ratio         downtime / rollout
  requests      ok / failed during the run, and the rollout's own phase timings

Usage: bench/rollout_downtime.py --inventory INVENTORY [--list LIST] [--interval 0.2]
The inventory must name a deployed cluster (`sparkdeploy up`) with the shortlist on. Without --list, two lists
are made for the served tokenizer (ids < 1536 or < 2560, plus its required ids) and the one not live is rolled
out, so every run changes the list.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time

import numpy as np
import requests

from sparkdeploy import inventory as I
from sparkdeploy import health, rollout, served_tokenizer


def client(url: str, model: str, stop: threading.Event, interval: float, log: list, api_key: str | None) -> None:
    s = requests.Session()
    s.headers.update(health.bearer(api_key))
    while not stop.is_set():
        t0 = time.time()
        ok = False
        try:
            r = s.post(f"{url}/v1/completions", timeout=10,
                       json={"model": model, "prompt": "Hello", "max_tokens": 4, "temperature": 0})
            ok = r.status_code == 200 and bool(r.json().get("choices"))
        except (requests.RequestException, ValueError):
            ok = False
        log.append((t0, time.time(), ok))
        time.sleep(interval)


def downtime(log: list, start: float, end: float) -> tuple[float, float, float]:
    """(longest gap between successes inside [start, end], gap start, gap end)."""
    oks = [t1 for _, t1, ok in log if ok]
    before = [t for t in oks if t <= start]
    points = ([before[-1]] if before else [start]) + [t for t in oks if start < t <= end]
    after = [t for t in oks if t > end]
    points += [after[0]] if after else [end]
    best = (0.0, start, start)
    for a, b in zip(points, points[1:]):
        if b - a > best[0]:
            best = (b - a, a, b)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--inventory", "-i", required=True)
    ap.add_argument("--list", dest="list_path", help="list to roll out (default: one of two generated lists)")
    ap.add_argument("--interval", type=float, default=0.2, help="seconds between client requests")
    ap.add_argument("--ready-timeout", type=float, default=600)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    inv = I.load(args.inventory)
    tok = served_tokenizer.resolve(inv)
    tmp = tempfile.mkdtemp(prefix="rollout-bench-")
    candidates = [args.list_path] if args.list_path else [
        str(rollout.write_list_with_manifest(f"{tmp}/ids-{n}.txt", np.union1d(np.arange(n), tok.required_ids), tok))
        for n in (1536, 2560)]
    opts = rollout.RolloutOptions(ready_timeout=args.ready_timeout, max_tokens=16, log=lambda m: print("·", m))
    res = None
    for path in candidates:
        _, cand = rollout.validate_locally(inv, path)
        cluster = rollout._cluster(inv, opts, False)
        try:
            r = rollout.Rollout(cluster, cand, opts, tok)
            dry = rollout.Rollout(cluster, cand, rollout.RolloutOptions(dry_run=True), tok).run()
            if dry.status == "unchanged":
                continue
            url, model = cluster.plan.api_url, inv.profile.served_name  # planned by the dry run
            log: list = []
            stop = threading.Event()
            th = threading.Thread(target=client, args=(url, model, stop, args.interval, log, inv.auth.api_key()), daemon=True)
            th.start()
            time.sleep(3)  # a baseline of successes before the rollout starts
            t0 = time.time()
            res = r.run()
            t1 = time.time()
            time.sleep(3)
            stop.set()
            th.join(15)
        finally:
            cluster.close()
        break
    if res is None:
        print("every candidate list is already live; pass --list")
        return 1
    gap, ga, gb = downtime(log, t0, t1)
    ok = sum(1 for *_, k in log if k)
    out = {"status": res.status, "message": res.message, "rollout_s": round(t1 - t0, 1), "downtime_s": round(gap, 1),
           "downtime_window": [round(ga - t0, 1), round(gb - t0, 1)], "ratio": round(gap / max(t1 - t0, 1e-9), 3),
           "requests_ok": ok, "requests_failed": len(log) - ok, "timings": res.timings}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"rollout   {out['rollout_s']:.1f} s ({res.status}: {res.message})")
        print(f"downtime  {out['downtime_s']:.1f} s without a successful request "
              f"(from +{out['downtime_window'][0]} s to +{out['downtime_window'][1]} s of the rollout)")
        print(f"ratio     downtime / rollout = {out['ratio']}")
        print(f"requests  {ok} ok, {len(log) - ok} failed; phases: "
              + ", ".join(f"{k} {v} s" for k, v in res.timings.items()))
    return 0 if res.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
