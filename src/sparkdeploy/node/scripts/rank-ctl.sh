#!/bin/sh
# sparkdeploy rank control: the forced command of a head watchdog's key on a worker
# (authorized_keys: restrict,command="/usr/local/lib/sparkdeploy/rank-ctl [SERVICE]"). Allows exactly these
# verbs, on the engine of that service only (no SERVICE: the inventory without `services:`).
unit=sparkdeploy-engine.service
ctr=sparkdeploy-engine
case "$1" in
  "") ;;
  *[!A-Za-z0-9._-]*|[!A-Za-z0-9]*) echo "rank-ctl: bad service name: $1" >&2; exit 2 ;;
  *) unit=sparkdeploy-engine-$1.service; ctr=sparkdeploy-engine-$1 ;;
esac
case "$SSH_ORIGINAL_COMMAND" in
  status)  docker inspect -f '{{.State.Running}} {{.State.StartedAt}}' "$ctr" 2>/dev/null || echo "false none" ;;
  restart) systemctl restart "$unit" && echo restarted ;;
  stop)    systemctl stop "$unit" && echo stopped ;;
  start)   systemctl start --no-block "$unit" && echo started ;;
  *) echo "rank-ctl: verb not allowed: $SSH_ORIGINAL_COMMAND" >&2; exit 2 ;;
esac
