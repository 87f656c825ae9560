"""`sparkdeploy vocab rollout`: put a new draft vocabulary live on a running cluster and prove that it changed
nothing but speed.

    validate (local, before any connection)   list vs the served tokenizer: hash, range, EOS/specials,
                                              sorted/unique, not empty, a list at all
    read (no change)                          same current release on every node, the live list, the service
                                              answers; same list already live everywhere -> nothing to do
    golden                                    temperature-0 outputs of a fixed prompt set + acceptance per
                                              step per category (metric deltas)
    distribute                                <sha256>.txt into every node's store; a new numbered release =
                                              the current one with only the list's sha256 changed
    switch + restart                          stop head, workers; point current.txt + `current` at the new
                                              ones; start workers, then the head
    gate                                      a real completion answers (watching every rank's unit and boot)
    verify                                    greedy outputs byte-identical to golden; acceptance after
    (live, instead of the three above)        where the running release takes a new list and it fits the
                                              head's capacity (rollout_live): swap it on every rank, check
                                              every rank serves it, golden, acceptance not below noise, probe;
                                              any failure swaps the old list back live; then `current` moves
                                              to the new release without a restart
    finish                                    HEALTHY mark, history line on every node, watchdog as it was

Any failure after the switch rolls back to the previous release and list, waits for health, checks the
golden outputs again and reports why. `vocab rollback [VERSION]` is a rollout of a stored version.

The release is derived from the *running* release, not re-planned from the inventory, so nothing else can
ride along with a list change; a changed output therefore means something else differs and is a failure.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import requests

from sparkdeploy import faults
from sparkdeploy.errors import SparkdeployError, VocabError, describe
from sparkdeploy.ops import health, releases, vocab_live
from sparkdeploy.remote.connection import dry_session, narrate, recording
from sparkdeploy.steps import engine, healthcheck
from sparkdeploy.steps.context import Context, Options
from sparkdeploy.steps.vocab_rollout import live as rollout_live
from sparkdeploy.steps.vocab_rollout.checks import (
    Candidate,
    Failed,
    Golden,
    RolloutError,
    capture,
    check_candidate,
    coverage_change,
    derive_release,
    golden_prompts,
    list_diff,
    mismatches,
    pick_version,
    write_list_with_manifest,
)
from sparkdeploy.verdict import Status
from sparkdeploy.vocab.formats import parse_list

__all__ = ["Candidate", "Failed", "Golden", "Rollout", "RolloutError", "RolloutOptions", "RolloutResult", "capture",
           "check_candidate", "coverage_change", "golden_prompts", "history", "list_diff", "mismatches",
           "pick_version", "rollout", "validate_locally", "write_list_with_manifest"]


# ------------------------------------------------------------------------------------------- result
@dataclass
class RolloutResult:
    # the kit's one vocabulary: ok (nothing to change), changed, would change (a dry run), failed (a rollback puts
    # `rolled_back_to`), warn (the list is live and proven but the rollout stopped before it finished: exit 1)
    status: Status = Status.FAILED
    rolled_back_to: int | None = None  # the release serving again after a failure
    message: str = ""
    reason: str = ""  # why it rolled back / failed
    from_version: str | None = None
    to_version: str | None = None
    from_sha256: str | None = None
    to_sha256: str | None = None
    size: int | None = None
    previous_release: int | None = None
    release: int | None = None  # the release running at the end
    new_release: int | None = None  # the release the rollout wrote
    diff: dict = field(default_factory=dict)
    coverage: list = field(default_factory=list)
    golden_identical: bool | None = None
    golden_prompts: int = 0
    acceptance_before: dict = field(default_factory=dict)
    acceptance_after: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    effects: list[str] = field(default_factory=list)  # a dry run's exact writes and commands up to the gate
    nodes: dict = field(default_factory=dict)  # node -> live vocab at the end
    timings: dict = field(default_factory=dict)
    seconds: float = 0.0
    sentinel: dict | None = None  # the speed verdict on the new release (`vocab rollout --sentinel`)
    path: str | None = None  # rollout_live.LIVE (swap in the running engine) or RESTART
    path_reason: str = ""  # why that path

    @property
    def ok(self) -> bool:
        return self.status in (Status.OK, Status.CHANGED, Status.WOULD_CHANGE)

    def to_dict(self) -> dict:
        return dict(asdict(self), ok=self.ok)


@dataclass
class RolloutOptions:
    """What this rollout checks and how (the run's own options, dry run, timeouts and log, are the context's
    `steps.context.Options`, as for `up` and `rollback`)."""
    max_tokens: int = 32
    categories: list[str] | None = None
    per_category: int = 1
    samples: list[str] = field(default_factory=list)
    action: str = "rollout"  # or "rollback" (history label)
    require_golden: bool = True  # a rollback may run on an unhealthy service (no golden then)
    restart: bool = False  # `--restart`: the restart rollout even where a live swap is possible
    allow_lower_acceptance: bool = False  # `--allow-lower-acceptance`: a live swap's acceptance fall is reported only
    swap_timeout: float = 120.0  # seconds every rank has to report the swapped list
    # Test hooks (failure injection): called with the Rollout at "distributed" (files on the nodes, nothing
    # switched), "started" (new release started, before the gate); `edit` may change a node's new release
    # files {name: bytes} (e.g. a sampling setting riding along).
    hooks: dict = field(default_factory=dict)
    edit: Callable[[str, dict], dict] | None = None


class Rollout:
    """One rollout on a cluster context (steps.context.Context), through steps/engine.py's switch and rollback."""

    def __init__(self, cluster: Context, cand: Candidate, opts: RolloutOptions, tokenizer=None):
        self.c = cluster
        self.cand = cand
        self.opts = opts
        self.tok = tokenizer
        self.log = cluster.opts.log
        self.switched = False
        self.watchdog_was: bool | None = None  # the timer's state before the rollout stopped it
        self.boots: dict[str, str] = {}  # each node's boot id before the switch (a reboot since fails the gate)
        self.watch = None  # engine.rank_watch of the new release, from its first look
        self.golden: Golden | None = None
        self.exp: health.ServiceExpect | None = None  # what the current release serves (read by _prepare)
        self.prev: int | None = None  # the release running before
        self.old_sha: str | None = None  # the list it names
        self.new_num: int | None = None  # the release this rollout writes (a number no node has yet)
        self.writing = False  # release new_num may exist on some node
        self.prompts: list[tuple[str, str]] = []
        self.probe: str | None = None
        self.started_at = 0.0
        self.swapping = False  # a live swap may have moved pointers: a failure swaps the old list back
        self.committed = False  # `current` names the new release (live path): it stays

    # ----------------------------------------------------------------------------------------- helpers
    def conn(self, n: str):
        return self.c.conn(n)

    @property
    def names(self) -> list[str]:
        return self.c.names

    def new_release_files(self, node: str) -> tuple[dict[str, tuple[bytes, int]], dict]:
        """The current release's files with only the list's sha256 changed, and its meta for release.json."""
        return derive_release(self.c, node, self.prev, self.old_sha, self.cand, self.opts.action, self.opts.edit)

    def _check_ranks(self) -> None:
        """The release's ranks are still up (engine.rank_watch, one per rollout: its baseline is the first look
        after the switch, and the boot ids read before it)."""
        if self.watch is None:
            self.watch = engine.rank_watch(self.c, self.boots, self.new_num)
        try:
            self.watch()
        except engine.RankLost as err:
            raise Failed(str(err)) from None

    def _hook(self, name: str) -> None:
        fn = self.opts.hooks.get(name)
        if fn:
            fn(self)

    def _timed(self, res: RolloutResult, name: str, t0: float) -> None:
        res.timings[name] = round(time.monotonic() - t0, 2)

    def _outputs_now(self, metrics: bool = True) -> Golden:
        """The golden prompts' temperature-0 outputs (and, with `metrics`, acceptance) from the serving API."""
        return capture(self.exp.api_url, self.exp.served_model, self.prompts, max_tokens=self.opts.max_tokens,
                       timeout=self.c.opts.probe_timeout, metrics=metrics, api_key=self.exp.api_key)

    def _ask(self, **kw) -> str:
        return health.generate(self.exp.api_url, self.exp.served_model, timeout=self.c.opts.probe_timeout,
                               api_key=self.exp.api_key, **kw)

    def _probe_changed(self) -> str | None:
        old = self.exp.probe_expected
        if old is not None and old != self.probe:
            return f"the health probe changed: {old!r} recorded for release {self.prev}, now {self.probe!r}"
        return None

    def _mark_failed(self, reason: str) -> None:
        """Why the release this rollout wrote failed, for whoever reads its directory (it never gets a HEALTHY,
        so no rollback picks it)."""
        self.c.map(lambda c: c.put(f"{releases.rdir(self.c.lay, self.new_num)}/FAILED", (reason + "\n").encode()),
                   self.names)

    # ------------------------------------------------------------------------------------------ phases
    def run(self, res: RolloutResult | None = None) -> RolloutResult:
        """Roll out; a dry run reads the nodes and lists the exact effects up to the gate (`_dry`), inside a
        recording that carries nothing out, whatever it reaches."""
        if self.c.opts.dry_run:
            with recording(dry=True):
                return self._run(res)
        return self._run(res)

    def _run(self, res: RolloutResult | None) -> RolloutResult:
        res = res or RolloutResult()
        t0 = time.monotonic()
        res.to_sha256, res.to_version, res.size = self.cand.sha256, self.cand.version, self.cand.size
        try:
            if not self._prepare(res):
                return res
            if self.c.opts.dry_run:
                return self._dry(res)
            # The watchdog's probes would land inside the golden metric deltas; it is stopped for the switch anyway.
            self.watchdog_was = engine.watchdog_active(self.c)
            engine.watchdog(self.c, False)
            self._capture_before(res)
            self._distribute(res)
            self._hook("distributed")
            if res.path == rollout_live.LIVE:
                if not self._live(res):
                    return res
            else:
                self._switch_and_start(res)
                self._hook("started")
                self._gate(res)
                self._verify(res)
            self._finish(res)
        except Exception as err:  # noqa: BLE001 - whatever broke after the switch, the previous list goes back
            reason = describe(err, self.log)
            res.reason = reason
            if self.committed:
                res.status = Status.WARN
                res.message = (f"list {self.cand.version} is live as release {self.new_num} (no restart), but the "
                               f"rollout stopped before it finished: {reason}")
            elif self.swapping:
                self._swap_back_after(res, reason)
            elif self.switched:
                self._roll_back(res, reason)
            else:
                self._discard(res)
                if self.watchdog_was is not None:
                    engine.watchdog(self.c, self.watchdog_was)
                res.status = Status.FAILED
                res.message = f"rollout stopped before any node switched: {reason}"
        finally:
            res.seconds = round(time.monotonic() - t0, 2)
            try:
                res.nodes = {n: v.to_dict() for n, v in self.live().items()}
            except SparkdeployError:
                pass
        return res

    def live(self) -> dict[str, vocab_live.LiveVocab]:
        return self.c.each(lambda c: vocab_live.read_state(c, self.c.lay), "reading the live vocab")

    def _prepare(self, res: RolloutResult) -> bool:
        """Read-only: releases, live lists, diff; False when there is nothing (more) to do."""
        t0 = time.monotonic()
        self.c.connect([])
        exp = healthcheck.expect(self.c)  # scans releases, plans from the current release's facts, reads its HEALTHY probe
        self.exp = exp
        cur = {n: self.c.rel[n].current for n in self.names}
        if None in cur.values() or len(set(cur.values())) != 1:
            raise RolloutError("nodes do not share one current release ("
                               + ", ".join(f"{n} {r}" for n, r in cur.items())
                               + "): run `sparkdeploy up` first")
        self.prev = res.previous_release = res.release = cur[self.c.head]
        states = self.live()
        configured = {s.configured for s in states.values()}
        if configured == {None}:
            raise RolloutError(f"release {self.prev} runs without the shortlisted draft head (patches.shortlist off "
                               "or no vocab): there is no draft list to roll out")
        if len(configured) != 1:
            raise RolloutError("nodes' current releases expect different lists: "
                               + ", ".join(f"{n} {vocab_live.version_of(s.configured)}" for n, s in states.items()))
        self.old_sha = configured.pop()
        res.from_sha256, res.from_version = self.old_sha, vocab_live.version_of(self.old_sha)
        inv_vocab = getattr(self.c.inv, "vocab", None)
        if inv_vocab is not None and inv_vocab.sha256 != self.cand.sha256:
            res.notes.append(f"{self.c.inv.file} names list {inv_vocab.sha256[:12]} ({inv_vocab.path.name}): set "
                             f"`vocab:` to {Path(self.cand.path).name} there, or the next `up` puts that list back")
        for n, s in states.items():
            if s.problem():
                res.notes.append(f"{n}: {s.problem()}")
        head = self.conn(self.c.head)
        old_bytes = vocab_live.read_list(head, self.c.lay, self.old_sha) or vocab_live.read_list(head, self.c.lay)
        old_ids = None
        if old_bytes is not None:
            try:
                old_ids = parse_list(old_bytes, "live list")
            except VocabError as err:
                res.notes.append(f"the live list could not be read for the diff: {err}")
        res.diff = list_diff(old_ids, self.cand.ids)
        if self.opts.samples and self.tok is not None:
            res.coverage = coverage_change(old_ids, self.cand.ids, self.tok, self.opts.samples)
        self._timed(res, "prepare", t0)
        if self.old_sha == self.cand.sha256 and all(s.content == self.cand.sha256 for s in states.values()):
            res.status = Status.OK
            res.message = (f"list {self.cand.version} is already live on every node (release {self.prev}); "
                           "nothing changed")
            return False
        self.new_num = max(nr.newest for nr in self.c.rel.values()) + 1
        res.path, res.path_reason = rollout_live.choose_path(
            rollout_live.read_settings(head, self.c.lay, self.prev), self.cand.size,
            None if old_ids is None else len(old_ids), restart=self.opts.restart, release=self.prev)
        silent = [n for n in self.names if not vocab_live.served(self.conn(n), self.c.lay)] \
            if res.path == rollout_live.LIVE else []
        if silent:
            res.path, res.path_reason = rollout_live.RESTART, (
                f"the engine on {', '.join(silent)} reports no list it serves (still loading, or an overlay without "
                "the live swap); restarting the engine instead")
        narrate(self.log, f"{res.path} rollout: {res.path_reason}")
        res.actions = [f"store {self.cand.version}.txt ({self.cand.size} ids) on {', '.join(self.names)}",
                       f"write release {self.new_num} = release {self.prev} with the list {res.from_version} -> "
                       f"{self.cand.version}",
                       "capture golden outputs; stop head, workers; switch current.txt and `current`; start "
                       "workers, head; gate; compare outputs" if res.path == rollout_live.RESTART else
                       "capture golden outputs; switch current.txt on every node and wait for every rank to report "
                       f"{self.cand.version}; compare outputs and acceptance (a drop beyond "
                       f"{rollout_live.ACCEPTANCE_NOISE:.0%} swaps {res.from_version} back live); switch `current` "
                       f"to release {self.new_num}; no restart"]
        self.boots = self.c.each(engine.boot_id, "reading boot time")
        return True

    def _dry(self, res: RolloutResult) -> RolloutResult:
        """The real path up to the gate under the effects recorder: what it would write and run, made nowhere
        (one `dry_session`: the list and release it would store are there to switch to)."""
        with dry_session(), recording(dry=True) as made:
            engine.watchdog(self.c, False)
            self._distribute(res)
            if res.path == rollout_live.LIVE:  # the pointer moves, then `current` once the checks pass
                for n in self.names:
                    vocab_live.point(self.conn(n), self.c.lay, self.cand.sha256)
                rollout_live.make_current([self.conn(n) for n in self.names], self.c.lay, self.new_num)
            else:
                self._switch_and_start(res)
        res.effects, res.new_release = list(made), None
        res.status = Status.WOULD_CHANGE
        res.message = f"dry run: would roll out {self.cand.version} as release {self.new_num} (nothing changed)"
        return res

    def _capture_before(self, res: RolloutResult) -> None:
        t0 = time.monotonic()
        self.prompts = golden_prompts(self.opts.categories, self.opts.per_category)
        res.golden_prompts = len(self.prompts)
        try:
            self.golden = self._outputs_now()
        except (requests.RequestException, ValueError, KeyError) as err:
            if self.opts.require_golden:
                raise RolloutError(f"the service does not answer now, so no golden outputs can be taken "
                                   f"({type(err).__name__}: {str(err)[:200]}); fix it first (sparkdeploy health)")
            self.golden = None
            res.notes.append("service not answering before the switch: no golden outputs to compare against")
        if self.golden:
            res.acceptance_before = self.golden.acceptance
            res.notes += [f"before: {n}" for n in self.golden.notes]
        self._timed(res, "golden", t0)

    def _distribute(self, res: RolloutResult) -> None:
        t0 = time.monotonic()
        built = {n: self.new_release_files(n) for n in self.names}
        meta = dict(self.cand.meta(), version=self.cand.version)

        def put(c):
            if c.name != self.c.head:
                faults.hit("release-one-node")
            wrote = vocab_live.store(c, self.c.lay, self.cand.data, self.cand.sha256, meta)
            files, m = built[c.name]
            releases.write(c, self.c.lay, self.new_num, files, m)
            return wrote

        self.writing = True  # from here a failure may leave release new_num on some nodes: _discard removes it
        self.c.each(put, "distributing the list and release")
        res.new_release = self.new_num
        narrate(self.log, f"list {self.cand.version} and release {self.new_num} are on every node")
        self._timed(res, "distribute", t0)

    def _switch_and_start(self, res: RolloutResult) -> None:
        t0 = time.monotonic()
        # from here on (before the line that says so, which a Ctrl-C may follow at once) a failure puts the
        # previous release back, not a discard: the first stop may have begun
        self.switched = True
        narrate(self.log, f"switching to release {self.new_num} (list {self.cand.version}): stop head, workers; start "
                 "workers, head")
        engine.switch_and_restart(self.c, self.new_num, list_sha=self.cand.sha256, what="switching")
        self.started_at = time.monotonic()
        self._timed(res, "switch", t0)

    def _gate(self, res: RolloutResult) -> None:
        t0 = time.monotonic()
        try:
            self.probe = engine.wait_ready(self.c, self.c.opts.ready_timeout, watch=self._check_ranks)
        except engine.NotReady as err:
            raise Failed(f"health gate timed out: {err}") from None
        self._check_ranks()
        res.timings["ready_after_start"] = round(time.monotonic() - self.started_at, 2)
        self._timed(res, "gate", t0)

    def _verify(self, res: RolloutResult) -> None:
        t0 = time.monotonic()
        if self.golden is None:
            res.golden_identical = None
            self._timed(res, "verify", t0)
            return
        after = self._outputs_now()
        res.acceptance_after = after.acceptance
        res.notes += [f"after: {n}" for n in after.notes]
        bad = mismatches(self.golden.outputs, after.outputs)
        res.golden_identical = not bad
        self._check_ranks()
        self._timed(res, "verify", t0)
        if bad:
            k = bad[0]
            raise Failed(f"greedy outputs differ from the golden ones on {len(bad)} of {len(self.golden.outputs)} "
                         f"prompts (e.g. {k}: golden {self.golden.outputs[k][:60]!r}, "
                         f"now {after.outputs.get(k, '')[:60]!r})"
                         ": a draft list cannot change outputs, so something else changed")

    def _live(self, res: RolloutResult) -> bool:
        """The live swap and its checks; True when the new list serves and its release is current."""
        t0 = time.monotonic()
        conns = [self.conn(n) for n in self.names]
        narrate(self.log, f"swapping list {res.from_version} -> {self.cand.version} in the running engine on every "
                          "rank (no restart)")
        self.swapping = True
        out = rollout_live.swap_and_check(conns, self.c.lay, self.cand.sha256, self.old_sha,
                                          verify=lambda: self._live_verify(res), nudge=self._nudge,
                                          timeout=self.opts.swap_timeout)
        self._timed(res, "live swap", t0)
        if out.ok:
            rollout_live.make_current(conns, self.c.lay, self.new_num)
            self.committed = True
            return True
        self.swapping = False
        self._live_failed(res, out.reason, out.swapped_back)
        return False

    def _nudge(self) -> None:
        """An engine looks at the pointer only while it drafts: one short request makes it draft."""
        try:
            self._ask(max_tokens=4)
        except (requests.RequestException, ValueError, KeyError):
            pass  # the swap's timeout says what did not answer

    def _live_verify(self, res: RolloutResult) -> str | None:
        """Golden outputs, acceptance and the health probe after a swap: why the new list must go, or None."""
        try:
            self._verify(res)
            self.probe = self._ask()
        except (Failed, requests.RequestException, ValueError, KeyError) as err:
            return str(err) if isinstance(err, Failed) else f"{type(err).__name__}: {str(err)[:200]}"
        changed = self._probe_changed()
        if changed:
            return changed
        drop = rollout_live.acceptance_drop(res.acceptance_before, res.acceptance_after)
        if drop and self.opts.allow_lower_acceptance:
            res.notes.append(f"kept with --allow-lower-acceptance: {drop}")
            return None
        return drop

    def _swap_back_after(self, res: RolloutResult, reason: str) -> None:
        """An error during the live swap: put the old list back live on every rank."""
        try:
            back = vocab_live.live_swap([self.conn(n) for n in self.names], self.c.lay, self.old_sha,
                                        timeout=self.opts.swap_timeout, nudge=self._nudge).ok
        except Exception as err:  # noqa: BLE001 - reported in the message
            reason, back = f"{reason}; swapping back failed too: {err}", False
        self._live_failed(res, reason, back)

    def _live_failed(self, res: RolloutResult, reason: str, swapped_back: bool | None) -> None:
        """Mark the release the swap wrote FAILED, restore the watchdog, say what serves now."""
        res.reason = reason
        self._mark_failed(reason)
        if self.watchdog_was is not None:
            engine.watchdog(self.c, self.watchdog_was)
        if swapped_back is False:
            res.status = Status.FAILED
            res.message = (f"live swap to {self.cand.version} FAILED ({reason}) and swapping {res.from_version} back "
                           "did not complete: `sparkdeploy health` shows what each rank serves; "
                           f"`sparkdeploy vocab rollback {res.from_version} --restart` restarts on it")
        elif swapped_back:
            res.status, res.rolled_back_to = Status.FAILED, self.prev
            res.message = (f"live swap to {self.cand.version} FAILED: {reason}; SWAPPED BACK to {res.from_version} "
                           f"live on every rank (release {self.prev}, no restart)")
        else:
            res.status = Status.FAILED
            res.message = f"live swap to {self.cand.version} refused; every rank keeps {res.from_version}: {reason}"

    def _finish(self, res: RolloutResult) -> None:
        t0 = time.monotonic()
        changed = self._probe_changed()
        if changed:
            raise Failed(changed)
        engine.record_gate(self.c, self.new_num, self.probe, vocab=self.cand.sha256,
                           golden=self.golden.outputs if self.golden else None)
        entry = {"action": self.opts.action, "sha256": self.cand.sha256, "version": self.cand.version,
                 "from": self.old_sha, "release": self.new_num, "previous_release": self.prev,
                 "size": self.cand.size, "source": Path(self.cand.path).name, "result": "live", "path": res.path}
        self.c.each(lambda c: vocab_live.record(c, self.c.lay, entry), "recording history")
        live = (f"list {self.cand.version} is live on every node as release {self.new_num} "
                f"(was {res.from_version}, release {self.prev}"
                + ("; swapped in the running engine, no restart" if res.path == rollout_live.LIVE else "")
                + "); golden outputs byte-identical")
        res.release = self.new_num
        stopped = engine.after_gate(self.c, self.watchdog_was)  # the list passed its gate and golden check: it stays
        if stopped:
            res.status = Status.WARN
            res.message = f"{live}, but the rollout stopped before it finished ({stopped[0]}); {stopped[1]}"
            return
        for n in self.names:
            try:
                c = self.conn(n)
                releases.prune(c, self.c.lay, releases.scan(c, self.c.lay))
                vocab_live.prune(c, self.c.lay, vocab_live.read_state(c, self.c.lay), {self.old_sha, self.cand.sha256})
            except SparkdeployError as err:
                res.notes.append(f"{n}: pruning old versions: {err}")
        res.status, res.message = Status.CHANGED, live
        self._timed(res, "finish", t0)

    # ------------------------------------------------------------------------------------ failure paths
    def _discard(self, res: RolloutResult) -> None:
        """Nothing switched: remove the release directory this rollout wrote (the stored list may stay)."""
        num = self.new_num
        if num is None or self.exp is None or not self.writing:
            return
        self.c.map(lambda c: c.run(["rm", "-rf", releases.rdir(self.c.lay, num)], check=False), self.names)

    def _roll_back(self, res: RolloutResult, reason: str) -> None:
        t0 = time.monotonic()
        self.log(f"rollout failed ({reason}); rolling back to release {self.prev} and list {res.from_version}")
        try:
            errs = self.c.reconnect(wait=180)
            if errs:
                raise RolloutError("cannot reach " + ", ".join(f"{n} ({e})" for n, e in errs.items()))
            self.c.scan()
            # the plan is release prev's already (planned from its facts by _prepare); the watchdog comes back below
            engine.serve_again(self.c, self.prev, plan_of_release=False, list_sha=self.old_sha, what="switching back")
            same = None
            if self.golden is not None:
                again = self._outputs_now(metrics=False)
                same = not mismatches(self.golden.outputs, again.outputs)
            engine.watchdog(self.c, self.watchdog_was)
            self._mark_failed(reason)
            entry = {"action": "auto-rollback", "sha256": self.old_sha, "version": res.from_version,
                     "from": self.cand.sha256, "release": self.prev, "failed_release": self.new_num,
                     "reason": reason, "result": "live"}
            self.c.map(lambda c: vocab_live.record(c, self.c.lay, entry), self.names)
            res.status, res.release = Status.FAILED, self.prev
            res.rolled_back_to = self.prev
            res.message = (f"rollout of {self.cand.version} FAILED: {reason}; ROLLED BACK to release {self.prev} "
                           f"with list {res.from_version}, healthy again"
                           + ("" if same is None else "; outputs byte-identical to golden" if same
                              else "; but outputs now DIFFER from golden"))
        except Exception as err:  # noqa: BLE001 - reported, never swallowed silently
            res.status = Status.FAILED
            res.message = (f"rollout of {self.cand.version} failed ({reason}) and the rollback to release "
                           f"{self.prev} did not complete: {err}")
        finally:
            res.timings["rollback"] = round(time.monotonic() - t0, 2)


# --------------------------------------------------------------------------------------------- verbs
def validate_locally(inventory, list_path: str, *, tokenizer_spec: str | None = None,
                     allow_no_manifest: bool = False):
    """(tokenizer, candidate) or VocabError: everything that can be refused without contacting a node."""
    from sparkdeploy.model import served_tokenizer

    if inventory.vocab is None or not inventory.patches.shortlist:
        raise VocabError(f"{inventory.file}: patches.shortlist is off, so the cluster has no draft list to replace")
    tok = served_tokenizer.resolve(inventory, tokenizer_spec)
    return tok, check_candidate(list_path, tok, allow_no_manifest=allow_no_manifest)


def rollout(inventory, list_path: str, opts: RolloutOptions, run: Options, *, tokenizer_spec: str | None = None,
            allow_no_manifest: bool = False) -> RolloutResult:
    """Validate locally (VocabError before any connection), then roll out on the inventory's cluster."""
    tok, cand = validate_locally(inventory, list_path, tokenizer_spec=tokenizer_spec,
                                 allow_no_manifest=allow_no_manifest)
    with Context(inventory, run) as cluster:
        return Rollout(cluster, cand, opts, tok).run()


def history(inventory, *, trust_new_hosts: bool = False) -> dict:
    """History lines (from the head), stored versions and the live list per node."""
    with Context(inventory, Options(trust_new_hosts=trust_new_hosts)) as cluster:
        cluster.connect([])
        healthcheck.expect(cluster)
        head = cluster.conn(cluster.head)
        states = {n: vocab_live.read_state(cluster.conn(n), cluster.lay) for n in cluster.names}
        stored = [dict(vocab_live.meta(head, cluster.lay, s), sha256=s, version=s[:12]) for s in states[cluster.head].stored]
        return {"history": vocab_live.history(head, cluster.lay), "stored": stored,
                "nodes": {n: s.to_dict() for n, s in states.items()}}


def stored_candidate(cluster, version: str | None, tok) -> Candidate:
    """A version stored on the head (default: the one live before the current), checked like a new list:
    what `vocab rollback` rolls out, with the rollout's checks (opts.action = "rollback")."""
    from sparkdeploy.vocab import validate_list

    cluster.connect([])
    healthcheck.expect(cluster)
    head = cluster.conn(cluster.head)
    state = vocab_live.read_state(head, cluster.lay)
    sha = pick_version(vocab_live.history(head, cluster.lay), state.stored, state.configured or state.content, version)
    data = vocab_live.read_list(head, cluster.lay, sha)
    if data is None or hashlib.sha256(data).hexdigest() != sha:
        raise VocabError(f"stored version {sha[:12]} on {cluster.head} is missing or altered")
    ids = validate_list(parse_list(data, f"version {sha[:12]}"), tok, None, what=f"version {sha[:12]}")
    m = vocab_live.meta(head, cluster.lay, sha)
    return Candidate(m.get("source") or f"{sha[:12]}.txt", data, ids, sha, tok.content_hash, None)
