"""The cluster context every procedure works on: the inventory, the options, the connections (head first), the
plan and its rendered files, and the releases found on the nodes. All of its state is created here; the
procedures (steps/*.py) read and set these attributes and nothing else."""

from __future__ import annotations

import posixpath
import time
from dataclasses import dataclass
from typing import Callable

from sparkdeploy import paths, poll
from sparkdeploy import plan as P
from sparkdeploy.errors import InventoryError, RemoteError
from sparkdeploy.model import inventory as I
from sparkdeploy.node import facts as F
from sparkdeploy.node import probes
from sparkdeploy.ops import gather, releases, rotation
from sparkdeploy.plan import render
from sparkdeploy.remote.connection import Conn
from sparkdeploy.remote.ssh import Pool, target_of
from sparkdeploy.steps.base import FAILED, OK, Outcome, StepFailed

Log = Callable[[str], None]


@dataclass
class Options:
    nodes: int | None = None
    dry_run: bool = False
    trust_new_hosts: bool = False
    ready_timeout: float = 900.0  # model load + JIT can take many minutes on a Spark
    probe_timeout: float = 60.0
    rollback_timeout: float = 900.0
    watchdog_grace: float | None = None  # default: ready_timeout
    watchdog_backoff_s: float = 30.0
    watchdog_cap: int = 4
    log: Log = lambda msg: None


def facts_from_dict(d: dict) -> F.NodeFacts:
    """NodeFacts back from the dict a release recorded in its release.json."""
    d = dict(d)
    d["netdevs"] = tuple(probes.NetDev(n["name"], tuple(n.get("ipv4") or ()), n.get("mtu"), n.get("up")) for n in d.get("netdevs") or ())
    d["roce"] = tuple(F.RoceDev(r["name"], r.get("netdev"), r.get("port", 1), r.get("gid_index")) for r in d.get("roce") or ())
    d["units"] = tuple(d.get("units") or ())
    return F.NodeFacts(**d)


class Context:
    """Connections + plan for one inventory."""

    def __init__(self, inventory, opts: Options):
        self.inv = inventory
        self.lay = inventory.layout  # this service's names and paths on its nodes
        self.opts = opts
        self.log = opts.log
        chosen, _, _ = P.node_layout(inventory, opts.nodes)  # which nodes take part, head first
        self.names: list[str] = [n.name for n in chosen]
        reachable = (*inventory.nodes, *inventory.elsewhere)
        # the inventory's nodes outside this plan (`up --nodes 1`, or a service moved off them): `up` retires
        # this service's units found there
        self.others: list[str] = [n.name for n in reachable if n.name not in self.names]
        self.pool = Pool([target_of(n.name, n.ssh) for n in reachable], trust_new_hosts=opts.trust_new_hosts)
        self.plan: P.Plan | None = None
        self.files: dict[str, bytes] = {}
        self.facts: dict[str, F.NodeFacts] = {}
        self.rel: dict[str, releases.NodeReleases] = {}
        self.image_id: str | None = None  # the serving image's id (set by the image step)
        self.image_received: dict[str, int] = {}  # bytes each node received while the image was delivered
        self.image_push_tries: list[int] = []  # bytes per try of a push through the SSH tunnel (a retry re-sends)
        self.image_seconds: float = 0.0  # the image step's wall time
        self.rotation: rotation.Rotation | None = None  # a replica's place at the router (load_context)

    def close(self):
        self.pool.close()

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def head(self) -> str:
        return self.names[0]

    def conn(self, name: str) -> Conn:
        """The node's connection, reconnected if the node rebooted or the link dropped since."""
        return self.pool.get(name)

    def connected(self, name: str) -> bool:
        return name in self.pool.conns

    def map(self, fn, names: list[str] | None = None) -> dict:
        """fn(conn) on the nodes in parallel: {node: result or the exception it raised}."""
        return self.pool.map(fn, self.names if names is None else names)

    def each(self, fn, what: str, names: list[str] | None = None) -> dict:
        """fn(conn) on the nodes in parallel; the first node that failed raises RemoteError("{what}: ...")."""
        res = self.map(fn, names)
        for n, r in res.items():
            if isinstance(r, Exception):
                raise RemoteError(f"{what}: {r}", node=n)
        return res

    # ------------------------------------------------------------------------------------ connect + plan
    def connect(self, out: list[Outcome], names: list[str] | None = None, required: bool = True) -> None:
        names = names or self.names
        t0 = time.monotonic()
        errs = self.pool.open(names)
        for n in names:
            if n in errs:
                out.append(Outcome("connect", n, FAILED, str(errs[n]), [], time.monotonic() - t0))
            else:
                out.append(Outcome("connect", n, OK, "", [], time.monotonic() - t0))
        bad = [n for n in names if n in errs]
        if bad and required:
            raise StepFailed("connect", [o for o in out if o.step == "connect"])

    def reconnect(self, names: list[str] | None = None, wait: float = 0.0) -> dict[str, Exception]:
        """Drop and re-open connections (after a node rebooted); retry for up to `wait` seconds."""
        left = list(names or self.names)
        errs: dict[str, Exception] = {}

        def attempt() -> None:
            nonlocal left, errs
            for n in left:
                c = self.pool.conns.pop(n, None)
                if c is not None:
                    try:
                        c.close()
                    except Exception:  # noqa: BLE001
                        pass
            errs = self.pool.open(left)
            if errs:
                left = list(errs)
                raise poll.NotYet(", ".join(errs))

        try:
            poll.until(attempt, timeout=wait, interval=3)
        except poll.TimedOut:
            pass
        return errs

    def scan(self, names: list[str] | None = None) -> dict[str, releases.NodeReleases]:
        names = names or self.names
        res = self.pool.map(lambda c: releases.scan(c, self.lay), names)
        for n, r in res.items():
            if isinstance(r, Exception):
                raise RemoteError(f"reading releases: {r}", node=n)
        self.rel.update(res)
        return res

    def make_plan(self, out: list[Outcome]) -> P.Plan:
        """Gather facts (or re-use the current release's while its engine runs), plan, render."""
        def facts_for(name: str) -> tuple[F.NodeFacts, str]:
            c = self.conn(name)
            nr = self.rel[name]
            meta = nr.complete.get(nr.current) if nr.current else None
            running = c.query(["systemctl", "is-active", "--quiet", self.lay.unit], check=False).ok
            if meta and running and meta.get("facts"):
                return facts_from_dict(meta["facts"]), f"re-used the facts of release {nr.current} (engine running)"
            return gather.gather(c, self.inv.node(name)), "measured"

        t0 = time.monotonic()
        res = self.pool.map(lambda c: facts_for(c.name), self.names)
        facts = {}
        for n in self.names:
            r = res[n]
            if isinstance(r, Exception):
                out.append(Outcome("facts", n, FAILED, str(r)))
                raise StepFailed("facts", [o for o in out if o.step == "facts"])
            facts[n] = r[0]
            out.append(Outcome("facts", n, OK, r[1], [], time.monotonic() - t0))
        self.facts = facts
        self.plan = P.plan(self.inv, facts, self.opts.nodes, git_commit=paths.git_commit(),
                           overlays_digest=render.overlays_digest(), checkpoint=self.head_checkpoint())
        self.files = render.render(self.plan)
        return self.plan

    def head_checkpoint(self):
        """The checkpoint facts of model.host_dir on the head; refuses (InventoryError, nothing changed yet) when the
        profile names a host_dir that holds no config.json there: the engine would fail only after the switch."""
        p = self.inv.profile
        ckpt = gather.checkpoint_facts(self.conn(self.head), p.host_dir)
        if p.host_dir and ckpt is None:
            raise InventoryError(
                f"{p.host_dir} on {self.head} holds no config.json: put the checkpoint there first with "
                "`sparkdeploy weights fetch` (downloads model.id) or by copying it, then `sparkdeploy weights sync` "
                "for the other nodes", file=p.file, field="model.host_dir")
        return ckpt

    def release_plan(self, num: int) -> P.Plan:
        """The plan a recorded release ran under: this inventory with the facts that release recorded, judged
        by what it recorded (Plan.served_as: its port, served name, memory budgets, checkpoint dir)."""
        meta = self.rel[self.head].complete[num]
        return P.plan(self.inv, {n: facts_from_dict(self.rel[n].complete[num]["facts"]) for n in self.names},
                      self.opts.nodes).as_served(meta.get("served_as"))

    # ------------------------------------------------------------------------------------------ desired
    def unit_files(self, name: str) -> dict[str, bytes]:
        pre = f"{name}/unit/"
        return {posixpath.join("/etc/systemd/system", k[len(pre):]): v for k, v in self.files.items() if k.startswith(pre)}


def load_context(inventory_path: str, opts: Options, service: str | None = None) -> Context:
    """The context of one service of the inventory (`service`, or its only one); a replica behind the router
    with the rotation it leaves while it restarts."""
    views = I.load_services(inventory_path)
    cx = Context(I.select(views, service, inventory_path), opts)
    cx.rotation = rotation.of(cx.inv, views, opts.log)
    return cx
