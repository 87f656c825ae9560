"""Stale units: any other enabled unit that runs another inference stack, publishes our ports or owns them.

The seed's reboot bug: the old stack's unit stayed enabled while the running one was disabled, so a reboot
brought back the wrong engine. `up` finds such units, stops and disables them, and says which.
"""

from __future__ import annotations

from sparkdeploy.node import probes
from sparkdeploy.remote.connection import Conn
from sparkdeploy.steps.base import Action

#: Who owns our ports: each enabled unit that owns a listener on one of $ports (space separated), one per line;
#: docker's own units and containers' scopes are not units of their own stack.
PORT_OWNERS = r"""
exec 2>/dev/null
for p in $ports; do
  for pid in $(ss -ltnpH "sport = :$p" | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u); do
    u=$(ps -o unit= -p "$pid" | tr -d ' ')
    case "$u" in ""|docker-*.scope|docker.service|containerd.service|*.scope) continue ;; esac
    [ "$(systemctl is-enabled "$u")" = enabled ] && echo "$u"
  done
done
"""
#: What `up` and health read (one probe's sections): the enabled units' commands, doctor's own section and rule
#: (`probes.stale_units`), and the owners of our ports.
SECTIONS = {"enabled_units": probes.SECTIONS["enabled_units"], "port_owners": PORT_OWNERS}


def values(ports: list[int]) -> dict[str, str]:
    """The shell variables SECTIONS read."""
    return {"ports": " ".join(map(str, ports))}


def find(conn: Conn, ours: list[str], ports: list[int]) -> list[str]:
    out = conn.query(probes.named_probe_argv("stale", SECTIONS, values(ports)), timeout=60, check=False).stdout
    return parse(probes.split_sections(out), ours, ports)


def parse(sections: dict[str, probes.Section], ours: list[str], ports: list[int]) -> list[str]:
    """The stale units, sorted: by the one rule, plus the owners of our ports that are not ours."""
    by_rule = probes.stale_units(probes.parse_units(probes.section_text(sections, "enabled_units")), ports,
                                 ours.__contains__)
    owners = {u for u in probes.section_text(sections, "port_owners").split() if u not in ours}
    return sorted(set(by_rule) | owners)


def diff(conn: Conn, ours: list[str], ports: list[int]) -> list[Action]:
    held = "/".join(map(str, ports))
    return [Action(f"stop and disable stale unit {u} (runs another inference stack or holds port {held})",
                   lambda u=u: retire(conn, u))
            for u in find(conn, ours, ports)]


def retire(conn: Conn, unit: str) -> None:
    """Stop and disable `unit`, and clear the failed state a stop can leave (an engine that did not exit cleanly,
    or one caught in a restart loop): a retired unit is inactive, and does not keep the node "degraded"."""
    conn.run(["systemctl", "disable", "--now", unit], timeout=120)
    conn.run(["systemctl", "reset-failed", unit], check=False)
