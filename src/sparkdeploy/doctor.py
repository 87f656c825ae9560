"""`sparkdeploy doctor`: read each node once, then judge it with the pure checks of `preflight`.

The I/O is here: `examine()` connects, runs `probes.probe_argv(...)` (one fixed shell script, one SSH round
trip per node), the clock samples (`clock_offset`) and one TCP stream per pair of nodes over the data plane
(`measure_bandwidth`), the NCCL libraries of the host and of the serving image and the image's Ray
(`probes.image_libs_argv`), asks the planner for each node's memory budget on the measured /proc/meminfo, and
hands everything to `preflight`.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from sparkdeploy.errors import SparkdeployError
from sparkdeploy.memguard import memory_margin, serving_margin
from sparkdeploy.preflight import GIB, NodeSpec, check_api_key, check_nccl, check_ray, run_checks
from sparkdeploy.probes import (BANDWIDTH_PORT, HostFacts, bandwidth_receive_argv, bandwidth_send_argv,
                                image_libs_argv, parse_bandwidth, parse_image_libs, parse_meminfo, probe_argv)
from sparkdeploy.verdict import Result, Status, worst


class ChecksFailed(SparkdeployError):
    """At least one doctor check failed (exit 1); the per-check lines were printed before."""


# ------------------------------------------------------------------------------------- reading the nodes
# The only I/O in this module: connect, run the probe and the clock samples (`examine`, `clock_offset`).
def spec_of(node, checkpoint_dir: str | None) -> NodeSpec:
    return NodeSpec(node.name, node.data_ip, node.netdev, tuple(node.hca), node.has_gpu, checkpoint_dir, node.role)


def clock_offset(conn, samples: int = 3) -> tuple[float, float]:
    """(offset of the node's clock vs this machine, half the round trip) from the sample with the least RTT."""
    import time

    best = None
    for _ in range(samples):
        t0 = time.time()
        out = conn.run(["date", "+%s.%N"], timeout=30).stdout.strip()
        t1 = time.time()
        try:
            remote = float(out)
        except ValueError:
            continue
        cand = (remote - (t0 + t1) / 2, (t1 - t0) / 2)
        if best is None or cand[1] < best[1]:
            best = cand
    if best is None:
        raise ValueError("date printed no number")
    return best


def measure_bandwidth(pool, nodes, up: list[str]) -> dict[tuple[str, str], float | str]:
    """{(sender, receiver): Gbit/s or why not} for every pair of answering nodes, one pair at a time (pairs
    measured together would share links and halve each other)."""
    by_name = {n.name: n for n in nodes}
    wait = 20.0  # for the receiver to be listening, and for the sender to connect
    out: dict[tuple[str, str], float | str] = {}
    for a, b in itertools.combinations([n.name for n in nodes if n.name in up], 2):
        src, dst = by_name[a].data_ip, by_name[b].data_ip
        argv = {b: bandwidth_receive_argv(dst, wait), a: bandwidth_send_argv(src, dst, wait)}
        done = pool.map(lambda c: c.run(argv[c.name], check=False, timeout=wait + 30), [a, b])
        recv, send = done[b], done[a]
        if isinstance(recv, Exception) or isinstance(send, Exception):
            out[(a, b)] = str(recv if isinstance(recv, Exception) else send)
            continue
        try:
            out[(a, b)] = parse_bandwidth(recv.stdout)
        except ValueError as err:
            tail = (recv.stderr.strip().splitlines() or send.stderr.strip().splitlines() or [str(err)])[-1]
            out[(a, b)] = f"{dst}:{BANDWIDTH_PORT}: {tail}"
    return out


def planner_facts(node, hf: HostFacts):
    """The planner's NodeFacts from the probe's /proc/meminfo (memory only: the other checks judge the rest)."""
    from sparkdeploy.facts import NodeFacts

    mem = parse_meminfo(hf.text("meminfo"))
    if "MemTotal" not in mem:
        return None
    return NodeFacts(node.name, mem["MemTotal"], mem.get("MemAvailable"), node.has_gpu, source="ssh")


@dataclass
class Examination:
    results: list[Result]
    facts: dict[str, HostFacts]
    seconds: float = 0.0

    @property
    def status(self) -> Status:
        return worst(r.status for r in self.results)

    def to_dict(self) -> dict:
        return {"status": self.status.value, "seconds": round(self.seconds, 2),
                "results": [r.as_dict() for r in self.results]}


def examine(inv, *, facts_file: str | None = None, checkpoint_dir: str | None = None,
            trust_new_hosts: bool = False, pool=None) -> Examination:
    """Probe every node of the inventory (in parallel) and run every check."""
    import time

    from sparkdeploy import facts as facts_mod
    from sparkdeploy import plan as plan_mod
    from sparkdeploy.errors import SparkdeployError
    from sparkdeploy.remote import Pool
    from sparkdeploy.remote import target_of

    t0 = time.monotonic()
    ckpt = checkpoint_dir or inv.profile.host_dir
    specs = [spec_of(n, ckpt) for n in inv.nodes]
    given = facts_mod.load_facts_file(facts_file) if facts_file else {}
    own = pool is None
    pool = pool or Pool([target_of(n.name, n.ssh) for n in inv.nodes], trust_new_hosts=trust_new_hosts)
    try:
        errors = pool.open()
        up = [n.name for n in inv.nodes if n.name in pool.conns]
        peers = {n.name: [m.data_ip for m in inv.nodes if m.name != n.name] for n in inv.nodes}
        outs = pool.map(lambda c: c.run(probe_argv(ckpt, peers[c.name]), check=False, timeout=180), up)
        clocks = pool.map(clock_offset, up)
        bandwidth = measure_bandwidth(pool, inv.nodes, up)
        tag = serving_image_tag(inv)
        libs = pool.map(lambda c: parse_image_libs(c.run(image_libs_argv(tag), check=False, timeout=180).stdout),
                        up) if tag else {}
    finally:
        if own:
            pool.close()
    facts: dict[str, HostFacts] = {}
    for n in inv.nodes:
        over = {}
        if n.name in given:
            g = given[n.name]
            over = {k: v for k, v in (("gpu_name", g.gpu_name), ("driver", g.driver)) if v is not None}
        if n.name in errors:
            facts[n.name] = HostFacts(n.name, overrides=over, error=str(errors[n.name]))
        elif isinstance(outs.get(n.name), Exception):
            facts[n.name] = HostFacts(n.name, overrides=over, error=f"probe failed: {outs[n.name]}")
        else:
            facts[n.name] = HostFacts.from_output(n.name, outs[n.name].stdout, over)

    # memory: the planner's own budget on the measured facts (never recomputed here)
    measured = {n.name: planner_facts(n, facts[n.name]) for n in inv.nodes if not facts[n.name].error}
    measured = {k: v for k, v in measured.items() if v is not None}
    budget_error = None
    budgets, engines = {}, {}
    if measured:
        try:
            pl = plan_mod.plan(inv, measured)
            budgets = {np.name: np.memory for np in pl.nodes}
            engines = {np.name: np.container_name for np in pl.nodes}
        except SparkdeployError as err:
            budget_error = str(err)
    head_present = int(facts[inv.head.name].kv("disk").get("ckpt_present") or 0) if not facts[inv.head.name].error else 0
    checkpoint_bytes = max(head_present, int(inv.profile.weights_gib * GIB)) if ckpt else 0
    ports = (inv.ports.api, inv.ports.master)
    results: list[Result] = []
    per_node = run_checks(specs, facts, checkpoint_bytes=checkpoint_bytes, ports=ports,
                          clock={k: v for k, v in clocks.items() if not isinstance(v, Exception)},
                          bandwidth=bandwidth)
    for r in per_node:
        if r.check == "memory" and not facts[r.node].error:
            mem = parse_meminfo(facts[r.node].text("meminfo"))
            b = budgets.get(r.node)
            if budget_error and f"node {r.node}:" not in budget_error and re.search(r"\bnode \S+:", budget_error):
                r = Result("memory", r.node, Status.SKIPPED,
                       "budget not computed here: the plan stopped at another node (see its memory line)")
            elif budget_error:
                r = Result("memory", r.node, Status.FAILED, budget_error,
                       "free memory on the node, or lower memory.reserve_gib / gpu_memory_utilization only if the "
                       "host really has the room")
            elif b is not None and "MemAvailable" in mem and \
                    engines.get(r.node) in facts[r.node].text("containers").split():
                # the engine already holds its budget: judge the serving margin, not a fresh start
                r = serving_margin(r.node, mem["MemAvailable"], int(b.reserve_gib * GIB))
                r = Result("memory", r.node, r.status, "engine running: " + r.reason, r.fix)
            elif b is not None and "MemAvailable" in mem:
                r = memory_margin("memory", r.node, mem["MemAvailable"], int(b.engine_gib * GIB),
                                  int(b.reserve_gib * GIB), total=mem.get("MemTotal"))
        results.append(r)
    results += [check_nccl(n, got if isinstance(got, dict) else str(got), tag) for n, got in sorted(libs.items())]
    if inv.backend == "ray" and len(inv.nodes) > 1:
        results += [check_ray(n, got if isinstance(got, dict) else str(got), tag) for n, got in sorted(libs.items())]
    results.append(check_api_key(inv))
    return Examination(results, facts, time.monotonic() - t0)


def serving_image_tag(inv) -> str | None:
    """The tag `up` gives the serving image (it depends on the inventory and the overlays, not on facts)."""
    from sparkdeploy import plan as plan_mod
    from sparkdeploy import render

    try:
        return plan_mod.plan(inv, overlays_digest=render.overlays_digest()).image.tag
    except SparkdeployError:
        return None


