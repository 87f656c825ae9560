"""`host setup`: each node's guard rails (earlyoom, sshd's OOM protection, the CX-7 netplan with
--apply-network) read, compared with what the kit installs, and changed where they differ. Items are in the one
result vocabulary: ok, skipped, would change; applied, changed or failed (the items after a failure on that node
are skipped, not run). A dry run records the exact commands and writes and carries none out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from sparkdeploy.model.inventory import Node
from sparkdeploy.ops import hostsetup as hs
from sparkdeploy.remote.connection import recording
from sparkdeploy.remote.ssh import Pool
from sparkdeploy.verdict import Status


@dataclass
class HostSetup:
    items: dict[str, list[hs.Item]] = field(default_factory=dict)  # per node, each with its final status
    effects: dict[str, list[str]] = field(default_factory=dict)  # per node: the commands and writes (dry: would)
    failed: dict[str, str] = field(default_factory=dict)  # node -> why
    changes: int = 0  # items that changed (a dry run: would change)

    def to_dict(self, dry_run: bool) -> dict:
        return {"dry_run": dry_run, "changes": self.changes, "effects": self.effects, "failed": self.failed,
                "nodes": {k: [i.to_dict() for i in v] for k, v in self.items.items()}}


def host_setup(pool: Pool, nodes: Mapping[str, Node], *, dry_run: bool, apply_network: bool) -> HostSetup:
    """Read every reachable node, plan its items, apply those that would change (a dry run: record them)."""
    res = HostSetup(failed={name: str(e) for name, e in pool.open().items()})

    def read(conn) -> list[hs.Item]:
        n = nodes[conn.name]
        hca = tuple(dict.fromkeys(dev for link in n.data_links() for dev in link.hca))  # every link's
        state = hs.read_state(conn, hca, sudo=hs.sudo_prefix(n.ssh.user))
        return hs.plan_items(conn.name, state, netdev=n.netdev, data_ip=n.data_ip, hca=hca, links=n.data_links(),
                             apply_network=apply_network)

    for name, planned in pool.map(read).items():
        if isinstance(planned, Exception):
            res.failed[name] = str(planned)
        else:
            res.items[name] = planned
    res.changes = sum(1 for its in res.items.values() for i in its if i.status is hs.CHANGE)
    todo = [n for n, its in res.items.items() if any(i.status is hs.CHANGE for i in its)]
    with recording(dry=dry_run) as made:
        applied = pool.map(lambda c: hs.apply_items(c, res.items[c.name], sudo=hs.sudo_prefix(nodes[c.name].ssh.user)),
                           todo)
    res.effects = {n: [e for e in made if e.startswith(f"{n}: ")] for n in res.items}
    if dry_run:
        return res
    for name, outcome in applied.items():
        if isinstance(outcome, Exception):
            res.failed[name] = str(outcome)
            continue
        by_item = {a.item: a for a in outcome}
        for it in res.items[name]:
            if it.name in by_item:
                it.status = by_item[it.name].status
                if it.status is not Status.CHANGED:
                    it.note = by_item[it.name].detail
        bad = next((a.detail for a in outcome if a.status is Status.FAILED), None)
        if bad:
            res.failed.setdefault(name, bad)
    return res
