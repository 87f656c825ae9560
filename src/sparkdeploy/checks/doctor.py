"""`sparkdeploy doctor`: read each node once, then judge it with the pure checks of `preflight`.

The I/O is here: `examine()` connects, runs `probes.probe_argv(...)` (one fixed shell script, one SSH round
trip per node, which also tries every path the node must use: its peers' SSH port, the head's master port from
each worker, each service head's API port from the router's node), the clock samples (`clock_offset`) and the
bandwidth of each data link (each pair of nodes over each subnet they share, and a ring's cables to nodes outside
the service; `measure_bandwidth`: `ib_write_bw` where both ends have it, else
parallel TCP streams), the NCCL libraries of the host and of the serving image and the image's Ray
(`probes.image_libs_argv`), plans on the measured facts (`facts.from_probe`, the facts `up` gathers: a refusal
`up` would make is its own "plan" line, the budget judges the memory line), and hands everything to `preflight`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sparkdeploy.checks.preflight import GIB, Measured, NodeSpec, check_api_key, check_nccl, check_ray, run_checks
from sparkdeploy.errors import SparkdeployError
from sparkdeploy.model.topology import Link, LinkPair, link_pairs
from sparkdeploy.node.facts import from_probe
from sparkdeploy.node.layout import ENV_FILE
from sparkdeploy.node.memguard import memory_margin, serving_margin
from sparkdeploy.node.probes import (
    BANDWIDTH_PORT,
    HostFacts,
    bandwidth_receive_argv,
    bandwidth_send_argv,
    ib_write_bw_argv,
    image_libs_argv,
    parse_bandwidth,
    parse_ib_write_bw,
    parse_image_libs,
    parse_meminfo,
    parse_rdma,
    port_gid_index,
    probe_argv,
    reach_argv,
)
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


def rdma_path(link: Link, hf: HostFacts | None) -> tuple[str, int | None] | None:
    """(the HCA on the link's netdev, its RoCE v2 IPv4 GID index) where ib_write_bw is installed; else None."""
    if hf is None or hf.error or not hf.kv("tools").get("ib_write_bw"):
        return None
    ports = parse_rdma(hf.text("rdma"))
    for dev in link.hca:
        port = ports.get(dev)
        if port is not None and port.netdev == link.netdev:
            return dev, port_gid_index(port, link.ip)
    return None


#: The client of ib_write_bw retries until the server listens (started in parallel; it fails while none does).
_RETRY = 'i=0; until "$@"; do i=$((i+1)); [ $i -ge 40 ] && exit 1; sleep 0.5; done'


def measure_bandwidth(pool, pairs: list[LinkPair], up: list[str], facts: dict[str, HostFacts] | None = None
                      ) -> dict[LinkPair, Measured | str]:
    """{link pair: Measured or why not} for every link whose two ends answer, from a's address on it to b's, one
    link at a time (links measured together would share ports and halve each other). RDMA writes (`ib_write_bw`)
    where both ends have it and an HCA on that link's netdev; parallel TCP streams otherwise."""
    facts = facts or {}
    wait = 20.0  # for the receiver to be listening, and for the sender to connect
    out: dict[LinkPair, Measured | str] = {}
    for pair in [p for p in pairs if p.a in up and p.b in up]:
        a, b, src, dst = pair.a, pair.b, pair.a_link.ip, pair.b_link.ip
        rdma = rdma_path(pair.a_link, facts.get(a)), rdma_path(pair.b_link, facts.get(b))
        if rdma[0] and rdma[1]:
            argv = {b: ib_write_bw_argv(*rdma[1]),
                    a: ["sh", "-c", _RETRY, "retry", *ib_write_bw_argv(*rdma[0], server_ip=dst)]}
        else:
            argv = {b: bandwidth_receive_argv(dst, wait), a: bandwidth_send_argv(src, dst, wait)}
        done = pool.map(lambda c: c.run(argv[c.name], check=False, timeout=wait + 30), [a, b])
        recv, send = done[b], done[a]
        if isinstance(recv, Exception) or isinstance(send, Exception):
            out[pair] = str(recv if isinstance(recv, Exception) else send)
            continue
        try:
            out[pair] = Measured(parse_ib_write_bw(send.stdout), "ib_write_bw") if rdma[0] and rdma[1] else \
                Measured(parse_bandwidth(recv.stdout))
        except ValueError as err:
            tail = (recv.stderr.strip().splitlines() or send.stderr.strip().splitlines() or [str(err)])[-1]
            out[pair] = f"{'ib_write_bw to ' + dst if rdma[0] and rdma[1] else f'{dst}:{BANDWIDTH_PORT}'}: {tail}"
    return out


def service_links(inv) -> list[LinkPair]:
    """Every data link doctor checks for a service: each pair of its nodes over each subnet they share, and each
    cable from its nodes to a peer elsewhere in the inventory (a ring's third node)."""
    return link_pairs(inv.nodes, inv.elsewhere)


def link_peers(inv) -> list:
    """The nodes outside the service at the other end of one of its links: probed for their paths only."""
    names = {p.b for p in service_links(inv)} - {n.name for n in inv.nodes}
    return [n for n in inv.elsewhere if n.name in names]


def path_names(pairs: list[LinkPair]) -> dict[tuple[str, str], str]:
    """{(node, address it tries): 'node netdev -> peer netdev'}, both directions of each link, for the verdicts."""
    out = {}
    for p in pairs:
        out[(p.a, p.b_link.ip)] = p.describe()
        out[(p.b, p.a_link.ip)] = LinkPair(p.b, p.b_link, p.a, p.a_link).describe()
    return out


def reach_targets(inv) -> dict[str, list[str]]:
    """{node: the data-plane targets it must reach}: the SSH port of the other end of each of its links (every
    link, so on a ring each cable); the head's master port from each worker (torch.distributed, or the Ray
    head's GCS with backend: ray); and from the router's node each service head's API port (the router forwards
    there), across services."""
    from sparkdeploy.model import inventory as inventory_mod

    out: dict[str, list[str]] = {n.name: [] for n in inv.nodes}
    for p in service_links(inv):
        out.setdefault(p.a, []).append(p.b_link.ip)
        out.setdefault(p.b, []).append(p.a_link.ip)
    for n in inv.nodes:
        if n.name != inv.head.name:
            out[n.name].append(f"{inv.head.data_ip}:{inv.ports.master}")
    if inv.router is not None:
        heads = inventory_mod.load_services(inv.file) if inv.services else (inv,)
        out.setdefault(inv.router.node.name, []).extend(f"{v.head.data_ip}:{v.ports.api}" for v in heads)
    return {k: list(dict.fromkeys(v)) for k, v in out.items()}


def plan_verdict(inv, measured) -> tuple[dict, dict, str | None, Result | None]:
    """Each node's memory budget and engine name from the planner on the measured facts, the planner's memory
    refusal, and a refusal about anything else (a netdev, an address, an RoCE device, the GPU, the profile) as
    its own "plan" line: `up` would stop the same way. After such a refusal the budgets come from the same facts
    without the links and with the declared GPU, so the memory line still judges the memory."""
    from dataclasses import replace

    from sparkdeploy import plan as plan_mod
    from sparkdeploy.errors import BudgetError, PlanError

    refused = None
    for facts in (measured, {k: replace(f, netdevs=(), roce=(), has_gpu=inv.node(k).has_gpu)
                             for k, f in measured.items()}):
        try:
            pl = plan_mod.plan(inv, facts)
            return ({n.name: n.memory for n in pl.nodes}, {n.name: n.container_name for n in pl.nodes}, None,
                    refused)
        except BudgetError as err:
            return {}, {}, str(err), refused
        except PlanError as err:
            refused = refused or Result("plan", err.node or "cluster", Status.FAILED, f"up would refuse: {err}",
                                        "the field the message names (inventory.yaml or the profile), or the node "
                                        "(see its own lines)")
    return {}, {}, None, refused


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
                "results": [r.to_dict() for r in self.results]}


def read_facts(inv, given, errors, outs) -> dict[str, HostFacts]:
    """Each node's parsed probe (or why it has none); a facts file's gpu_name/driver replace nvidia-smi's."""
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
    return facts


def examine(inv, *, facts_file: str | None = None, checkpoint_dir: str | None = None,
            trust_new_hosts: bool = False, pool=None) -> Examination:
    """Probe every node of the inventory (in parallel) and run every check."""
    import time

    from sparkdeploy.model.facts_file import load_facts_file
    from sparkdeploy.remote.ssh import Pool, target_of

    t0 = time.monotonic()
    ckpt = checkpoint_dir or inv.profile.host_dir
    specs = [spec_of(n, ckpt) for n in inv.nodes]
    given = load_facts_file(facts_file) if facts_file else {}
    own = pool is None
    names = {n.name for n in inv.nodes}
    router = inv.router.node if inv.router is not None and inv.router.node.name not in names else None
    outside = {n.name: n for n in (*([router] if router else []), *link_peers(inv))}  # probed for paths only
    pool = pool or Pool([target_of(n.name, n.ssh) for n in (*inv.nodes, *outside.values())],
                        trust_new_hosts=trust_new_hosts)
    try:
        errors = pool.open()
        up = [n.name for n in inv.nodes if n.name in pool.conns]
        targets = reach_targets(inv)
        deployed_env = f"{inv.layout.current_link}/{ENV_FILE}"
        outs = pool.map(lambda c: c.run(probe_argv(ckpt, targets[c.name], deployed_env), check=False, timeout=180),
                        up)
        facts = read_facts(inv, given, errors, outs)
        reached = [n for n in outside if n in pool.conns]
        got = pool.map(lambda c: c.run(reach_argv(targets[c.name]), check=False, timeout=60), reached) \
            if reached else {}
        outside_facts = {}
        for name in outside:
            out = got.get(name, errors.get(name, "no connection"))
            outside_facts[name] = HostFacts(name, error=str(out)) if isinstance(out, (Exception, str)) \
                else HostFacts.from_output(name, out.stdout)
        clocks = pool.map(clock_offset, up)
        bandwidth = measure_bandwidth(pool, service_links(inv), [*up, *reached], facts)
        tag = serving_image_tag(inv)
        libs = pool.map(lambda c: parse_image_libs(c.run(image_libs_argv(tag), check=False, timeout=180).stdout),
                        up) if tag else {}
    finally:
        if own:
            pool.close()


    # the planner on the measured facts (the same facts `up` gathers): its budgets are never recomputed here
    measured = {n.name: from_probe(n, facts[n.name]) for n in inv.nodes if not facts[n.name].error}
    measured = {k: v for k, v in measured.items() if v.mem_total_bytes}
    budgets, engines, budget_error, refusal = plan_verdict(inv, measured) if measured else ({}, {}, None, None)
    head_present = int(facts[inv.head.name].kv("disk").get("ckpt_present") or 0) if not facts[inv.head.name].error else 0
    checkpoint_bytes = max(head_present, int(inv.profile.weights_gib * GIB)) if ckpt else 0
    ports = (inv.ports.api, inv.ports.master)
    results: list[Result] = []
    per_node = run_checks(specs, facts, checkpoint_bytes=checkpoint_bytes, ports=ports,
                          clock={k: v for k, v in clocks.items() if not isinstance(v, Exception)},
                          bandwidth=bandwidth, pinned_gid=dict(inv.profile.env).get("NCCL_IB_GID_INDEX"),
                          outside=outside_facts, paths=path_names(service_links(inv)))
    for r in per_node:
        if r.check == "memory" and not facts[r.node].error:
            mem = parse_meminfo(facts[r.node].text("meminfo"))
            b = budgets.get(r.node)
            if refusal and b is None and not budget_error:
                r = Result("memory", r.node, Status.SKIPPED,
                           "budget not computed here: the plan stopped before it (see the plan line)")
            elif budget_error and f"node {r.node}:" not in budget_error and re.search(r"\bnode \S+:", budget_error):
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
    results += [refusal] if refusal else []
    results += [check_nccl(n, got if isinstance(got, dict) else str(got), tag) for n, got in sorted(libs.items())]
    if inv.backend == "ray" and len(inv.nodes) > 1:
        results += [check_ray(n, got if isinstance(got, dict) else str(got), tag) for n, got in sorted(libs.items())]
    results.append(check_api_key(inv))
    return Examination(results, facts, time.monotonic() - t0)


def serving_image_tag(inv) -> str | None:
    """The tag `up` gives the serving image (it depends on the inventory and the overlays, not on facts)."""
    from sparkdeploy import plan as plan_mod
    from sparkdeploy.plan import render

    try:
        return plan_mod.plan(inv, overlays_digest=render.overlays_digest()).image.tag
    except SparkdeployError:
        return None


