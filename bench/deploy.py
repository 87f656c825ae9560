#!/usr/bin/env python3
"""Orchestration figures for a deployed cluster, measured side by side in one run:

  re-run       `up` with nothing changed: wall time (median of --repeats) and the number of changes (must be 0)
  parallel     the read-and-diff steps of `up` (`up --dry-run`) on 2 nodes vs 1 node: wall(2)/wall(1)
               (1.0 = perfectly parallel, 2.0 = serial)
  image        serving-image distribution node1 -> node2 (`docker save | docker load` through the kit's
               stream, verified by image ID) vs a raw `ssh node1 cat | ssh node2 cat > /dev/null` of the same
               bytes between the same nodes: MB/s each and the ratio
  reboot       (sim only, --sim-name) time to healthy after a double reboot (from `docker restart` of both
               nodes to the first answered completion) vs the engine's own start time after that reboot (from
               the later rank container's start to the first completion): both and the ratio

Usage: bench/deploy.py --inventory INVENTORY [--sim-name NAME] [--repeats 3] [--skip reboot,image] [--json]
The inventory must be deployed (`sparkdeploy up`). Timings are medians after one warm-up where repeated.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from sparkdeploy import health  # noqa: E402
from sparkdeploy import inventory as I  # noqa: E402
from sparkdeploy.steps import image as img  # noqa: E402
from sparkdeploy.steps.deploy import Cluster, Options  # noqa: E402


def timed_up(inv, **kw) -> tuple[float, object]:
    c = Cluster(inv, Options(**kw))
    try:
        t0 = time.monotonic()
        res = c.up()
        return time.monotonic() - t0, res
    finally:
        c.close()


def rerun(inv, repeats: int) -> dict:
    timed_up(inv)  # warm-up (also makes sure nothing is pending)
    runs = [timed_up(inv) for _ in range(repeats)]
    return {"seconds_median": statistics.median(t for t, _ in runs), "seconds": [round(t, 2) for t, _ in runs],
            "changes": [r.changes for _, r in runs], "healthy": all(r.healthy for _, r in runs)}


def parallel(inv, repeats: int) -> dict:
    def steps_time(nodes: int) -> float:
        c = Cluster(inv, Options(nodes=nodes, dry_run=True))
        try:
            res = c.up()
        finally:
            c.close()
        return res.seconds

    steps_time(2)
    two = statistics.median(steps_time(2) for _ in range(repeats))
    one = statistics.median(steps_time(1) for _ in range(repeats))
    return {"wall_2_nodes_s": round(two, 2), "wall_1_node_s": round(one, 2), "ratio": round(two / one, 2)}


def _ssh_argv(node) -> list[str]:
    s = node.ssh
    argv = ["ssh", "-o", "BatchMode=yes", "-p", str(s.port)]
    if s.key:
        argv += ["-i", str(s.key)]
    if s.known_hosts:
        argv += ["-o", f"UserKnownHostsFile={s.known_hosts}", "-o", "StrictHostKeyChecking=yes"]
    return argv + [f"{s.user}@{s.host}"]


def image_throughput(inv, cluster: Cluster, size_mb: int) -> dict:
    a, b = inv.nodes[0], inv.nodes[1]
    ca, cb = cluster.conn(a.name), cluster.conn(b.name)
    tag = "sparkdeploy-bench/blob:1"
    # A throwaway image with one incompressible layer, made on node1 (not the serving image: it is in use).
    ca.run(["sh", "-c", f'set -e; d=$(mktemp -d); head -c {size_mb}M /dev/urandom > "$d/blob"; '
                        f'tar -C "$d" -c blob | docker import - {tag} >/dev/null; rm -rf "$d"'], timeout=600)
    want = img.image_id(ca, tag)
    cb.run(["docker", "image", "rm", "-f", tag], check=False)
    t0 = time.monotonic()
    moved = img.ship(ca, cb, tag, want)
    t_ship = time.monotonic() - t0
    raw_cmd = f"{' '.join(_ssh_argv(a))} docker save {tag} | {' '.join(_ssh_argv(b))} 'cat > /dev/null'"
    t0 = time.monotonic()
    subprocess.run(["bash", "-o", "pipefail", "-c", raw_cmd], check=True)
    t_raw = time.monotonic() - t0
    for c in (ca, cb):
        c.run(["docker", "image", "rm", "-f", tag], check=False)
    mb = moved / 1e6
    return {"bytes": moved, "ship_s": round(t_ship, 2), "ship_MBps": round(mb / t_ship, 1),
            "raw_ssh_cat_s": round(t_raw, 2), "raw_ssh_cat_MBps": round(mb / t_raw, 1),
            "ship_vs_raw": round(t_raw / t_ship, 2)}


def _started(conn, name: str) -> float | None:
    import datetime as dt

    out = conn.run(["docker", "inspect", "-f", "{{.State.StartedAt}}", name], check=False).stdout.strip()
    if not out:
        return None
    return dt.datetime.strptime(out.split(".")[0].rstrip("Z"), "%Y-%m-%dT%H:%M:%S").replace(
        tzinfo=dt.timezone.utc).timestamp()


def double_reboot(inv_path: str, inv, sim_name: str, timeout: float) -> dict:
    from sparkdeploy.sim.cluster import SimCluster

    sim = SimCluster(sim_name)
    cluster = Cluster(inv, Options())
    cluster.connect([])
    exp = cluster.expect()
    cluster.close()
    t0 = time.monotonic()
    wall0 = time.time()
    back = sim.reboot("all")
    t_back = time.monotonic() - t0
    while True:
        try:
            health.generate(exp.api_url, exp.served_model, timeout=10, max_tokens=1)
            break
        except Exception:  # noqa: BLE001 - not ready yet
            if time.monotonic() - t0 > timeout:
                raise SystemExit(f"not healthy {timeout:.0f} s after the double reboot")
            time.sleep(1)
    t_healthy = time.monotonic() - t0
    wall_healthy = time.time()
    c2 = Cluster(inv, Options())
    c2.connect([])
    starts = [_started(c2.conn(n.name), n.container) for n in exp.nodes]
    c2.close()
    last_start = max(s for s in starts if s)
    engine = wall_healthy - last_start
    return {"nodes_back_s": round(t_back, 1), "time_to_healthy_s": round(t_healthy, 1),
            "engine_start_s": round(engine, 1), "ratio": round(t_healthy / engine, 2),
            "rank_started_after_reboot_s": [round(s - wall0, 1) if s else None for s in starts],
            "per_node_reboot_s": back}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--inventory", "-i", required=True)
    ap.add_argument("--sim-name", default=None, help="sim cluster name (for the double reboot)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--image-mb", type=int, default=512)
    ap.add_argument("--reboot-timeout", type=float, default=900)
    ap.add_argument("--skip", default="", help="comma list of: rerun,parallel,image,reboot")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    skip = set(filter(None, a.skip.split(",")))
    inv = I.load(a.inventory)
    out: dict = {}
    if "rerun" not in skip:
        out["rerun"] = rerun(inv, a.repeats)
        print(f"re-run (nothing changed): {out['rerun']['seconds_median']:.2f} s median of {a.repeats}, "
              f"changes {out['rerun']['changes']}", file=sys.stderr)
    if "parallel" not in skip and len(inv.nodes) > 1:
        out["parallel"] = p = parallel(inv, a.repeats)
        print(f"read+diff steps: 2 nodes {p['wall_2_nodes_s']} s, 1 node {p['wall_1_node_s']} s, "
              f"wall(2)/wall(1) = {p['ratio']}", file=sys.stderr)
    if "image" not in skip and len(inv.nodes) > 1:
        c = Cluster(inv, Options())
        try:
            c.connect([], [n.name for n in inv.nodes])
            out["image"] = m = image_throughput(inv, c, a.image_mb)
        finally:
            c.close()
        print(f"image {m['bytes'] / 1e6:.0f} MB node1->node2: save|load {m['ship_MBps']} MB/s, raw ssh cat "
              f"{m['raw_ssh_cat_MBps']} MB/s (ship/raw throughput = {m['ship_vs_raw']})", file=sys.stderr)
    if "reboot" not in skip and a.sim_name:
        out["reboot"] = r = double_reboot(a.inventory, inv, a.sim_name, a.reboot_timeout)
        print(f"double reboot: healthy after {r['time_to_healthy_s']} s (nodes back {r['nodes_back_s']} s); engine "
              f"start {r['engine_start_s']} s; ratio {r['ratio']}", file=sys.stderr)
    if a.json:
        print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
