"""The unit steps of `up`: stale units (ours under another name, or strangers on our ports), our systemd
units installed and enabled, the supervision (watchdog) wiring, and nodes outside the plan retired."""

from __future__ import annotations

import posixpath

from sparkdeploy.node.layout import PLAIN
from sparkdeploy.remote.connection import Conn, recording
from sparkdeploy.remote.ssh import host_key_line
from sparkdeploy.steps import stale, supervise
from sparkdeploy.steps.base import CHANGED, WOULD, Action, Outcome, run_step
from sparkdeploy.steps.context import Context


def step_stale(cx: Context, out: list[Outcome]) -> None:
    """Strangers on our ports or running vLLM; with `services:`, also the units under the plain names (an
    inventory without `services:` deployed here before, or a kit before services had names of their own):
    their engine would hold the service's ports and memory, their watchdog would start it again. The units of
    the inventory's other services on a shared node are ours. Their releases stay in /etc/sparkdeploy."""
    ours = cx.inv.our_units()
    ports = [cx.plan.api_port, cx.plan.master_port]
    plain = [PLAIN.watchdog_timer, PLAIN.unit, PLAIN.exporter_unit] if cx.lay.service else []

    def diff(n: str) -> list[Action]:
        c = cx.conn(n)
        return stale.diff(c, ours, ports) + disable_running(
            c, plain, "plain-named: an inventory without services: ran here before")

    out += run_step("stale units", cx.names, diff, dry_run=cx.opts.dry_run, log=cx.log)


def step_units(cx: Context, out: list[Outcome]) -> None:
    def diff(n: str) -> list[Action]:
        c = cx.conn(n)
        acts = []
        units = cx.unit_files(n)
        changed = [p for p, data in units.items() if c.get(p) != data]
        if changed:
            def install(c=c, changed=changed, units=units):
                for p in changed:
                    c.put(p, units[p])
                c.run(["systemctl", "daemon-reload"])
            acts.append(Action(f"install {', '.join(posixpath.basename(p) for p in changed)} + daemon-reload", install))
        if c.query(["systemctl", "is-enabled", cx.lay.unit], check=False).stdout.strip() != "enabled":
            acts.append(Action(f"enable {cx.lay.unit}", lambda c=c: c.run(["systemctl", "enable", cx.lay.unit])))
        return acts

    out += run_step("units", cx.names, diff, dry_run=cx.opts.dry_run, log=cx.log)


def step_supervision(cx: Context, out: list[Outcome]) -> None:
    head = cx.conn(cx.head)
    workers = cx.names[1:]
    with recording(dry=cx.opts.dry_run) as made:
        pub = supervise.ensure_key(head, cx.lay)
    if made:  # the key pair was made (or would be): its commands are this step's too
        out.append(Outcome("supervision", cx.head, WOULD if cx.opts.dry_run else CHANGED, "",
                           ["make the watchdog's key pair"], 0.0, list(made)))
    out += run_step("supervision", workers, lambda n: supervise.worker_actions(cx.conn(n), cx.lay, pub),
                    dry_run=cx.opts.dry_run, log=cx.log) if workers else []
    known = [host_key_line(cx.conn(n), cx.plan.node(n).ssh.host, cx.plan.node(n).ssh.port)
             for n in workers]
    knobs = supervise.settings(start_grace_s=cx.opts.watchdog_grace or cx.opts.ready_timeout,
                               backoff_base_s=cx.opts.watchdog_backoff_s, retry_cap=cx.opts.watchdog_cap,
                               wedge=cx.inv.watchdog)
    out += run_step("supervision", [cx.head],
                    lambda n: supervise.head_actions(head, cx.lay, known, knobs),
                    dry_run=cx.opts.dry_run, log=cx.log)


def retire_others(cx: Context, out: list[Outcome]) -> None:
    """The inventory's nodes outside this plan (`up --nodes 1`, or a service moved off them): stop and disable
    this service's engine, watchdog timer and exporter there. Left running, they would hold the node's ports and
    memory, and the old head's watchdog would start the engine again. Their releases stay."""
    units = [cx.lay.watchdog_timer, cx.lay.unit, cx.lay.exporter_unit]  # the watchdog first: it would restart
    why = (f"not one of service {cx.lay.service}'s nodes" if cx.lay.service else
           f"node not in this {len(cx.names)}-node plan")
    reached = [n for n in cx.others if cx.connected(n)]  # one that is down keeps its units until the next up
    out += run_step("retire", reached, lambda n: disable_running(cx.conn(n), units, why), dry_run=cx.opts.dry_run,
                    log=cx.log)


def disable_running(c: Conn, units: list[str], why: str) -> list[Action]:
    """Stop and disable each of `units` that is enabled or active on the node, in the order given."""
    on = [u for u in units if c.query(["sh", "-c", 'systemctl is-enabled --quiet "$1" || systemctl is-active '
                                       '--quiet "$1"', "unit", u], check=False).ok]
    return [Action(f"stop and disable {u} ({why})", lambda u=u: stale.retire(c, u)) for u in on]
