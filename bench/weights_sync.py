#!/usr/bin/env python3
"""`weights sync` throughput vs raw `ssh cat` on the same link, side by side in one run.

Both move the same fake checkpoint (random bytes, N files) from the head to the other node over the data-plane
IP, with the same SSH key, cipher and options (the sync's one-time channel), onto the same disk; the head's
page cache is dropped before every run so both read from disk. Median of --repeats after one warm-up each.

  sync        `weights.sync`: target manifest, one-time key, rsync of the missing files, hash-cache seeding and
              verification (the head's manifest is cached, as it is after the first sync of a checkpoint)
  transfer    the rsync process alone, inside the same sync
  raw         cat FILES | ssh node 'cat > one file' (one stream, as one copies by hand)

The sync runs as `weights sync` does by default: files spread over parallel rsync streams, one per 4 head
cores (`weights.auto_streams`; one SSH stream is bound by one core's cipher speed, but each stream costs CPU on
both ends). `--streams N` forces N.

Prints MB/s for each and the ratios sync/raw and transfer/raw (goal >= 0.8), as ratios of the medians and as
the median of the ratios of each interleaved pair (robust to the drift of a shared host).
Usage: bench/weights_sync.py [--inventory SIM_INVENTORY] [--mb 500] [--files 4] [--repeats 7] [--streams N]
Without --inventory it brings up its own two-node sim cluster (name `wbench`, jumbo frames) and removes it after.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

from sparkdeploy.model import inventory as inventory_mod
from sparkdeploy.ops import weights as w
from sparkdeploy.remote.ssh import Pool, target_of

DIR = "/srv/sparkdeploy-bench/ckpt"
RAW = "/srv/sparkdeploy-bench/raw.blob"


def jumbo_sim(name: str, state_dir: Path):
    """A two-node sim cluster whose network has MTU 9000, as a CX-7 data plane."""
    from sparkdeploy.sim.cluster import SimCluster

    c = SimCluster(name, state_dir=state_dir)
    c.down()
    state = c.up(2, inventory=state_dir / "inventory.sim.yaml", mtu=9000)
    return c, Path(state.inventory)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--inventory")
    ap.add_argument("--mb", type=int, default=500, help="checkpoint size in MB (default 500)")
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=7, help="interleaved pairs (this link is noisy: default 7)")
    ap.add_argument("--streams", type=int, default=None,
                    help="parallel rsync streams for the sync (default: as `weights sync`, from the head's cores)")
    args = ap.parse_args()
    cluster = None
    tmp = tempfile.TemporaryDirectory(prefix="wbench-")
    inv_path = args.inventory
    if not inv_path:
        t0 = time.monotonic()
        cluster, inv_path = jumbo_sim("wbench", Path(tmp.name))
        print(f"sim cluster up in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    try:
        inv = inventory_mod.load(inv_path)
        head, node = inv.nodes[0], inv.nodes[1]
        with Pool([target_of(n.name, n.ssh) for n in (head, node)]) as pool:
            if pool.open():
                raise SystemExit("cannot reach the nodes")
            h, t = pool.conns[head.name], pool.conns[node.name]
            for c in (h, t):
                if not c.run(["sh", "-c", "command -v rsync"], check=False).ok:
                    c.run(["sh", "-c", "DEBIAN_FRONTEND=noninteractive apt-get install -y -q rsync || "
                           "{ apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q rsync; }"],
                          timeout=600)
            per = args.mb * 1_000_000 // args.files
            h.run(["sh", "-c", f'mkdir -p {DIR} && for i in $(seq 1 {args.files}); do '
                   f'head -c {per} /dev/urandom > {DIR}/model-$i.safetensors; done'], timeout=600)
            files = [f"{DIR}/model-{i}.safetensors" for i in range(1, args.files + 1)]
            total = per * args.files
            w.manifest(h, DIR)  # hashed once here, cached afterwards (as for any real checkpoint)
            E = lambda c, n: w.Endpoint(c, n.name, n.data_ip, n.ssh.user)  # noqa: E731

            def reset():
                t.run(["sh", "-c", f"rm -rf {DIR} {RAW} $HOME/.cache/sparkdeploy/manifest-*.json; sync"])
                w.evict(h, DIR)

            used = {}

            def one_sync():
                reset()
                r = w.sync(E(h, head), [E(t, node)], DIR, head_manifest=w.manifest(h, DIR), streams=args.streams)[0]
                assert r.status == "synced" and r.bytes == total, r
                used["streams"] = r.streams
                return r.seconds, r.transfer_seconds

            def one_raw(ch):
                reset()
                t.run(["mkdir", "-p", str(Path(RAW).parent)])
                cmd = f"cat {' '.join(files)} | {shlex.join(ch.ssh)} {node.ssh.user}@{node.data_ip} " \
                      f"{shlex.quote('cat > ' + RAW)}"
                t0 = time.monotonic()
                h.run(["sh", "-c", cmd], timeout=3600)
                return time.monotonic() - t0

            sync_s, xfer_s, raw_s = [], [], []
            with w.data_plane_channel(h, head.data_ip, t, node.data_ip) as ch:
                one_raw(ch)  # warm-up
                one_sync()  # warm-up
                for _ in range(args.repeats):  # interleaved so drift hits both alike
                    s, x = one_sync()
                    sync_s.append(s)
                    xfer_s.append(x)
                    raw_s.append(one_raw(ch))
            reset()
            h.run(["rm", "-rf", str(Path(DIR).parent)])
    finally:
        if cluster is not None:
            cluster.down()
        tmp.cleanup()
    mbps = lambda s: total / s / 1e6  # noqa: E731
    ms, mx, mr = statistics.median(sync_s), statistics.median(xfer_s), statistics.median(raw_s)
    print(f"checkpoint {total / 1e6:.0f} MB in {args.files} files, {head.name} -> {node.name} ({node.data_ip}), "
          f"cipher {w.SSH_CIPHER}, {used['streams']} rsync stream(s), median of {args.repeats}")
    print(f"  weights sync   {mbps(ms):8.1f} MB/s  ({ms:.2f} s; runs {', '.join(f'{x:.2f}' for x in sync_s)})")
    print(f"  rsync alone    {mbps(mx):8.1f} MB/s  ({mx:.2f} s; runs {', '.join(f'{x:.2f}' for x in xfer_s)})")
    print(f"  raw ssh cat    {mbps(mr):8.1f} MB/s  ({mr:.2f} s; runs {', '.join(f'{x:.2f}' for x in raw_s)})")
    paired = lambda xs: statistics.median(r / x for r, x in zip(raw_s, xs))  # noqa: E731 - drift hits both alike
    print(f"ratio sync/raw {mr / ms:.2f}   rsync/raw {mr / mx:.2f}   (goal >= 0.8); median of the per-pair ratios: "
          f"sync/raw {paired(sync_s):.2f}, rsync/raw {paired(xfer_s):.2f}")
    fixed = statistics.median(s - x for s, x in zip(sync_s, xfer_s))
    print(f"fixed cost per sync (manifests, one-time key, verification): {fixed:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
