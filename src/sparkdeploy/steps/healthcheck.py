"""`health`: what the current release on the nodes should look like (expect) and the checks against it."""

from __future__ import annotations

from sparkdeploy import facts as F
from sparkdeploy import health, releases
from sparkdeploy import plan as P
from sparkdeploy.errors import SparkdeployError
from sparkdeploy.connection import Conn
from sparkdeploy.steps import stale
from sparkdeploy.steps.base import FAILED, Outcome
from sparkdeploy.steps.context import Context, facts_from_dict, served
from sparkdeploy.verdict import Status


def expect(cx: Context) -> health.ServiceExpect:
    """What health should find, from the current release on the nodes (its recorded facts and probe); sets
    cx.names and cx.plan to that release's."""
    cx.scan()
    cur = cx.rel[cx.head].current
    meta = cx.rel[cx.head].complete.get(cur, {}) if cur else {}
    nodes_in = meta.get("nodes") or cx.names
    cx.names = [n for n in nodes_in if n in [x.name for x in cx.inv.nodes]]
    facts = {}
    for n in cx.names:
        m = cx.rel.get(n, releases.NodeReleases()).complete.get(cur) if n in cx.rel else None
        if m and m.get("facts"):
            facts[n] = facts_from_dict(m["facts"])
    cx.plan = P.plan(cx.inv, facts or None, len(cx.names))
    rec = releases.read_healthy(cx.conn(cx.head), cx.lay, cur) if cur else None
    exp_nodes = []
    for node in cx.plan.nodes:
        m = cx.rel.get(node.name, releases.NodeReleases()).complete.get(cur, {})
        reserve = int(node.memory.reserve_gib * F.GIB)
        exp_nodes.append(health.NodeExpect(
            node.name, node.role, node.unit_name, node.container_name, m.get("image_id"), reserve, cur,
            (cx.plan.api_port, cx.plan.master_port),
            ((cx.lay.watchdog_timer, *((cx.lay.exporter_unit,) if cx.plan.metrics_port else ()))
             if node.role == "head" else ()), (cx.lay.exporter_unit,)))
    return health.ServiceExpect(cx.plan.api_url, served(cx.plan), exp_nodes, rec.get("probe") if rec else None,
                                api_key=cx.inv.auth.api_key())


def check(cx: Context) -> health.Report:
    rep = health.Report()
    out: list[Outcome] = []
    cx.connect(out, [n.name for n in cx.inv.nodes], required=False)
    for o in out:
        if o.status == FAILED and o.node in cx.names:
            rep.add("ssh", False, o.detail, o.node)
    if not cx.connected(cx.head):
        return rep
    try:
        exp = expect(cx)
    except SparkdeployError as err:
        rep.add("release", False, str(err))
        return rep
    if not exp.nodes[0].release:
        rep.add("release", False, "nothing deployed: run `sparkdeploy up` (no release is current on the head)")
        return rep
    ours = cx.inv.our_units()
    ports = [cx.plan.api_port, cx.plan.master_port]

    def node_check(c: Conn):
        ne = next(e for e in exp.nodes if e.name == c.name)
        return ne, health.node_snapshot(c, cx.lay, ne.extra_units), stale.find(c, ours, ports)

    res = cx.map(node_check, [e.name for e in exp.nodes if cx.connected(e.name)])
    for e in exp.nodes:
        if not cx.connected(e.name):
            continue
        r = res[e.name]
        if isinstance(r, Exception):
            rep.add("ssh", False, str(r), e.name)
            continue
        rep.add("ssh", True, "connected", e.name)
        health.check_node(rep, *r)
    health.check_api(rep, exp, probe_timeout=cx.opts.probe_timeout)
    speed = releases.read_sentinel(cx.conn(cx.head), cx.lay, exp.nodes[0].release) or {}
    if isinstance(speed.get("verdict"), dict):  # the sentinel's last word on this release (bench/sentinel.py)
        v = speed["verdict"]
        rep.add("speed", True, f"release {exp.nodes[0].release}: {v.get('text')}",
                status=Status.WARN if v.get("regression") else None)
    return rep
