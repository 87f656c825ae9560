"""The launch check of `up`: the new serving image judges its own launch before the old release stops.

On every node, once the image is there and the release is written, the image's own vLLM runs
`spark_overlays.launch_check` on that rank's exact serve argv and release env (its parser, its pre-load checks,
the config classes that need no GPU: compilation, speculative keys, structured outputs, the plugin's additional
config). A refusal ends `up` here, with the old release still serving, naming the profile key or inventory
field the refused flag comes from. It catches what the offline catalogue at `plan` cannot: a key a config class
of the pin dropped, a parser name the pin does not register.
"""

from __future__ import annotations

import json
import posixpath
import shlex

from spark_overlays.compat import series as vllm_series
from sparkdeploy.errors import RemoteError, SparkdeployError
from sparkdeploy.model import engine_args
from sparkdeploy.node.layout import ENV_FILE
from sparkdeploy.ops import releases
from sparkdeploy.steps.base import Action, Outcome, run_step
from sparkdeploy.steps.context import Context

TIMEOUT_S = 600  # importing vLLM on a loaded CPU host takes a while; a GB10 does it in seconds


class LaunchRefused(SparkdeployError):
    """The pinned vLLM refuses the new release's command line; the old release still serves."""


def source_of(series: str, flag: str | None) -> str:
    """Where a refused flag comes from: the inventory field that owns it, else `engine_args.<flag>`."""
    if not flag:
        return "the profile's engine_args or the inventory"
    try:
        spec = engine_args.catalogue(series).get(flag)
    except SparkdeployError:
        spec = None
    owner = engine_args.OWNED.get(spec["dest"]) if spec else None
    return owner or f"engine_args.{flag.removeprefix('--')}"


def judge(node: str, out: str, rc: int, err: str, series: str) -> None:
    """Raise LaunchRefused (naming the key) on a refusal, RemoteError when the check itself could not run."""
    try:
        verdict = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise RemoteError(f"the launch check did not run (exit {rc}): {err.strip()[-500:]}", node=node) from None
    refused = verdict.get("refused")
    if refused:
        raise LaunchRefused(f"{node}: vLLM {verdict.get('vllm_version')} in the new image refuses the launch: "
                            f"{refused.get('error')} -- fix {source_of(series, refused.get('flag'))}; the old "
                            "release still serves")


def mounts(docker_argv) -> list[str]:
    """The release's own `-v` mounts (checkpoint, draft list, caches): the check sees the files the engine will."""
    argv = list(docker_argv)
    return [x for i, a in enumerate(argv[:-1]) if a == "-v" for x in (a, argv[i + 1])]


def passed_mark(cx: Context, node: str) -> str:
    """Where a node keeps that a launch passed: named by what the check judges (image, argv, env), so a release
    that changes none of them (a new memory reserve on a CPU node, a re-run) is not checked again."""
    key = json.dumps([cx.image_id, list(cx.plan.node(node).serve_argv)]).encode() + \
        cx.files[f"{node}/release/{ENV_FILE}"]
    return f"{cx.lay.state_dir}/launch-checks/{releases.sha(key)[:32]}"


def step_launch_check(cx: Context, num: int, out: list[Outcome]) -> None:
    python = shlex.split(cx.plan.image.python)
    rdir = releases.rdir(cx.lay, num)
    series = vllm_series(cx.plan.image.vllm_version)

    def diff(n: str) -> list[Action]:
        c = cx.conn(n)
        mark = passed_mark(cx, n)
        if cx.plan.node(n).serve_argv[:2] != ("vllm", "serve") or c.exists(mark):
            return []  # a Ray worker's rank runs `ray start`: vLLM's parser has nothing of it to judge
        argv = ["docker", "run", "--rm", "--network", "none", "--env-file", f"{rdir}/{ENV_FILE}",
                *mounts(cx.plan.node(n).docker_argv), "--entrypoint", python[0], cx.plan.image.tag, *python[1:],
                "-m", "spark_overlays.launch_check", *cx.plan.node(n).serve_argv]

        def check() -> None:
            res = c.run(argv, check=False, timeout=TIMEOUT_S)
            if not (res.ok and not res.stdout):  # a dry run answers success with no output: nothing was run
                judge(n, res.stdout, res.rc, res.stderr, series)
            c.run(["mkdir", "-p", posixpath.dirname(mark)])
            c.put(mark, b"")

        return [Action(f"check release {num}'s launch with the new image's vLLM", check)]

    out += run_step("launch check", cx.names, diff, dry_run=cx.opts.dry_run, log=cx.log)
