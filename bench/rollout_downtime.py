#!/usr/bin/env python3
"""The API's downtime under `sparkdeploy vocab rollout`, restart vs live swap, side by side in one run.

Client streams send short temperature-0 completions back to back (each with a timeout) while two rollouts
run one after the other on the main thread: a restart rollout (`--restart`) to the list not live, then a
live rollout (`--live`) back to the list that was live. Printed per path:

  path          the path the rollout took (a live rollout that fell back to a restart says why)
  rollout       wall time of the whole rollout (validate, golden, distribute, switch, checks, finish)
  unavailable   the longest window with no successful request: from the last success before a gap to the
                first success after it
  requests      ok / failed while the rollout ran (a failed one: an error, a timeout or an empty answer)

Usage: bench/rollout_downtime.py --inventory INVENTORY [--lists A B] [--streams 4] [--interval 0.2] [--json]
The inventory must name a deployed cluster (`sparkdeploy up`) whose profile has the MTP draft with the
shortlist on, `shortlist.live_check_every` set and `shortlist.capacity` at least the larger list (2560 ids
for the generated ones). Without --lists, two lists are made for the served tokenizer (ids < 1536 or < 2560,
plus its required ids).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time

import numpy as np
import requests

from sparkdeploy.model import inventory as I
from sparkdeploy.model import served_tokenizer
from sparkdeploy.ops import health, vocab_live
from sparkdeploy.steps import healthcheck
from sparkdeploy.steps import vocab_rollout as rollout
from sparkdeploy.steps.context import Context, Options


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


def live_list(inv) -> str | None:
    """sha256 of the list the head serves now (its pointer)."""
    with Context(inv, Options()) as cluster:
        cluster.connect([])
        return vocab_live.read_state(cluster.conn(cluster.head), cluster.lay).content


def under_load(inv, tok, path: str, opts, run: Options, streams: int, interval: float) -> dict:
    """One rollout of `path` while `streams` clients send requests; the client's view and the rollout's."""
    _, cand = rollout.validate_locally(inv, path)
    cluster = Context(inv, run)
    log: list = []
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        cluster.connect([])
        healthcheck.expect(cluster)
        url, model = cluster.plan.api_url, inv.profile.served_name
        threads += [threading.Thread(target=client, args=(url, model, stop, interval, log, inv.auth.api_key()),
                                     daemon=True) for _ in range(streams)]
        for th in threads:
            th.start()
        time.sleep(3)  # a baseline of successes before the rollout starts
        t0 = time.time()
        res = rollout.Rollout(cluster, cand, opts, tok).run()
        t1 = time.time()
        time.sleep(3)
    finally:
        stop.set()
        cluster.close()
    for th in threads:
        th.join(15)
    gap, ga, gb = downtime(log, t0, t1)
    during = [k for a, b, k in log if b >= t0 and a <= t1]
    return {"list": cand.version, "path": res.path, "path_reason": res.path_reason, "status": res.status,
            "message": res.message, "rollout_s": round(t1 - t0, 1), "unavailable_s": round(gap, 1),
            "unavailable_window": [round(ga - t0, 1), round(gb - t0, 1)], "requests_ok": sum(during),
            "requests_failed": len(during) - sum(during), "timings": res.timings, "ok": res.ok}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--inventory", "-i", required=True)
    ap.add_argument("--lists", nargs=2, metavar=("A", "B"),
                    help="two lists for the served tokenizer (default: two generated lists); the one not live goes "
                         "first by a restart rollout, the other comes back live")
    ap.add_argument("--streams", type=int, default=4, help="concurrent client streams during each rollout")
    ap.add_argument("--interval", type=float, default=0.2, help="seconds between one stream's requests")
    ap.add_argument("--ready-timeout", type=float, default=600)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    inv = I.load(args.inventory)
    tok = served_tokenizer.resolve(inv)
    tmp = tempfile.mkdtemp(prefix="rollout-bench-")
    lists = args.lists or [
        str(rollout.write_list_with_manifest(f"{tmp}/ids-{n}.txt", np.union1d(np.arange(n), tok.required_ids), tok))
        for n in (2560, 1536)]
    shas = [rollout.validate_locally(inv, p)[1].sha256 for p in lists]
    away, back = lists if live_list(inv) != shas[0] else lists[::-1]
    rows = {}
    for name, path, restart in (("restart", away, True), ("live", back, False)):
        opts = rollout.RolloutOptions(max_tokens=16, restart=restart)
        run = Options(ready_timeout=args.ready_timeout, log=lambda m: print("·", m))
        rows[name] = under_load(inv, tok, path, opts, run, args.streams, args.interval)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        r, v = rows["restart"], rows["live"]
        print(f"{'':<22}{'restart':>12}{'live':>12}")
        for label, key in (("path", "path"), ("status", "status"), ("rollout s", "rollout_s"),
                           ("unavailable s", "unavailable_s"), ("requests ok", "requests_ok"),
                           ("requests failed", "requests_failed")):
            print(f"{label:<22}{str(r[key]):>12}{str(v[key]):>12}")
        for name, row in rows.items():
            print(f"{name}: {row['message']}" + (f" [path: {row['path_reason']}]" if row["path_reason"] else ""))
    return 0 if all(row["ok"] for row in rows.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
