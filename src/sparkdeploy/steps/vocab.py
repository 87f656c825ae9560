"""The vocab step of `up`: the plan's draft list stored by sha256 on every node, current.txt pointing at it."""

from __future__ import annotations

from sparkdeploy import releases
from sparkdeploy.steps.base import OK, Action, Outcome, run_step
from sparkdeploy.steps.context import Context


def step_vocab(cx: Context, out: list[Outcome]) -> None:
    src = cx.plan.image.vocab_source
    if not src:
        out += [Outcome("vocab", n, OK, "no draft vocab in this plan") for n in cx.names]
        return
    data = open(src, "rb").read()
    digest = releases.sha(data)
    d = cx.lay.vocab_host_dir

    def diff(n: str) -> list[Action]:
        c = cx.conn(n)
        acts = []
        if c.query(["sha256sum", f"{d}/{digest}.txt"], check=False).stdout.split()[:1] != [digest]:
            acts.append(Action(f"write {d}/{digest}.txt", lambda: (c.run(["mkdir", "-p", d]),
                                                                   c.put(f"{d}/{digest}.txt", data))))
        if c.query(["readlink", f"{d}/current.txt"], check=False).stdout.strip() != f"{digest}.txt":
            acts.append(Action(f"point {d}/current.txt at {digest[:12]}",
                               lambda: (c.run(["mkdir", "-p", d]), c.symlink(f"{d}/current.txt", f"{digest}.txt"))))
        return acts

    out += run_step("vocab", cx.names, diff, dry_run=cx.opts.dry_run, log=cx.log)
