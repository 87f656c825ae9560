"""The secrets step of `up`: the engine's secrets in their own root-owned 0600 env file (never in a release,
argv or a log line); removed when the inventory names none."""

from __future__ import annotations

import posixpath

from sparkdeploy import credentials, releases
from sparkdeploy.steps.base import Action, Outcome, run_step
from sparkdeploy.steps.context import Context


def step_secrets(cx: Context, out: list[Outcome]) -> None:
    values = cx.inv.auth.engine_env()
    data = credentials.env_file(values)
    digest = releases.sha(data)
    path = cx.lay.secrets_env
    what = ", ".join(f"{k} {v}" for k, v in cx.plan.secrets.items())

    def diff(n: str) -> list[Action]:
        c = cx.conn(n)
        have = c.query(["sha256sum", path], check=False)
        if not values:
            return [Action(f"remove {path} (no auth.api_key_file)", lambda: c.run(["rm", "-f", path]))] \
                if have.ok else []
        mode = c.query(["stat", "-c", "%a %U", path], check=False).stdout.split()
        if have.stdout.split()[:1] == [digest] and mode == ["600", "root"]:
            return []
        return [Action(f"write {path} (mode 0600, root; {what})",
                       lambda: (c.run(["mkdir", "-p", posixpath.dirname(path)]),
                                c.put(path, data, mode=0o600, owner="root:root")))]

    out += run_step("secrets", cx.names, diff, dry_run=cx.opts.dry_run, log=cx.log)
