"""Serving image present on every node: build once, ship with `docker save | docker load`, verify by image ID.

Build happens on the head when the head's engine has the base image (a real Spark with the pinned vLLM image
pulled); otherwise on whichever machine has it (this machine, when the base is a local-only image such as the
simulated cluster's). The build context (rendered Dockerfile, overlays/) streams in as a tar on stdin;
no registry anywhere. Nodes that already hold the tag with the same image ID are left alone.
"""

from __future__ import annotations

import io
import tarfile
from typing import Callable

from sparkdeploy.errors import RemoteError
from sparkdeploy.remote import Conn, LocalConn, Target, stream, stream_bytes, stream_many


def image_id(conn: Conn, ref: str) -> str | None:
    res = conn.run(["docker", "image", "inspect", "-f", "{{.Id}}", ref], check=False, timeout=60)
    return res.stdout.strip() if res.ok and res.stdout.strip() else None


def context_tar(files: dict[str, bytes]) -> bytes:
    """A deterministic tar of the build context (sorted names, fixed mtimes), so identical inputs build once."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            data = files[name]
            info.size, info.mtime, info.mode = len(data), 0, 0o755 if name.endswith(".sh") else 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def build(conn: Conn, tag: str, context: dict[str, bytes], dockerfile: str = "Dockerfile", timeout: float = 3600) -> str:
    tar = context_tar(context)
    chunks = (tar[i:i + (1 << 20)] for i in range(0, len(tar), 1 << 20))
    rc, tail = stream_bytes(conn, ["docker", "build", "-q", "-t", tag, "-f", dockerfile, "-"], chunks, timeout=timeout)
    if rc != 0:
        raise RemoteError(f"docker build of {tag} failed: {tail.strip()[-1500:]}", node=conn.name)
    iid = image_id(conn, tag)
    if not iid:
        raise RemoteError(f"docker build said ok but {tag} is not there", node=conn.name)
    return iid


def ship(src: Conn, dst: Conn, tag: str, want_id: str) -> int:
    moved = stream(src, ["docker", "save", tag], dst, ["docker", "load", "-q"])
    got = image_id(dst, tag)
    if got != want_id:
        raise RemoteError(f"after docker load, {tag} has ID {got}, expected {want_id}", node=dst.name)
    return moved


def ship_many(src: Conn, dsts: list[Conn], tag: str, want_id: str) -> dict[str, int | Exception]:
    """One `docker save` fanned out to `docker load` on every destination; each verified by image ID."""
    res = stream_many(src, ["docker", "save", tag], dsts, ["docker", "load", "-q"])
    for d in dsts:
        if isinstance(res.get(d.name), int):
            got = image_id(d, tag)
            if got != want_id:
                res[d.name] = RemoteError(f"after docker load, {tag} has ID {got}, expected {want_id}", node=d.name)
    return res


def choose_builder(conns: dict[str, Conn], head: str, base: str, local_factory: Callable[[], Conn]) -> Conn:
    """The head if its engine has the base image or can pull it; else this machine if it has the base."""
    if image_id(conns[head], base):
        return conns[head]
    local = next((c for c in conns.values() if isinstance(c, LocalConn)), None) or local_factory()
    if image_id(local, base):
        return local
    if "@sha256:" in base or "/" in base.split(":")[0]:
        return conns[head]  # a registry reference: the head's docker build pulls it
    raise RemoteError(f"base image {base} is on neither the head nor this machine; load or build it first", node=head)


def overlay_files() -> dict[str, bytes]:
    """overlays/ as build-context entries (no tests, caches or build debris)."""
    from sparkdeploy import paths

    root = paths.overlays_dir()
    out = {}
    for f in sorted(root.rglob("*")):
        rel = f.relative_to(root)
        if f.is_file() and "__pycache__" not in rel.parts and not rel.parts[0].startswith(".") \
                and rel.parts[0] not in ("tests", "build", "dist") and not f.name.endswith(".pyc") \
                and not any(p.endswith(".egg-info") for p in rel.parts):
            out[f"overlays/{rel.as_posix()}"] = f.read_bytes()
    return out


def context(plan, files: dict[str, bytes]) -> dict[str, bytes]:
    """The serving image's build context: the rendered Dockerfile and overlays/ (the draft list is not in it:
    it reaches the engine through the read-only bind mount of the node's vocab directory)."""
    return {"Dockerfile": files["image/Dockerfile"], **overlay_files()}


def serving_context(inv) -> tuple[str, dict[str, bytes]]:
    """(tag, build context) of the serving image for an inventory, exactly as `up` builds it (the image does
    not depend on measured facts, so nominal ones are used)."""
    from sparkdeploy import plan as P
    from sparkdeploy import render

    chosen, _, _ = P._layout(inv, None)
    plan = P.plan(inv, {n.name: _roomy(n) for n in chosen}, overlays_digest=render.overlays_digest())
    return plan.image.tag, context(plan, render.render(plan))


def _roomy(node):
    """Nominal facts with plenty of memory: the image does not depend on memory, the plan must not refuse."""
    import dataclasses

    from sparkdeploy import facts as F

    f = F.nominal(node)
    return dataclasses.replace(f, mem_total_bytes=1 << 40, mem_available_bytes=1 << 40)


def local_conn() -> Conn:
    return LocalConn(Target("local", "localhost", local=True))
