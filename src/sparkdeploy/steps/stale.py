"""Stale units: any other enabled unit that runs a vLLM container or binds our ports.

The seed's reboot bug: the old stack's unit stayed enabled while the running one was disabled, so a reboot
brought back the wrong engine. `up` finds such units, stops and disables them, and says which.
"""

from __future__ import annotations

from sparkdeploy.connection import Conn
from sparkdeploy.steps.base import Action

# $1 = the units that are ours (space separated), $2.. = our ports. Prints one unit per line (`parse`).
FIND = r"""
ours=" $1 "; shift
ports="$*"
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


def find(conn: Conn, ours: list[str], ports: list[int]) -> list[str]:
    return parse(conn.query(["sh", "-c", FIND, "stale", " ".join(ours), *map(str, ports)], timeout=60,
                            check=False).stdout)


def parse(out: str) -> list[str]:
    """FIND's output -> the stale units, sorted."""
    return sorted({line.strip() for line in out.splitlines() if line.strip()})


def diff(conn: Conn, ours: list[str], ports: list[int]) -> list[Action]:
    return [Action(f"stop and disable stale unit {u} (runs vLLM or binds port {'/'.join(map(str, ports))})",
                   lambda u=u: conn.run(["systemctl", "disable", "--now", u], timeout=120))
            for u in find(conn, ours, ports)]
