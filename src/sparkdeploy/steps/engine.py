"""Engine control on a `Context`: the watchdog timer, stop, evict + memory guard + start, switching `current`,
readiness and the health gate; and the two procedures every verb shares:

    switch_and_restart(cx, num)   stop head, stop workers, switch `current` (and current.txt), start workers, head
    serve_again(cx, good, ...)    release `good` (it passed its gate) back in service, waited for until it answers

`up` (new release and its automatic rollback), `rollback` and `vocab rollout` (switch and roll-back) use these;
none of them stops, switches or starts on its own. Every node command here goes through `Conn.run` (reads
through `Conn.query`), so under `connection.recording(dry=True)` `switch_and_restart` lists, without making
them, exactly the commands and links a real restart makes: `up --dry-run` prints them.
"""

from __future__ import annotations

import shlex
import time
from typing import Callable

import requests

from sparkdeploy import faults
from sparkdeploy.errors import HealthError, SparkdeployError, describe
from sparkdeploy.node import probes
from sparkdeploy.node.layout import LAUNCH_FILE
from sparkdeploy.ops import health, releases
from sparkdeploy.remote import connection
from sparkdeploy.steps.base import CHANGED, OK, WOULD, Outcome
from sparkdeploy.steps.context import Context


# ---------------------------------------------------------------------------------------------- watchdog
def watchdog(cx: Context, on: bool) -> None:
    """Stop the timer while we stop/start ranks ourselves; on start, the watchdog begins with a clean slate."""
    c = cx.conn(cx.head)
    if on:
        c.run(["rm", "-f", cx.lay.watchdog_state], check=False)
        c.run(["systemctl", "start", cx.lay.watchdog_timer], check=False)
    else:
        c.run(["systemctl", "stop", cx.lay.watchdog_timer, cx.lay.watchdog_service], check=False, timeout=330)


def watchdog_again(cx: Context, on: bool = True) -> str:
    """A second try at putting the watchdog back, after a failure that came once the release was proven (it
    serves, so only its supervision is left to put right); the words for the message either way."""
    state = "on" if on else "off"
    try:
        watchdog(cx, on)
    except SparkdeployError as err:
        return f"the watchdog could NOT be turned back {state} ({err}); `sparkdeploy up` puts it back"
    return f"the watchdog is {state} again"


def after_gate(cx: Context, watchdog_on: bool = True) -> tuple[str, str] | None:
    """The epilogue of a release that passed its gate (`up`, `rollback`, the vocab rollout): the watchdog back
    as it was. A failure here never undoes the proven release: it returns (why, the watchdog's second try in
    words) for the caller's message; None when done."""
    try:
        faults.hit("after-gate")
        watchdog(cx, watchdog_on)
    except Exception as err:  # noqa: BLE001 - see errors.describe; the release serves, only supervision is left
        return describe(err, cx.log), watchdog_again(cx, watchdog_on)
    return None


def watchdog_active(cx: Context) -> bool:
    return cx.conn(cx.head).query(["systemctl", "is-active", "--quiet", cx.lay.watchdog_timer], check=False).ok


# ------------------------------------------------------------------------------------ stop, switch, start
def stop_all(cx: Context, names: list[str] | None = None) -> None:
    """Head first (it holds the rendezvous and the API), then the workers in parallel."""
    names = names or cx.names
    watchdog(cx, False)
    if cx.head in names:
        cx.conn(cx.head).run(["systemctl", "stop", cx.lay.unit], timeout=120)
    rest = [n for n in names if n != cx.head]
    cx.each(lambda c: c.run(["systemctl", "stop", cx.lay.unit], timeout=120), "stopping the engine", rest)


def stop_and_disable(cx: Context) -> None:
    """Engine stopped everywhere, its unit and the watchdog timer disabled (what `down` leaves)."""
    stop_all(cx)
    for n in cx.names:
        cx.conn(n).run(["systemctl", "disable", cx.lay.unit], check=False)
    cx.conn(cx.head).run(["systemctl", "disable", cx.lay.watchdog_timer], check=False)


def start_all(cx: Context) -> None:
    """Evict the checkpoint's page cache and refuse a start the plan's memory budget cannot hold (the
    field's OOM cascades); then workers first (they wait for the head's rendezvous), the head last."""
    from sparkdeploy.ops import weights

    _, guards = weights.evict_and_guard(cx.pool, cx.plan, cx.plan.model_host_dir)
    for g in guards:
        if g.status.value != "ok":
            cx.log(f"{g.node}: memory guard {g.status.value}: {g.reason}")
    faults.hit("memory-guard")
    weights.enforce(guards)
    for node in cx.plan.start_order:
        cx.conn(node.name).run(["systemctl", "reset-failed", cx.lay.unit], check=False)
        cx.conn(node.name).run(["systemctl", "start", cx.lay.unit], timeout=120)
        connection.narrate(cx.log, f"{node.name}: started {cx.lay.unit} ({node.role}, rank {node.rank})")


def switch(cx: Context, num: int, list_sha: str | None = None, what: str | None = None) -> None:
    """`current` -> release `num` on every node. The draft list follows: to `list_sha` when given (a rollout
    points current.txt itself, before the release switch), else to the list the release names (a release
    made by `vocab rollout` names another list than up's)."""
    from sparkdeploy.ops import vocab_live

    if list_sha is not None:
        cx.each(lambda c: (vocab_live.point(c, cx.lay, list_sha), releases.switch(c, cx.lay, num)),
                what or f"switching to release {num}")
        return
    cx.each(lambda c: releases.switch(c, cx.lay, num), what or f"switching to release {num}")
    cx.each(lambda c: vocab_live.follow_release(c, cx.lay), f"pointing the draft list at release {num}'s")


def switch_and_restart(cx: Context, num: int, *, list_sha: str | None = None, what: str | None = None,
                       plan_of_release: bool = False) -> None:
    """The one switch: stop head, stop workers, switch `current` to `num`, start workers, then the head, under
    cx.plan, or under the plan release `num` recorded (`plan_of_release`, taken once switched). The fault
    seam's after-stop/after-switch boundaries sit here (each fires once per process). A replica leaves the
    router's rotation first (ops/rotation.py); the verb puts it back once it serves (steps/deploy.py)."""
    if cx.rotation is not None and not cx.opts.dry_run:
        cx.rotation.leave(cx.plan.api_url)
    stop_all(cx)
    faults.hit("after-stop")
    switch(cx, num, list_sha=list_sha, what=what)
    faults.hit("after-switch")
    if plan_of_release:
        cx.plan = cx.release_plan(num)
    start_all(cx)


def restart_recorded(cx: Context, num: int, out: list[Outcome], detail: str, **switch) -> None:
    """switch_and_restart under the effects recorder (carried out, or in a dry run only listed), appended to `out`
    as the `start` outcome with its exact effects: what a dry run prints is what the real restart makes."""
    with connection.recording(dry=cx.opts.dry_run) as made:
        switch_and_restart(cx, num, **switch)
    out.append(Outcome("start", cx.head, WOULD if cx.opts.dry_run else CHANGED, detail, [f"restart on release {num}"],
                       effects=made))


def after_restart(cx: Context) -> str:
    """What a dry run, which stops at the restart, says follows it in the real run."""
    return (f"then the health gate: a temperature-0 completion at {cx.plan.api_url} within "
            f"{cx.opts.ready_timeout:.0f} s, twice; HEALTHY marked on every node; watchdog on")


def serve_again(cx: Context, good: int, *, plan_of_release: bool = True, list_sha: str | None = None,
                what: str | None = None, watchdog_was: bool | None = None,
                started: Callable[[], object] | None = None, wait: Callable[[], str] | None = None) -> str:
    """The one rollback: release `good` (it passed its gate on every node) serves again. Switch and restart on
    it (under its own recorded plan unless `plan_of_release` is False: the caller's plan is already that
    release's), `started()` once it is started, the watchdog back as it was (when `watchdog_was` is given),
    then wait until it answers (`wait`, default readiness within rollback_timeout); returns the probe's text."""
    switch_and_restart(cx, good, list_sha=list_sha, what=what, plan_of_release=plan_of_release)
    if started:
        started()
    if watchdog_was is not None:
        watchdog(cx, watchdog_was)
    return wait() if wait else wait_ready(cx, cx.opts.rollback_timeout)


def opens_without_key(cx: Context, num: int) -> bool:
    """Would release `num` serve without the key the inventory names? Only a release made by a kit before the
    key became current state (its launch does not read the secrets env file) can: never start one then."""
    if cx.inv.auth.api_key_file is None:
        return False
    launch = f"{releases.rdir(cx.lay, num)}/{LAUNCH_FILE}"
    return not cx.conn(cx.head).query(["grep", "-qF", "--", f"--env-file {cx.lay.secrets_env}", launch],
                                      check=False).ok


# ----------------------------------------------------------------------------------- readiness + gate
class NotReady(HealthError):
    """The head did not answer a completion within the wait's time."""


class RankLost(HealthError):
    """A rank stopped, restarted or its node rebooted while its peers waited for it."""


def answers(cx: Context) -> bool:
    """Does the head answer a one-token completion now? Every unit can be active while the pair serves nothing: a
    head rebooted beside a worker that will never rejoin it, before the watchdog's first tick after the boot."""
    try:
        health.generate(cx.plan.api_url, cx.plan.served_name, timeout=cx.opts.probe_timeout, max_tokens=1,
                        api_key=cx.inv.auth.api_key())
        return True
    except (requests.RequestException, ValueError, LookupError):
        return False


def wait_ready(cx: Context, timeout: float, watch: Callable[[], None] | None = None) -> str:
    """Poll the head until a real temperature-0 completion answers; returns its text. Stops early when a rank is
    lost meanwhile (`watch`, default a new `rank_watch`): the other rank then waits for it forever, the timeout
    would only add to the outage before the rollback. `up`, `rollback` and `vocab rollout` all wait here."""
    url = cx.plan.api_url
    try:
        return health.wait_answering(url, cx.plan.served_name, timeout=timeout,
                                     probe_timeout=cx.opts.probe_timeout, log=cx.log,
                                     api_key=cx.inv.auth.api_key(), every=watch or rank_watch(cx), every_s=5.0)
    except health.NotAnswering as err:
        states = cx.map(lambda c: c.query(["docker", "inspect", "-f", "{{.State.Status}}",
                                           cx.lay.container], check=False).stdout.strip() or "absent")
        raise NotReady(f"not ready after {timeout:.0f} s: last saw {err.last} at {url}; containers: "
                       + ", ".join(f"{n} {s}" for n, s in states.items())) from None


BOOT_ID = "$(cat /proc/sys/kernel/random/boot_id)/$(sed 's/.*) //' /proc/1/stat | cut -d' ' -f20)"
"""Which boot this is (shell): the kernel's boot id and PID 1's start in clock ticks since that boot. Neither
depends on the wall clock: `ps -o lstart` did (btime moves when the clock is stepped), and a VM's clock step once
read as a reboot in CI. The tick count tells a restarted container (the sim's reboot) from the one that was."""


def boot_id(conn) -> str:
    return conn.query(["sh", "-c", f"echo {BOOT_ID}"], check=False, timeout=20).stdout.strip()


def rank_watch(cx: Context, boots: dict[str, str] | None = None, release: int | None = None) -> Callable[[], None]:
    """The one rank watch: a check to repeat while a release comes up, raising RankLost naming the node, its role
    and rank once its engine unit is not active (failed, or waiting to restart: with the journal's last lines),
    runs another invocation than the first check saw (its process died and systemd's Restart= started it again),
    or its node booted again since `boots` (read before the switch) or since the first check. A node that does
    not answer is judged at the next check, unless it answers again right away on a new boot."""
    first: dict[str, str] = {}
    boots = dict(boots or {})
    ranks = {n.name: n.rank for n in cx.plan.nodes} if cx.plan else {n: i for i, n in enumerate(cx.names)}
    fields = ("ActiveState", "SubState", "InvocationID", "ExecMainStatus")
    on = f" on release {release}" if release is not None else ""

    def who(n: str) -> str:
        return f"{n} ({'head' if n == cx.head else 'worker'}, rank {ranks.get(n)})"

    look_sh = f"{shlex.join(probes.unit_show_argv([cx.lay.unit], fields))}; echo boot={BOOT_ID}"

    def look(c) -> probes.UnitState:  # one round trip: the unit's state and the boot, one block
        return probes.unit_state(c.query(["sh", "-c", look_sh], check=False, timeout=20).stdout)

    def rebooted(n: str, boot: str) -> None:
        boots.setdefault(n, boot)
        if boot and boot != boots[n]:
            raise RankLost(f"{who(n)} rebooted while the release came up (boot/PID 1 start {boot}, was {boots[n]})")

    def check() -> None:
        for n, st in cx.map(look).items():
            if isinstance(st, Exception):
                if not cx.reconnect([n], wait=0):
                    rebooted(n, boot_id(cx.conn(n)))
                continue
            rebooted(n, st.get("boot", ""))
            if "ActiveState" not in st:
                continue
            first.setdefault(n, st.get("InvocationID", ""))
            if st["ActiveState"] != "active" or st.get("SubState") == "auto-restart":
                try:  # the journal only adds detail: a node going down as it is read must not hide the loss
                    tail = cx.conn(n).query(["journalctl", "-u", cx.lay.unit, "-n", "4", "--no-pager", "-o", "cat"],
                                            check=False, timeout=20).stdout.strip().replace("\n", " | ")
                except SparkdeployError as err:
                    tail = f"(its journal could not be read: {err})"
                raise RankLost(f"{who(n)} failed to start or stopped{on}: its engine unit is {st['ActiveState']} "
                               f"({st.get('SubState')}; its process exited with status {st.get('ExecMainStatus')}); "
                               f"the other ranks cannot finish without it: {tail[-300:]}")
            if st.get("InvocationID", "") != first[n]:
                raise RankLost(f"{who(n)}: its engine unit was restarted while the release came up; the other "
                               "ranks cannot finish with a new peer")

    return check


def record_gate(cx: Context, num: int, probe: str, **more) -> None:
    """Release `num` passed its gate: its HEALTHY record on every node (the probe's answer, which later gates of
    the release must repeat, and what else the verb proved: `more`)."""
    rec = {"probe": probe, "prompt": health.PROBE_PROMPT, "max_tokens": health.PROBE_MAX_TOKENS, "at": time.time(),
           **more}
    cx.each(lambda c: releases.mark_healthy(c, cx.lay, num, rec), "recording the health gate")


def gate(cx: Context, num: int, out: list[Outcome]) -> str:
    """Readiness + a temperature-0 probe (twice: it must be deterministic); record it as HEALTHY."""
    t0 = time.monotonic()
    text = wait_ready(cx, cx.opts.ready_timeout, rank_watch(cx, release=num))
    again = health.generate(cx.plan.api_url, cx.plan.served_name, timeout=cx.opts.probe_timeout,
                            api_key=cx.inv.auth.api_key())
    if again != text:
        raise HealthError(f"temperature-0 probe is not deterministic: {text!r} then {again!r}")
    record_gate(cx, num, text, seconds_to_ready=round(time.monotonic() - t0, 1))
    out.append(Outcome("health gate", cx.head, OK, f"release {num} answered in {time.monotonic() - t0:.1f} s: {text!r}",
                       [], time.monotonic() - t0))
    return text
