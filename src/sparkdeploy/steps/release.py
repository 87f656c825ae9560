"""The release step of `up`: a new numbered release directory on every node when any desired file or the
image differs from the current release's (nothing differs -> no new release); and pruning old releases and
the images no kept release names."""

from __future__ import annotations

from sparkdeploy import paths
from sparkdeploy.node.layout import ServiceLayout
from sparkdeploy.ops import registry, releases
from sparkdeploy.plan import render
from sparkdeploy.remote.connection import Conn
from sparkdeploy.steps import supervise
from sparkdeploy.steps.base import OK, Action, Outcome, run_step
from sparkdeploy.steps.context import Context


def release_files(cx: Context, name: str) -> dict[str, tuple[bytes, int]]:
    """Node `name`'s files of the release the plan makes, with their modes; the head's carry the watchdog's
    configuration too."""
    pre = f"{name}/release/"
    out = {k[len(pre):]: (v, render.file_mode(k)) for k, v in cx.files.items() if k.startswith(pre)}
    if name == cx.head:
        out[supervise.CONFIG] = (supervise.config(cx.plan, cx.plan.release_id), 0o644)
    return out


def current_matches(cx: Context) -> tuple[bool, dict[str, str]]:
    """Does every node's current release hold exactly the desired files and image? (reason per node)"""
    why = {}
    for n in cx.names:
        nr = cx.rel[n]
        if nr.current is None or nr.current not in nr.complete:
            why[n] = "no current release"
            continue
        meta = nr.complete[nr.current]
        want = {k: releases.sha(v) for k, (v, _) in release_files(cx, n).items()}
        if meta.get("files") != want:
            diff = sorted(k for k in set(want) | set(meta.get("files", {}))
                          if want.get(k) != meta.get("files", {}).get(k))
            why[n] = f"release {nr.current} differs in {', '.join(diff)}"
        elif meta.get("image_id") != cx.image_id:
            why[n] = f"release {nr.current} uses image {str(meta.get('image_id'))[:19]}"
    nums = {cx.rel[n].current for n in cx.names}
    if not why and len(nums) != 1:
        why = {n: f"current release {cx.rel[n].current} differs across nodes" for n in cx.names}
    return not why, why


def step_release(cx: Context, out: list[Outcome]) -> int:
    """Write a new numbered release on every node if anything differs; returns the release to run."""
    same, why = current_matches(cx)
    if same:
        num = cx.rel[cx.head].current
        out += [Outcome("release", n, OK, f"release {num} is current") for n in cx.names]
        return num
    newest = max(nr.newest for nr in cx.rel.values())
    # An aborted or failed attempt (newest number, current nowhere, healthy nowhere) is rewritten in place.
    reuse = newest and all(nr.current != newest and newest not in nr.healthy for nr in cx.rel.values())
    num = newest if reuse else newest + 1
    meta = {"fingerprint": cx.plan.release_id, "image": cx.plan.image.tag, "image_id": cx.image_id,
            "nodes": cx.names, "kit_version": cx.plan.kit_version, "git_commit": paths.git_commit(),
            "served_as": cx.plan.served_as()}

    def diff(n: str) -> list[Action]:
        files = release_files(cx, n)

        def write():
            m = dict(meta, node=n, facts=cx.facts[n].to_dict(), reason=why.get(n, "another node changed"))
            releases.write(cx.conn(n), cx.lay, num, files, m)

        return [Action(f"write release {num} ({', '.join(sorted(files))}): {why.get(n, 'another node changed')}",
                       write)]

    out += run_step("release", cx.names, diff, dry_run=cx.opts.dry_run, log=cx.log)
    return num


def prune(cx: Context) -> None:
    """Old releases (releases.prune keeps the newest healthy ones), the images no kept release names, on the
    nodes and in the head's registry (its layers would otherwise grow with every image ever deployed). A node
    shared with other services keeps the images their releases name too (they can roll back to them)."""
    for n, nr in cx.scan().items():
        releases.prune(cx.conn(n), cx.lay, nr)
    lays = [ServiceLayout(name) for name in cx.inv.services] or [cx.lay]

    def kept(c: Conn) -> set[str]:
        return {m["image"] for lay in lays for m in releases.scan(c, lay).complete.values() if m.get("image")}

    keep_images = cx.each(kept, "reading the releases' images")
    repo = cx.plan.image.repository

    def drop_images(c: Conn):
        tags = c.query(["docker", "image", "ls", "--format", "{{.Repository}}:{{.Tag}}", repo], check=False).stdout.split()
        old = [t for t in tags if t not in keep_images[c.name] and not t.endswith(":<none>")]
        if old:
            c.run(["docker", "image", "rm", *old], check=False, timeout=300)
        c.run(["docker", "image", "prune", "-f"], check=False, timeout=300)

    cx.map(drop_images)
    dropped = registry.collect(cx.conn(cx.head), repo, keep_images[cx.head])
    if dropped:
        cx.log(f"{cx.head}: registry: removed {', '.join(dropped)} and the layers only they used")
