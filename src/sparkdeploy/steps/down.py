"""`down`: the engine stopped on every node of the inventory (head first); its unit, the watchdog timer and
the exporter disabled (the exporter also stopped) unless --keep-enabled."""

from __future__ import annotations

from sparkdeploy.steps import engine
from sparkdeploy.steps.base import CHANGED, Outcome
from sparkdeploy.steps.context import Context


def down(cx: Context, keep_enabled: bool = False) -> list[Outcome]:
    out: list[Outcome] = []
    names = [n.name for n in cx.inv.nodes]
    cx.names = [cx.inv.head.name] + [n for n in names if n != cx.inv.head.name]
    cx.connect(out, cx.names)
    engine.stop_all(cx)
    for n in cx.names:
        acts = ["stopped"]
        if not keep_enabled:
            cx.conn(n).run(["systemctl", "disable", cx.lay.unit], check=False)
            if n == cx.head:
                cx.conn(n).run(["systemctl", "disable", cx.lay.watchdog_timer], check=False)
                cx.conn(n).run(["systemctl", "disable", "--now", cx.lay.exporter_unit], check=False)
            acts.append("disabled")
        out.append(Outcome("down", n, CHANGED, "", acts))
    return out
