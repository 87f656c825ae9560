#!/usr/bin/env python3
"""Orchestration figures for a deployed cluster, measured side by side in one run:

  re-run       `up` with nothing changed: wall time (median of --repeats) and the number of changes (must be 0)
  parallel     the read-and-diff steps of `up` (`up --dry-run`) on 2 nodes vs 1 node: wall(2)/wall(1)
               (1.0 = perfectly parallel, 2.0 = serial)
  layers       (--layers [--first-deploy]; the latter wipes the nodes' serving images and the head's registry)
               `up` side by side: (a) first deploy, (b) overlays-only change, (c) draft-list-only change, (d) nothing
               changed: wall time, bytes each node received during the whole `up` (interface counters: all
               traffic, serving ranks and SSH too), the image bytes each node was sent in the image step
               (the head registry's access log, and the SSH tunnel for a push from this machine), the
               compressed bytes of the layers that changed (head registry's manifests) and image bytes /
               changed-layer bytes per node. Overlays are a frozen copy
               (SPARKDEPLOY_ROOT), so edits in the checkout do not leak into the figures.
  services     (an inventory with several services: the only figure) the read-and-diff steps of every service
               side by side (`up --dry-run`) vs one service on 1 node: wall(all)/wall(1), e.g. 4 nodes vs 1
  reboot       (sim only, --sim-name) time to healthy after a double reboot (from `docker restart` of both
               nodes to the first answered completion) vs the engine's own start time after that reboot (from
               the later rank container's start to the first completion): both and the ratio

Usage: bench/deploy.py --inventory INVENTORY [--sim-name NAME] [--repeats 3] [--skip reboot] [--layers] [--json]
The inventory must be deployed (`sparkdeploy up`). Timings are medians after one warm-up where repeated.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from sparkdeploy.model import inventory as I
from sparkdeploy.ops import health, registry
from sparkdeploy.steps import deploy as D  # noqa: E402
from sparkdeploy.steps.deploy import Context, Options, dry_run_services  # noqa: E402


def timed_up(inv, **kw) -> tuple[float, object]:
    c = Context(inv, Options(**kw))
    try:
        t0 = time.monotonic()
        res = D.up(c)
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
        c = Context(inv, Options(nodes=nodes, dry_run=True))
        try:
            res = D.up(c)
        finally:
            c.close()
        return res.seconds

    steps_time(2)
    two = statistics.median(steps_time(2) for _ in range(repeats))
    one = statistics.median(steps_time(1) for _ in range(repeats))
    return {"wall_2_nodes_s": round(two, 2), "wall_1_node_s": round(one, 2), "ratio": round(two / one, 2)}


def services_side_by_side(inv_path: str, repeats: int) -> dict:
    """The read+diff steps (`up --dry-run`) of every service at once vs one service on one node, timed alike."""
    views = I.load_services(inv_path)
    names, nodes = [v.service for v in views], sum(len(v.nodes) for v in views)

    def wall(opts: Options, which: list) -> float:
        t0 = time.monotonic()
        dry_run_services(inv_path, opts, which)
        return time.monotonic() - t0

    wall(Options(), names)
    every = statistics.median(wall(Options(), names) for _ in range(repeats))
    one = statistics.median(wall(Options(nodes=1), names[:1]) for _ in range(repeats))
    return {"services": len(names), "nodes": nodes, "wall_all_s": round(every, 2), "wall_1_node_s": round(one, 2),
            "ratio": round(every / one, 2)}


def frozen_root(tmp: Path) -> Path:
    """A data root whose overlays/ is a private copy (everything else links to the checkout)."""
    from sparkdeploy import paths

    src = paths.repo_root()
    tmp.mkdir(parents=True, exist_ok=True)
    for entry in src.iterdir():
        if entry.name == "overlays":
            shutil.copytree(entry, tmp / "overlays", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
        elif not (tmp / entry.name).exists():
            (tmp / entry.name).symlink_to(entry)
    return tmp


def wipe_images(inv) -> None:
    """Every node as before its first deploy: no engine container, no serving image, an empty registry. The
    watchdog goes first: it would start the ranks again mid-deploy (`up` turns it back on after its gate)."""
    c = Context(inv, Options())
    try:
        c.connect([], [n.name for n in inv.nodes])
        lay = inv.layout
        script = (f"systemctl stop {lay.watchdog_timer} {lay.watchdog_service} 2>/dev/null; "
                  f"systemctl stop {lay.unit} 2>/dev/null; docker rm -f {lay.container} 2>/dev/null; "
                  f"docker image ls -q {inv.image.repository} | xargs -r docker image rm -f; docker image prune -f; "
                  f"systemctl stop {registry.UNIT_NAME} 2>/dev/null; rm -rf {registry.STORAGE_DIR}; "
                  f"systemctl start {registry.UNIT_NAME} 2>/dev/null; true")
        c.pool.map(lambda conn: conn.run(["sh", "-c", script], timeout=600), [n.name for n in inv.nodes])
    finally:
        c.close()


def rx_bytes(conn) -> int:
    """Bytes received so far on the node's network interfaces (loopback and container bridges excluded)."""
    res = conn.query(["sh", "-c", "for d in /sys/class/net/*; do n=${d##*/}; case $n in lo|docker*|veth*|br-*) ;; "
                                "*) cat $d/statistics/rx_bytes;; esac; done"], check=False)
    return sum(int(x) for x in res.stdout.split() if x.isdigit())


def measured_up(inv) -> dict:
    """One `up`: wall, bytes each node received (whole up / image step), and the layers new to the registry."""
    c = Context(inv, Options(ready_timeout=900))
    try:
        c.connect([], [n.name for n in inv.nodes])
        head = c.conn(inv.head.name)
        old_layers = set()
        for tag in head.run(["docker", "image", "ls", "--format", "{{.Repository}}:{{.Tag}}", inv.image.repository],
                            check=False).stdout.split():
            old_layers |= set(registry.layer_sizes(head, tag))
        rx0 = {n.name: rx_bytes(c.conn(n.name)) for n in inv.nodes}
        t0 = time.monotonic()
        res = D.up(c)
        wall = time.monotonic() - t0
        rx1 = {n.name: rx_bytes(c.conn(n.name)) for n in inv.nodes}
        new = registry.layer_sizes(head, c.plan.image.tag)
        changed = sum(size for digest, size in new.items() if digest not in old_layers)
        image_rx, image_s = dict(getattr(c, "image_received", {})), getattr(c, "image_seconds", 0.0)
    finally:
        c.close()
    if not res.healthy:
        raise SystemExit(f"up failed: {res.message}")
    return {"wall_s": round(wall, 1), "image_step_s": round(image_s, 1),
            "received_up": {n: rx1[n] - rx0[n] for n in rx0}, "received_image_step": image_rx,
            "changed_layer_bytes": changed, "image_bytes": sum(new.values()), "changes": res.changes,
            "step_s": _step_seconds(res.outcomes),
            "ratio": {n: round(b / changed, 2) for n, b in image_rx.items()} if changed else None}


def _step_seconds(outcomes) -> dict:
    """Where an `up` spent its time: each step's longest node (a step runs its nodes side by side)."""
    out: dict[str, float] = {}
    for o in outcomes:
        out[o.step] = round(max(out.get(o.step, 0.0), o.seconds), 1)
    return out


def layers(inv_path: str, work: Path, first: bool) -> dict:
    """(a)-(d) in one run on a frozen overlays copy ((a) only with `first`: it wipes the images); see the module
    docstring."""
    os.environ["SPARKDEPLOY_ROOT"] = str(frozen_root(work / "root"))
    data = yaml.safe_load(Path(inv_path).read_text())
    vocab = Path(data["vocab"]) if data.get("vocab") else None
    out = {}
    if first:
        wipe_images(I.load(inv_path))
        out["first deploy"] = measured_up(I.load(inv_path))
    else:
        out["baseline"] = measured_up(I.load(inv_path))  # the frozen copy may differ from what is deployed
    with open(work / "root" / "overlays" / "spark_overlays" / "__init__.py", "a") as f:
        f.write(f"# bench/deploy.py overlays-only change {time.time()}\n")
    out["overlays only"] = measured_up(I.load(inv_path))
    if vocab:
        shorter = work / "list-changed.txt"
        shorter.write_text("".join(vocab.read_text().splitlines(keepends=True)[:-4]))
        data["vocab"] = str(shorter)
    changed_inv = work / "inventory-list-changed.yaml"
    changed_inv.write_text(yaml.safe_dump(data, sort_keys=False))
    out["list only"] = measured_up(I.load(changed_inv))
    out["nothing"] = measured_up(I.load(changed_inv))
    return out


def print_layers(rows: dict) -> None:
    mb = 1e6
    print(f"{'up':<15}{'wall s':>8}{'image s':>9}{'recv MB (up)':>22}{'recv MB (image)':>22}{'changed MB':>12}"
          f"{'image/changed':>16}", file=sys.stderr)
    for name, r in rows.items():
        up = "/".join(f"{v / mb:.1f}" for v in r["received_up"].values())
        im = "/".join(f"{v / mb:.1f}" for v in r["received_image_step"].values()) or "0"
        ratio = "/".join(str(v) for v in r["ratio"].values()) if r["ratio"] else "-"
        print(f"{name:<15}{r['wall_s']:>8}{r['image_step_s']:>9}{up:>22}{im:>22}"
              f"{r['changed_layer_bytes'] / mb:>12.2f}{ratio:>16}", file=sys.stderr)
        print(f"{'':<15}steps (s): " + "  ".join(f"{k} {v}" for k, v in r["step_s"].items() if v >= 0.5),
              file=sys.stderr)
    print("(per node: head/worker; recv (up) = bytes received on the node's interfaces during the whole up; "
          "recv (image) = image bytes sent to the node, by the registry's log and the SSH tunnel; changed = "
          "compressed bytes of the layers new to the head's registry)", file=sys.stderr)


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
    cluster = Context(inv, Options())
    cluster.connect([])
    exp = D.expect(cluster)
    cluster.close()
    t0 = time.monotonic()
    wall0 = time.time()
    back = sim.reboot("all")
    t_back = time.monotonic() - t0
    while True:
        try:
            health.generate(exp.api_url, exp.served_model, timeout=10, max_tokens=1, api_key=exp.api_key)
            break
        except Exception:  # noqa: BLE001 - not ready yet
            if time.monotonic() - t0 > timeout:
                raise SystemExit(f"not healthy {timeout:.0f} s after the double reboot")
            time.sleep(1)
    t_healthy = time.monotonic() - t0
    wall_healthy = time.time()
    c2 = Context(inv, Options())
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
    ap.add_argument("--layers", action="store_true", help="measure image delivery: overlays/list/nothing changed")
    ap.add_argument("--first-deploy", action="store_true", help="with --layers: wipe the serving images and the "
                    "registry first and measure the first deploy too")
    ap.add_argument("--reboot-timeout", type=float, default=900)
    ap.add_argument("--skip", default="", help="comma list of: rerun,parallel,reboot")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    skip = set(filter(None, a.skip.split(",")))
    out: dict = {}
    if len(I.load_services(a.inventory)) > 1:
        out["services"] = p = services_side_by_side(a.inventory, a.repeats)
        print(f"read+diff steps: {p['services']} services on {p['nodes']} nodes side by side {p['wall_all_s']} s, "
              f"one service on 1 node {p['wall_1_node_s']} s, ratio {p['ratio']}", file=sys.stderr)
        if a.json:
            print(json.dumps(out, indent=2))
        return 0
    inv = I.load(a.inventory)
    if "rerun" not in skip:
        out["rerun"] = rerun(inv, a.repeats)
        print(f"re-run (nothing changed): {out['rerun']['seconds_median']:.2f} s median of {a.repeats}, "
              f"changes {out['rerun']['changes']}", file=sys.stderr)
    if "parallel" not in skip and len(inv.nodes) > 1:
        out["parallel"] = p = parallel(inv, a.repeats)
        print(f"read+diff steps: 2 nodes {p['wall_2_nodes_s']} s, 1 node {p['wall_1_node_s']} s, "
              f"wall(2)/wall(1) = {p['ratio']}", file=sys.stderr)
    if a.layers and len(inv.nodes) > 1:
        with tempfile.TemporaryDirectory(prefix="bench-layers-") as work:
            out["layers"] = rows = layers(a.inventory, Path(work), a.first_deploy)
        print_layers(rows)
    if "reboot" not in skip and a.sim_name:
        out["reboot"] = r = double_reboot(a.inventory, inv, a.sim_name, a.reboot_timeout)
        print(f"double reboot: healthy after {r['time_to_healthy_s']} s (nodes back {r['nodes_back_s']} s); engine "
              f"start {r['engine_start_s']} s; ratio {r['ratio']}", file=sys.stderr)
    if a.json:
        print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
