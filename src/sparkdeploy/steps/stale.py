"""Stale units: any other enabled unit that runs a vLLM container or binds our ports.

The seed's reboot bug: the old stack's unit stayed enabled while the running one was disabled, so a reboot
brought back the wrong engine. `up` finds such units, stops and disables them, and says which.
"""

from __future__ import annotations

from sparkdeploy.node import probes
from sparkdeploy.remote.connection import Conn
from sparkdeploy.steps.base import Action

#: One section of a probe (`probes.named_probe_argv`; variables from `values`): $ours the units that are ours,
#: $ports our ports (both space separated). Prints one unit per line (`parse`).
FIND = r"""
exec 2>/dev/null
ours=" $ours "
pat='vllm'
for p in $ports; do pat="$pat|:$p([^0-9]|\$)|--port[= ]$p([^0-9]|\$)"; done
# Enabled = linked from a .wants/.requires directory (reading links is instant; `systemctl list-unit-files`
# takes seconds on a loaded host).
for link in /etc/systemd/system/*.wants/*.service /etc/systemd/system/*.requires/*.service; do
  [ -e "$link" ] || continue
  u=${link##*/}
  case "$ours" in *" $u "*) continue ;; esac
  f=$(readlink -f "$link")
  if cat "$f" /etc/systemd/system/"$u".d/*.conf 2>/dev/null | grep -E '^[[:space:]]*Exec' | grep -qiE "$pat"; then
    echo "$u"
  fi
done | sort -u
for p in $ports; do
  for pid in $(ss -ltnpH "sport = :$p" 2>/dev/null | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u); do
    u=$(ps -o unit= -p "$pid" 2>/dev/null | tr -d ' ')
    case "$u" in ""|docker-*.scope|docker.service|containerd.service|*.scope) continue ;; esac
    case "$ours" in *" $u "*) continue ;; esac
    [ "$(systemctl is-enabled "$u" 2>/dev/null)" = enabled ] && echo "$u"
  done
done
"""


def values(ours: list[str], ports: list[int]) -> dict[str, str]:
    """The shell variables FIND reads."""
    return {"ours": " ".join(ours), "ports": " ".join(map(str, ports))}


def find(conn: Conn, ours: list[str], ports: list[int]) -> list[str]:
    out = conn.query(probes.named_probe_argv("stale", {"stale": FIND}, values(ours, ports)), timeout=60,
                     check=False).stdout
    return parse(probes.section_text(probes.split_sections(out), "stale"))


def parse(out: str) -> list[str]:
    """FIND's output -> the stale units, sorted."""
    return sorted({line.strip() for line in out.splitlines() if line.strip()})


def diff(conn: Conn, ours: list[str], ports: list[int]) -> list[Action]:
    return [Action(f"stop and disable stale unit {u} (runs vLLM or binds port {'/'.join(map(str, ports))})",
                   lambda u=u: retire(conn, u))
            for u in find(conn, ours, ports)]


def retire(conn: Conn, unit: str) -> None:
    """Stop and disable `unit`, and clear the failed state a stop can leave (an engine that did not exit cleanly,
    or one caught in a restart loop): a retired unit is inactive, and does not keep the node "degraded"."""
    conn.run(["systemctl", "disable", "--now", unit], timeout=120)
    conn.run(["systemctl", "reset-failed", unit], check=False)
