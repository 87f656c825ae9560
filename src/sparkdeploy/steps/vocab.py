"""The vocab step of `up`: the plan's draft list stored by sha256 on every node.

The live pointer (current.txt) is not moved here: it moves at the switch (engine.switch ->
vocab_live.follow_release), to the list the release being started names. Moved earlier, a failure in a later
step, or a reboot or watchdog restart of the old release before the switch, would start the old engine on a
list whose sha256 is not the one it was configured with, and its shortlist would silently turn off. The one
pointer this step sets is a repair: the current release expects this very list and the pointer says otherwise.
"""

from __future__ import annotations

from sparkdeploy.ops import releases, vocab_live
from sparkdeploy.steps.base import OK, Action, Outcome, run_step
from sparkdeploy.steps.context import Context


def step_vocab(cx: Context, out: list[Outcome]) -> None:
    src = cx.plan.image.vocab_source
    if not src:
        out += [Outcome("vocab", n, OK, "no draft vocab in this plan") for n in cx.names]
        return
    with open(src, "rb") as f:
        data = f.read()
    digest = releases.sha(data)
    d = cx.lay.vocab_host_dir

    def diff(n: str) -> list[Action]:
        c = cx.conn(n)
        acts = []
        if c.query(["sha256sum", f"{d}/{digest}.txt"], check=False).stdout.split()[:1] != [digest]:
            acts.append(Action(f"write {d}/{digest}.txt", lambda: (c.run(["mkdir", "-p", d]),
                                                                   c.put(f"{d}/{digest}.txt", data))))
        live = vocab_live.read_state(c, cx.lay)
        if live.configured == digest and live.content != digest:
            acts.append(Action(f"point {d}/current.txt at {digest[:12]} (the list release {live.release} expects)",
                               lambda: vocab_live.point(c, cx.lay, digest)))
        return acts

    out += run_step("vocab", cx.names, diff, dry_run=cx.opts.dry_run, log=cx.log)
