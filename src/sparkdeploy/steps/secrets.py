"""The secrets step of `up` and `rollback`: the engine's secrets in their own root-owned 0600 env file (never in a
release, argv or a log line).

The rule: a key is current state, the inventory's, not release state. Every release's launch names this file
(plan._docker_argv), and this step keeps it holding exactly what the inventory names, empty when it names
nothing. So a kept release always finds the file it needs, a rollback serves with today's key (never a key the
inventory no longer lists), and a rollback to a release gated without a key still requires today's key.
"""

from __future__ import annotations

import posixpath

from sparkdeploy.model import credentials
from sparkdeploy.ops import releases
from sparkdeploy.steps.base import Action, Outcome, run_step
from sparkdeploy.steps.context import Context


def step_secrets(cx: Context, out: list[Outcome]) -> None:
    values = cx.inv.auth.engine_env()
    data = credentials.env_file(values)
    digest = releases.sha(data)
    path = cx.lay.secrets_env
    what = ", ".join(f"{k} {v}" for k, v in cx.inv.auth.fingerprints().items()) or \
        "empty: the inventory names no auth.api_key_file"

    def diff(n: str) -> list[Action]:
        c = cx.conn(n)
        have = c.query(["sha256sum", path], check=False)
        mode = c.query(["stat", "-c", "%a %U", path], check=False).stdout.split()
        if have.stdout.split()[:1] == [digest] and mode == ["600", "root"]:
            return []
        return [Action(f"write {path} (mode 0600, root; {what})",
                       lambda: (c.run(["mkdir", "-p", posixpath.dirname(path)]),
                                c.put(path, data, mode=0o600, owner="root:root")))]

    out += run_step("secrets", cx.names, diff, dry_run=cx.opts.dry_run, log=cx.log)
