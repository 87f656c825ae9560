#!/bin/sh
# sparkdeploy rank control: the forced command of the head watchdog's key on a worker
# (authorized_keys: restrict,command="/usr/local/lib/sparkdeploy/rank-ctl"). Allows exactly these verbs.
unit=sparkdeploy-engine.service
ctr=sparkdeploy-engine
[ -r /etc/sparkdeploy/rank-ctl.env ] && . /etc/sparkdeploy/rank-ctl.env
case "$SSH_ORIGINAL_COMMAND" in
  status)  docker inspect -f '{{.State.Running}} {{.State.StartedAt}}' "$ctr" 2>/dev/null || echo "false none" ;;
  restart) systemctl restart "$unit" && echo restarted ;;
  stop)    systemctl stop "$unit" && echo stopped ;;
  start)   systemctl start --no-block "$unit" && echo started ;;
  *) echo "rank-ctl: verb not allowed: $SSH_ORIGINAL_COMMAND" >&2; exit 2 ;;
esac
