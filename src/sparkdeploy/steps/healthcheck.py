"""`health`: what the current release on the nodes should look like (expect) and the checks against it."""

from __future__ import annotations

from sparkdeploy import plan as P
from sparkdeploy.errors import RemoteError, SparkdeployError
from sparkdeploy.node import facts as F
from sparkdeploy.node import probes
from sparkdeploy.ops import health, releases
from sparkdeploy.steps import stale
from sparkdeploy.steps.base import FAILED, Outcome
from sparkdeploy.steps.context import Context, facts_from_dict
from sparkdeploy.verdict import Status


def expect(cx: Context) -> health.ServiceExpect:
    """What health should find, from the current release on the nodes (its recorded facts and probe); sets
    cx.names and cx.plan to that release's."""
    cx.scan()
    cur = cx.rel[cx.head].current
    return _expect(cx, releases.read_healthy(cx.conn(cx.head), cx.lay, cur) if cur else None)


def _expect(cx: Context, healthy: dict | None) -> health.ServiceExpect:
    """`expect` on releases already read into cx.rel; `healthy`: the current release's HEALTHY record."""
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
    exp_nodes = []
    for node in cx.plan.nodes:
        m = cx.rel.get(node.name, releases.NodeReleases()).complete.get(cur, {})
        reserve = int(node.memory.reserve_gib * F.GIB)
        exp_nodes.append(health.NodeExpect(
            node.name, node.role, node.unit_name, node.container_name, m.get("image_id"), reserve, cur,
            (cx.plan.api_port, cx.plan.master_port),
            ((cx.lay.watchdog_timer, *((cx.lay.exporter_unit,) if cx.plan.metrics_port else ()))
             if node.role == "head" else ()), (cx.lay.exporter_unit,)))
    return health.ServiceExpect(cx.plan.api_url, cx.plan.served_name, exp_nodes,
                                healthy.get("probe") if healthy else None,
                                api_key=cx.inv.auth.api_key())


def _probe_argv(cx: Context) -> list[str]:
    """Everything health reads on a node, one probe: its releases, health's node sections (the extra units of
    any role: each node's check keeps those it expects) and the stale units."""
    sections = {"releases": releases.SCAN, **health.NODE_SECTIONS, **stale.SECTIONS}
    values = {**releases.scan_values(cx.lay), **health.node_values(cx.lay),
              **stale.values([cx.inv.ports.api, cx.inv.ports.master])}
    return probes.named_probe_argv("health", sections, values, (cx.lay.watchdog_timer, cx.lay.exporter_unit))


def _read(cx: Context, names: list[str]) -> dict[str, dict[str, probes.Section] | Exception]:
    """The probe of each of `names` that is connected, one round trip per node; its releases go into cx.rel."""
    argv = _probe_argv(cx)
    res = cx.map(lambda c: probes.split_sections(c.query(argv, timeout=90, check=False).stdout),
                 [n for n in names if cx.connected(n)])
    for n, sections in res.items():
        if isinstance(sections, Exception):
            continue
        try:
            cx.rel[n] = releases.parse_scan(probes.section_text(sections, "releases"), n)
        except SparkdeployError as err:
            res[n] = err
    return res


def check(cx: Context) -> health.Report:
    rep = health.Report()
    out: list[Outcome] = []
    cx.connect(out, [n.name for n in cx.inv.nodes], required=False)
    for o in out:
        if o.status == FAILED and o.node in cx.names:
            rep.add("ssh", False, o.detail, o.node)
    if not cx.connected(cx.head):
        return rep
    read = _read(cx, cx.names)
    try:
        for n in cx.names:
            if isinstance(read.get(n), Exception) or n not in cx.rel:
                raise RemoteError(f"reading releases: {read.get(n, 'not connected')}", node=n)
        exp = _expect(cx, health.record(read[cx.head], "healthy"))
    except SparkdeployError as err:
        rep.add("release", False, str(err))
        return rep
    if not exp.nodes[0].release:
        rep.add("release", False, "nothing deployed: run `sparkdeploy up` (no release is current on the head)")
        return rep
    read.update(_read(cx, [e.name for e in exp.nodes if e.name not in read]))  # the release's nodes beyond --nodes
    for e in exp.nodes:
        if not cx.connected(e.name):
            continue
        r = read.get(e.name)
        if isinstance(r, Exception):
            rep.add("ssh", False, str(r), e.name)
            continue
        rep.add("ssh", True, "connected", e.name)
        health.check_node(rep, e, health.snapshot(r, cx.lay.unit, e.extra_units),
                          stale.parse(r, cx.inv.our_units(), [cx.inv.ports.api, cx.inv.ports.master]))
    health.check_api(rep, exp, probe_timeout=cx.opts.probe_timeout)
    speed = health.record(read[cx.head], "sentinel") or {}
    if isinstance(speed.get("verdict"), dict):  # the sentinel's last word on this release (bench/sentinel.py)
        v = speed["verdict"]
        rep.add("speed", True, f"release {exp.nodes[0].release}: {v.get('text')}",
                status=Status.WARN if v.get("regression") else None)
    return rep
