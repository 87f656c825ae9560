"""`down`: the engine stopped on every node of the inventory (head first); its unit, the watchdog timer and
the exporter disabled (the exporter also stopped) unless --keep-enabled."""

from __future__ import annotations

from sparkdeploy.remote.connection import recording
from sparkdeploy.steps import engine
from sparkdeploy.steps.base import CHANGED, WOULD, Outcome
from sparkdeploy.steps.context import Context


def down(cx: Context, keep_enabled: bool = False) -> list[Outcome]:
    """Each node's outcome lists the exact commands it got (a dry run: would get; none is carried out)."""
    out: list[Outcome] = []
    names = [n.name for n in cx.inv.nodes]
    cx.names = [cx.inv.head.name] + [n for n in names if n != cx.inv.head.name]
    cx.connect(out, cx.names)
    with recording(dry=cx.opts.dry_run) as made:
        engine.stop_all(cx)
        if not keep_enabled:
            cx.each(lambda c: c.run(["systemctl", "disable", cx.lay.unit], check=False), "disabling the engine")
            head = cx.conn(cx.head)
            head.run(["systemctl", "disable", cx.lay.watchdog_timer], check=False)
            head.run(["systemctl", "disable", "--now", cx.lay.exporter_unit], check=False)
    acts = ["stopped"] + ([] if keep_enabled else ["disabled"])
    return out + [Outcome("down", n, WOULD if cx.opts.dry_run else CHANGED, "", acts, 0.0,
                          [e for e in made if e.startswith(f"{n}: ")]) for n in cx.names]
