"""The main job: `up` (converge the nodes on the plan), `down`, `rollback`, and the health gate.

Order of `up` (each a step with ok | changed | failed per node; a failure stops before anything is switched):

    connect -> facts -> plan + render -> stale units -> image -> vocab -> release files -> units
    -> supervision wiring -> [switch + restart: stop head, stop workers, switch `current`, start workers, head]
    -> wait for readiness -> health gate (temperature-0 probe recorded) -> prune

Nothing is half-applied: files land in a new numbered release directory that no unit reads until every node
holds all of it; `current` is switched on all nodes only then. A failed gate switches back to the last
healthy release (automatic rollback) or stops the service with the reason.

Idempotence: facts are re-used from the current release while its engine runs (measuring MemAvailable with
the engine loaded would change the memory figures and so the release), and the desired files are compared
byte for byte with the current release's: nothing differs -> no new release, no restart, zero changes.
"""

from __future__ import annotations

import posixpath
import time
from dataclasses import dataclass, field
from typing import Callable

import requests

from sparkdeploy import layout
from sparkdeploy import facts as F
from sparkdeploy import credentials, faults, gather, health, paths, releases, render
from sparkdeploy import plan as P
from sparkdeploy.errors import HealthError, InputError, InventoryError, RemoteError, SparkdeployError
from sparkdeploy.remote import Conn, Pool, host_key_line, target_of
from sparkdeploy.steps import image as img
from sparkdeploy.steps import stale, supervise
from sparkdeploy.steps.base import CHANGED, FAILED, OK, WOULD, Action, Outcome, StepFailed, run_step

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


@dataclass
class UpResult:
    outcomes: list[Outcome] = field(default_factory=list)
    release: int | None = None
    new_release: bool = False
    restarted: bool = False
    rolled_back_to: int | None = None
    healthy: bool = False
    message: str = ""
    seconds: float = 0.0
    probe: str | None = None

    @property
    def changes(self) -> int:
        return sum(len(o.actions) for o in self.outcomes if o.status in (CHANGED, WOULD))

    def to_dict(self) -> dict:
        return {"healthy": self.healthy, "release": self.release, "new_release": self.new_release,
                "restarted": self.restarted, "rolled_back_to": self.rolled_back_to, "changes": self.changes,
                "seconds": round(self.seconds, 2), "message": self.message, "probe": self.probe,
                "outcomes": [o.to_dict() for o in self.outcomes]}


def _served(plan: P.Plan) -> str:
    return supervise._served(plan)


def _facts_from_dict(d: dict) -> F.NodeFacts:
    d = dict(d)
    d["netdevs"] = tuple(F.NetDev(n["name"], tuple(n.get("ipv4") or ()), n.get("mtu"), n.get("up")) for n in d.get("netdevs") or ())
    d["roce"] = tuple(F.RoceDev(r["name"], r.get("netdev"), r.get("port", 1), r.get("gid_index")) for r in d.get("roce") or ())
    d["units"] = tuple(d.get("units") or ())
    return F.NodeFacts(**d)


class Cluster:
    """Connections + plan for one inventory; the verbs (`up`, `down`, ...) are methods."""

    def __init__(self, inventory, opts: Options):
        self.inv = inventory
        self.opts = opts
        self.log = opts.log
        chosen, _, _ = P._layout(inventory, opts.nodes)  # which nodes take part, head first
        self.names = [n.name for n in chosen]
        self.others = [n.name for n in inventory.nodes if n.name not in self.names]
        self.pool = Pool([target_of(n.name, n.ssh) for n in inventory.nodes], trust_new_hosts=opts.trust_new_hosts)
        self.plan: P.Plan | None = None
        self.files: dict[str, bytes] = {}
        self.rel: dict[str, releases.NodeReleases] = {}

    def close(self):
        self.pool.close()

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def head(self) -> str:
        return self.names[0]

    def conn(self, name: str) -> Conn:
        """The node's connection, reconnected if the node rebooted or the link dropped since."""
        return self.pool.get(name)

    # ------------------------------------------------------------------------------------ connect + plan
    def connect(self, out: list[Outcome], names: list[str] | None = None, required: bool = True) -> None:
        names = names or self.names
        t0 = time.monotonic()
        errs = self.pool.open()
        for n in names:
            if n in errs:
                out.append(Outcome("connect", n, FAILED, str(errs[n]), [], time.monotonic() - t0))
            else:
                out.append(Outcome("connect", n, OK, "", [], time.monotonic() - t0))
        bad = [n for n in names if n in errs]
        if bad and required:
            raise StepFailed("connect", [o for o in out if o.step == "connect"])

    def scan(self, names: list[str] | None = None) -> dict[str, releases.NodeReleases]:
        names = names or self.names
        res = self.pool.map(releases.scan, names)
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
            running = c.run(["systemctl", "is-active", "--quiet", layout.UNIT_NAME], check=False).ok
            if meta and running and meta.get("facts"):
                return _facts_from_dict(meta["facts"]), f"re-used the facts of release {nr.current} (engine running)"
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

    # ------------------------------------------------------------------------------------------ desired
    def release_files(self, name: str, number: int) -> dict[str, tuple[bytes, int]]:
        pre = f"{name}/release/"
        out = {k[len(pre):]: (v, render.file_mode(k)) for k, v in self.files.items() if k.startswith(pre)}
        if name == self.head:
            out[supervise.CONFIG] = (supervise.config(self.plan, self.plan.release_id), 0o644)
        return out

    def unit_files(self, name: str) -> dict[str, bytes]:
        pre = f"{name}/unit/"
        return {posixpath.join("/etc/systemd/system", k[len(pre):]): v for k, v in self.files.items() if k.startswith(pre)}

    def image_context(self) -> dict[str, bytes]:
        return img.context(self.plan, self.files)

    # -------------------------------------------------------------------------------------------- steps
    def step_stale(self, out: list[Outcome]) -> None:
        ours = [layout.UNIT_NAME, supervise.SERVICE]
        ports = [self.plan.api_port, self.plan.master_port]
        out += run_step("stale units", self.names, lambda n: stale.diff(self.conn(n), ours, ports),
                        dry_run=self.opts.dry_run, log=self.log)

    def step_image(self, out: list[Outcome]) -> str | None:
        """The serving image on every node, as layers through the head's registry (steps/image.py: converge)."""
        self.image_id = img.converge(self, out)
        return self.image_id

    def step_vocab(self, out: list[Outcome]) -> None:
        src = self.plan.image.vocab_source
        if not src:
            out += [Outcome("vocab", n, OK, "no draft vocab in this plan") for n in self.names]
            return
        data = open(src, "rb").read()
        digest = releases.sha(data)
        d = layout.VOCAB_HOST_DIR

        def diff(n: str) -> list[Action]:
            c = self.conn(n)
            acts = []
            if c.run(["sha256sum", f"{d}/{digest}.txt"], check=False).stdout.split()[:1] != [digest]:
                acts.append(Action(f"write {d}/{digest}.txt", lambda: (c.run(["mkdir", "-p", d]),
                                                                       c.put(f"{d}/{digest}.txt", data))))
            if c.run(["readlink", f"{d}/current.txt"], check=False).stdout.strip() != f"{digest}.txt":
                acts.append(Action(f"point {d}/current.txt at {digest[:12]}",
                                   lambda: (c.run(["mkdir", "-p", d]), c.symlink(f"{d}/current.txt", f"{digest}.txt"))))
            return acts

        out += run_step("vocab", self.names, diff, dry_run=self.opts.dry_run, log=self.log)

    def step_secrets(self, out: list[Outcome]) -> None:
        """The engine's secrets in their own root-owned 0600 env file (never in a release, argv or a log line)."""
        values = self.inv.auth.engine_env()
        data = credentials.env_file(values)
        digest = releases.sha(data)
        path = layout.SECRETS_ENV
        what = ", ".join(f"{k} {v}" for k, v in self.plan.secrets.items())

        def diff(n: str) -> list[Action]:
            c = self.conn(n)
            have = c.run(["sha256sum", path], check=False)
            if not values:
                return [Action(f"remove {path} (no auth.api_key_file)", lambda: c.run(["rm", "-f", path]))] \
                    if have.ok else []
            mode = c.run(["stat", "-c", "%a %U", path], check=False).stdout.split()
            if have.stdout.split()[:1] == [digest] and mode == ["600", "root"]:
                return []
            return [Action(f"write {path} (mode 0600, root; {what})",
                           lambda: (c.run(["mkdir", "-p", posixpath.dirname(path)]),
                                    c.put(path, data, mode=0o600, owner="root:root")))]

        out += run_step("secrets", self.names, diff, dry_run=self.opts.dry_run, log=self.log)

    def current_matches(self) -> tuple[bool, dict[str, str]]:
        """Does every node's current release hold exactly the desired files and image? (reason per node)"""
        why = {}
        for n in self.names:
            nr = self.rel[n]
            if nr.current is None or nr.current not in nr.complete:
                why[n] = "no current release"
                continue
            meta = nr.complete[nr.current]
            want = {k: releases.sha(v) for k, (v, _) in self.release_files(n, nr.current).items()}
            if meta.get("files") != want:
                diff = sorted(k for k in set(want) | set(meta.get("files", {}))
                              if want.get(k) != meta.get("files", {}).get(k))
                why[n] = f"release {nr.current} differs in {', '.join(diff)}"
            elif meta.get("image_id") != getattr(self, "image_id", None):
                why[n] = f"release {nr.current} uses image {str(meta.get('image_id'))[:19]}"
        nums = {self.rel[n].current for n in self.names}
        if not why and len(nums) != 1:
            why = {n: f"current release {self.rel[n].current} differs across nodes" for n in self.names}
        return not why, why

    def step_release(self, out: list[Outcome]) -> int:
        """Write a new numbered release on every node if anything differs; returns the release to run."""
        same, why = self.current_matches()
        if same:
            num = self.rel[self.head].current
            out += [Outcome("release", n, OK, f"release {num} is current") for n in self.names]
            return num
        newest = max(nr.newest for nr in self.rel.values())
        # An aborted or failed attempt (newest number, current nowhere, healthy nowhere) is rewritten in place.
        reuse = newest and all(nr.current != newest and newest not in nr.healthy for nr in self.rel.values())
        num = newest if reuse else newest + 1
        meta = {"fingerprint": self.plan.release_id, "image": self.plan.image.tag, "image_id": self.image_id,
                "nodes": self.names, "kit_version": self.plan.kit_version, "git_commit": paths.git_commit()}

        def diff(n: str) -> list[Action]:
            files = self.release_files(n, num)

            def write():
                m = dict(meta, node=n, facts=self.facts[n].to_dict(), reason=why.get(n, "another node changed"))
                releases.write(self.conn(n), num, files, m)

            return [Action(f"write release {num} ({', '.join(sorted(files))}): {why.get(n, 'another node changed')}",
                           write)]

        out += run_step("release", self.names, diff, dry_run=self.opts.dry_run, log=self.log)
        return num

    def step_units(self, out: list[Outcome]) -> None:
        def diff(n: str) -> list[Action]:
            c = self.conn(n)
            acts = []
            units = self.unit_files(n)
            changed = [p for p, data in units.items() if c.get(p) != data]
            if changed:
                def install(c=c, changed=changed, units=units):
                    for p in changed:
                        c.put(p, units[p])
                    c.run(["systemctl", "daemon-reload"])
                acts.append(Action(f"install {', '.join(posixpath.basename(p) for p in changed)} + daemon-reload", install))
            if c.run(["systemctl", "is-enabled", layout.UNIT_NAME], check=False).stdout.strip() != "enabled":
                acts.append(Action(f"enable {layout.UNIT_NAME}", lambda c=c: c.run(["systemctl", "enable", layout.UNIT_NAME])))
            return acts

        out += run_step("units", self.names, diff, dry_run=self.opts.dry_run, log=self.log)

    def step_supervision(self, out: list[Outcome]) -> None:
        head = self.conn(self.head)
        workers = self.names[1:]
        if self.opts.dry_run:
            pub = "ssh-ed25519 AAAA(dry-run) x"
        else:
            pub = supervise.ensure_key(head)
        out += run_step("supervision", workers, lambda n: supervise.worker_actions(self.conn(n), pub),
                        dry_run=self.opts.dry_run, log=self.log) if workers else []
        known = [host_key_line(self.conn(n), self.plan.node(n).ssh.host, self.plan.node(n).ssh.port)
                 for n in workers]
        knobs = supervise.settings(start_grace_s=self.opts.watchdog_grace or self.opts.ready_timeout,
                                   backoff_base_s=self.opts.watchdog_backoff_s, retry_cap=self.opts.watchdog_cap)
        out += run_step("supervision", [self.head],
                        lambda n: supervise.head_actions(head, known, supervise.unit_files(), knobs),
                        dry_run=self.opts.dry_run, log=self.log)

    # ------------------------------------------------------------------------------------ engine control
    def watchdog(self, on: bool) -> None:
        """Stop the timer while we stop/start ranks ourselves; on start, the watchdog begins with a clean slate."""
        c = self.conn(self.head)
        if on:
            c.run(["rm", "-f", layout.WATCHDOG_STATE], check=False)
            c.run(["systemctl", "start", supervise.TIMER], check=False)
        else:
            c.run(["systemctl", "stop", supervise.TIMER, supervise.SERVICE], check=False, timeout=330)

    def watchdog_active(self) -> bool:
        return self.conn(self.head).run(["systemctl", "is-active", "--quiet", supervise.TIMER], check=False).ok

    def stop_all(self, names: list[str] | None = None) -> None:
        """Head first (it holds the rendezvous and the API), then the workers in parallel."""
        names = names or self.names
        self.watchdog(False)
        if self.head in names:
            self.conn(self.head).run(["systemctl", "stop", layout.UNIT_NAME], timeout=120)
        rest = [n for n in names if n != self.head]
        res = self.pool.map(lambda c: c.run(["systemctl", "stop", layout.UNIT_NAME], timeout=120), rest)
        for n, r in res.items():
            if isinstance(r, Exception):
                raise RemoteError(f"stopping the engine: {r}", node=n)

    def start_all(self) -> None:
        """Evict the checkpoint's page cache and refuse a start the plan's memory budget cannot hold (the
        field's OOM cascades); then workers first (they wait for the head's rendezvous), the head last."""
        from sparkdeploy import weights

        _, guards = weights.evict_and_guard(self.pool, self.plan, self.inv.profile.host_dir)
        for g in guards:
            if g.verdict.value != "ok":
                self.log(f"{g.node}: memory guard {g.verdict.value}: {g.reason}")
        faults.hit("memory-guard")
        weights.enforce(guards)
        for node in self.plan.start_order:
            self.conn(node.name).run(["systemctl", "reset-failed", layout.UNIT_NAME], check=False)
            self.conn(node.name).run(["systemctl", "start", layout.UNIT_NAME], timeout=120)
            self.log(f"{node.name}: started {layout.UNIT_NAME} ({node.role}, rank {node.rank})")

    def switch(self, num: int) -> None:
        res = self.pool.map(lambda c: releases.switch(c, num), self.names)
        for n, r in res.items():
            if isinstance(r, Exception):
                raise RemoteError(f"switching to release {num}: {r}", node=n)
        # The draft list follows the release (a release made by `vocab rollout` names another list than up's).
        from sparkdeploy import vocab_live

        for n, r in self.pool.map(vocab_live.follow_release, self.names).items():
            if isinstance(r, Exception):
                raise RemoteError(f"pointing the draft list at release {num}'s: {r}", node=n)

    def wait_ready(self, timeout: float) -> str:
        """Poll the head until a real temperature-0 completion answers; returns its text."""
        url = self.plan.api_url
        try:
            return health.wait_answering(url, _served(self.plan), timeout=timeout,
                                         probe_timeout=self.opts.probe_timeout, log=self.log,
                                         api_key=self.inv.auth.api_key())
        except health.NotAnswering as err:
            states = self.pool.map(lambda c: c.run(["docker", "inspect", "-f", "{{.State.Status}}",
                                                    layout.CONTAINER_NAME], check=False).stdout.strip() or "absent",
                                   self.names)
            raise HealthError(f"not ready after {timeout:.0f} s: last saw {err.last} at {url}; containers: "
                              + ", ".join(f"{n} {s}" for n, s in states.items())) from None

    def gate(self, num: int, out: list[Outcome]) -> str:
        """Readiness + a temperature-0 probe (twice: it must be deterministic); record it as HEALTHY."""
        t0 = time.monotonic()
        text = self.wait_ready(self.opts.ready_timeout)
        again = health.generate(self.plan.api_url, _served(self.plan), timeout=self.opts.probe_timeout,
                                api_key=self.inv.auth.api_key())
        if again != text:
            raise HealthError(f"temperature-0 probe is not deterministic: {text!r} then {again!r}")
        rec = {"probe": text, "prompt": health.PROBE_PROMPT, "max_tokens": health.PROBE_MAX_TOKENS, "at": time.time(),
               "seconds_to_ready": round(time.monotonic() - t0, 1)}
        res = self.pool.map(lambda c: releases.mark_healthy(c, num, rec), self.names)
        for n, r in res.items():
            if isinstance(r, Exception):
                raise RemoteError(f"recording the health gate: {r}", node=n)
        out.append(Outcome("health gate", self.head, OK, f"release {num} answered in {time.monotonic() - t0:.1f} s: {text!r}",
                           [], time.monotonic() - t0))
        return text

    # --------------------------------------------------------------------------------------------- verbs
    def retire_others(self, out: list[Outcome]) -> None:
        """Nodes of the inventory outside this plan (up --nodes 1): stop and disable our unit there."""
        for n in self.others:
            if n not in self.pool.conns:
                continue
            c = self.conn(n)

            def diff(n: str, c=c) -> list[Action]:
                en = c.run(["systemctl", "is-enabled", layout.UNIT_NAME], check=False).stdout.strip()
                act = c.run(["systemctl", "is-active", layout.UNIT_NAME], check=False).stdout.strip()
                if en != "enabled" and act != "active":
                    return []
                return [Action(f"stop and disable {layout.UNIT_NAME} (node not in this {len(self.names)}-node plan)",
                               lambda: c.run(["systemctl", "disable", "--now", layout.UNIT_NAME], timeout=120))]

            out += run_step("retire", [n], diff, dry_run=self.opts.dry_run, log=self.log)

    def up(self) -> UpResult:
        res = UpResult()
        t0 = time.monotonic()
        out = res.outcomes
        try:
            self.connect(out)
            self.connect([], self.others, required=False)
            self.scan()
            self.make_plan(out)
            self.step_stale(out)
            self.step_image(out)
            self.step_vocab(out)
            self.step_secrets(out)
            num = self.step_release(out)
            self.step_units(out)
            self.step_supervision(out)
            self.retire_others(out)
            res.release = num
            cur = {self.rel[n].current for n in self.names}
            res.new_release = cur != {num}
            if self.opts.dry_run:
                res.message = (f"dry run: {res.changes} change(s) would be made"
                               + (f"; release {num} would be started" if res.new_release else ""))
                return res
            active = self.pool.map(lambda c: c.run(["systemctl", "is-active", "--quiet", layout.UNIT_NAME], check=False).ok,
                                   self.names)
            need_start = res.new_release or not all(v is True for v in active.values()) or any(
                o.step == "retire" and o.status == CHANGED for o in out)
            watchdog_was = self.watchdog_active()
            stage = "start"
            # From the first stop on, any failure (memory guard, a node lost mid-switch, the gate) ends in
            # _auto_rollback: the last release that passed its gate serving again, or the service stopped.
            try:
                if need_start:
                    prev = self.rel[self.head].current
                    self.log(f"switching to release {num} (was {prev}): stop head, stop workers, switch, start "
                             "workers, head")
                    self.stop_all()
                    faults.hit("after-stop")
                    self.switch(num)
                    faults.hit("after-switch")
                    self.start_all()
                    res.restarted = True
                    out.append(Outcome("start", self.head, CHANGED, f"release {num} started workers-first",
                                       [f"restart on release {num}"]))
                stage = "health gate"
                healthy_rec = releases.read_healthy(self.conn(self.head), num)
                if need_start or not healthy_rec:
                    res.probe = self.gate(num, out)
                else:
                    res.probe = healthy_rec.get("probe")
                    out.append(Outcome("health gate", self.head, OK, f"release {num} already passed its gate"))
            except (SparkdeployError, requests.RequestException, ValueError, KeyError) as err:
                out.append(Outcome(stage, self.head, FAILED, str(err)))
                self._auto_rollback(num, f"{stage}: {err}", res, watchdog_was)
                return res
            self.watchdog(True)
            self.prune()
            res.healthy = True
            res.message = (f"release {num} healthy" + (" (new release)" if res.new_release else "")
                           + f"; {res.changes} change(s)")
            return res
        except StepFailed as err:
            res.message = str(err)
            return res
        except InputError:
            raise  # bad input, found before anything changed: the CLI exits 2 naming the field
        except SparkdeployError as err:
            out.append(Outcome("up", "", FAILED, str(err)))
            res.message = str(err)
            return res
        finally:
            res.seconds = time.monotonic() - t0

    def _auto_rollback(self, failed: int, reason: str, res: UpResult, watchdog_was: bool) -> None:
        """After a failure past the first stop: the newest release older than `failed` that passed its gate on
        every node serves again under its own plan, with the watchdog as it was; with none, the service is
        stopped and disabled (a reboot must not start a release that never passed its gate)."""
        what = f"release {failed} failed ({reason})"
        try:
            self.scan()
        except SparkdeployError as err:
            res.message = f"{what}; the releases on the nodes could not be read to roll back: {err}"
            return
        self._serve_again(what, releases.last_healthy({n: self.rel[n] for n in self.names}, before=failed), res,
                          watchdog_was)

    def _serve_again(self, what: str, good: int | None, res: UpResult, watchdog_was: bool) -> None:
        """Put release `good` (passed its gate on every node) back: stop, switch, start under its plan, watchdog
        as it was, wait for it; with no good release, stop and disable the service. The message says which."""
        try:
            if good is None:
                self.stop_and_disable()
                res.message = (f"{what}; no healthy release to go back to: the service is STOPPED and disabled; "
                               "fix and re-run `up`")
                return
            self.log(f"{what}: rolling back to release {good}")
            self.stop_all()
            self.switch(good)
            self.plan = self.release_plan(good)
            self.start_all()
            res.rolled_back_to = good
            self.watchdog(watchdog_was)
            rec = releases.read_healthy(self.conn(self.head), good) or {}
            text = self.wait_ready(self.opts.rollback_timeout)
            ok = text == rec.get("probe", text)
            res.message = (f"{what}; ROLLED BACK to release {good}"
                           + (" which is healthy again" if ok else f" but its probe now differs: {text!r}"))
        except (SparkdeployError, requests.RequestException, ValueError, KeyError) as err:
            res.message = (f"{what}; rolling back to release {good} did not complete either: {err}"
                           if good is not None else f"{what}; and stopping the service failed: {err}")

    def release_plan(self, num: int) -> P.Plan:
        """The plan a recorded release ran under: this inventory with the facts that release recorded."""
        return P.plan(self.inv, {n: _facts_from_dict(self.rel[n].complete[num]["facts"]) for n in self.names},
                      self.opts.nodes)

    def stop_and_disable(self) -> None:
        """Engine stopped everywhere, its unit and the watchdog timer disabled (what `down` leaves)."""
        self.stop_all()
        for n in self.names:
            self.conn(n).run(["systemctl", "disable", layout.UNIT_NAME], check=False)
        self.conn(self.head).run(["systemctl", "disable", supervise.TIMER], check=False)

    def prune(self) -> None:
        nrs = self.scan()
        keep_images = set()
        for n, nr in nrs.items():
            releases.prune(self.conn(n), nr)
        for nr in self.scan().values():
            keep_images |= {m.get("image") for m in nr.complete.values() if m.get("image")}
        repo = self.plan.image.repository

        def drop_images(c: Conn):
            tags = c.run(["docker", "image", "ls", "--format", "{{.Repository}}:{{.Tag}}", repo], check=False).stdout.split()
            old = [t for t in tags if t not in keep_images and not t.endswith(":<none>")]
            if old:
                c.run(["docker", "image", "rm", *old], check=False, timeout=300)
            c.run(["docker", "image", "prune", "-f"], check=False, timeout=300)

        self.pool.map(drop_images, self.names)

    def rollback(self, to: int | None) -> UpResult:
        res = UpResult()
        t0 = time.monotonic()
        try:
            self.connect(res.outcomes)
            self.scan()
            cur = self.rel[self.head].current
            common = releases.common_complete({n: self.rel[n] for n in self.names})
            if to is None:
                to = releases.last_healthy({n: self.rel[n] for n in self.names}, before=cur)
                if to is None:
                    raise HealthError(f"no healthy release older than the current one ({cur}) on every node")
            if to not in common:
                lacking = {n: sorted(self.rel[n].complete) for n in self.names if to not in self.rel[n].complete}
                raise HealthError(f"release {to} is not complete on every node: "
                                  + "; ".join(f"{n} holds {h}" for n, h in lacking.items())
                                  + f" (complete everywhere: {sorted(common)})")
            meta = self.rel[self.head].complete[to]
            self.plan = self.release_plan(to)
            watchdog_was = self.watchdog_active()
            try:
                self.stop_all()
                self.switch(to)
                self.start_all()
                res.release, res.restarted = to, True
                res.rolled_back_to = to
                rec = releases.read_healthy(self.conn(self.head), to)
                res.probe = self.wait_ready(self.opts.ready_timeout)
                if not rec:
                    self.gate(to, res.outcomes)
            except (SparkdeployError, requests.RequestException, ValueError, KeyError) as err:
                # The release that was serving goes back, if it had passed its gate everywhere.
                back = cur if cur is not None and all(cur in self.rel[n].healthy for n in self.names) else None
                res.release = res.rolled_back_to = None
                self._serve_again(f"rollback to release {to} failed ({err})", back, res, watchdog_was)
                return res
            self.watchdog(True)
            res.healthy = True
            res.message = f"rolled back from release {cur} to {to} ({meta.get('image')}); healthy"
        except SparkdeployError as err:
            res.message = str(err)
        finally:
            res.seconds = time.monotonic() - t0
        return res

    def down(self, keep_enabled: bool = False) -> list[Outcome]:
        out: list[Outcome] = []
        names = [n.name for n in self.inv.nodes]
        self.names = [self.inv.head.name] + [n for n in names if n != self.inv.head.name]
        self.connect(out, self.names)
        self.stop_all()
        for n in self.names:
            acts = ["stopped"]
            if not keep_enabled:
                self.conn(n).run(["systemctl", "disable", layout.UNIT_NAME], check=False)
                if n == self.head:
                    self.conn(n).run(["systemctl", "disable", supervise.TIMER], check=False)
                acts.append("disabled")
            out.append(Outcome("down", n, CHANGED, "", acts))
        return out

    # ------------------------------------------------------------------------------------------ health
    def expect(self) -> health.ServiceExpect:
        """What health should find, from the current release on the nodes (its recorded facts and probe)."""
        self.scan()
        cur = self.rel[self.head].current
        meta = self.rel[self.head].complete.get(cur, {}) if cur else {}
        nodes_in = meta.get("nodes") or self.names
        self.names = [n for n in nodes_in if n in [x.name for x in self.inv.nodes]]
        facts = {}
        for n in self.names:
            m = self.rel.get(n, releases.NodeReleases()).complete.get(cur) if n in self.rel else None
            if m and m.get("facts"):
                facts[n] = _facts_from_dict(m["facts"])
        self.plan = P.plan(self.inv, facts or None, len(self.names))
        rec = releases.read_healthy(self.conn(self.head), cur) if cur else None
        exp_nodes = []
        for node in self.plan.nodes:
            m = self.rel.get(node.name, releases.NodeReleases()).complete.get(cur, {})
            reserve = int(node.memory.reserve_gib * F.GIB)
            exp_nodes.append(health.NodeExpect(
                node.name, node.role, node.unit_name, node.container_name, m.get("image_id"), reserve, cur,
                (self.plan.api_port, self.plan.master_port),
                (supervise.TIMER,) if node.role == "head" else ()))
        return health.ServiceExpect(self.plan.api_url, _served(self.plan), exp_nodes, rec.get("probe") if rec else None,
                                    api_key=self.inv.auth.api_key())

    def health(self) -> health.Report:
        rep = health.Report()
        out: list[Outcome] = []
        self.connect(out, [n.name for n in self.inv.nodes], required=False)
        for o in out:
            if o.status == FAILED and o.node in self.names:
                rep.add("ssh", False, o.detail, o.node)
        if self.head not in self.pool.conns:
            return rep
        try:
            exp = self.expect()
        except SparkdeployError as err:
            rep.add("release", False, str(err))
            return rep
        if not exp.nodes[0].release:
            rep.add("release", False, "nothing deployed: run `sparkdeploy up` (no release is current on the head)")
            return rep
        ours = [layout.UNIT_NAME, supervise.SERVICE]
        ports = [self.plan.api_port, self.plan.master_port]

        def node_check(c: Conn):
            ne = next(e for e in exp.nodes if e.name == c.name)
            return ne, health.node_snapshot(c, ne.unit, ne.container, ne.extra_units), stale.find(c, ours, ports)

        res = self.pool.map(node_check, [e.name for e in exp.nodes if e.name in self.pool.conns])
        for e in exp.nodes:
            if e.name not in self.pool.conns:
                continue
            r = res[e.name]
            if isinstance(r, Exception):
                rep.add("ssh", False, str(r), e.name)
                continue
            rep.add("ssh", True, "connected", e.name)
            health.check_node(rep, *r)
        health.check_api(rep, exp, probe_timeout=self.opts.probe_timeout)
        return rep


def load_cluster(inventory_path: str, opts: Options) -> Cluster:
    from sparkdeploy import inventory as I

    return Cluster(I.load(inventory_path), opts)
