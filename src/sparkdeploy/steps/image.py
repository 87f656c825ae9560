"""Serving image present on every node: build once, deliver layers through the head's registry, verify by ID.

Build happens on the head when the head's engine has the base image (a real Spark with the pinned vLLM image
pulled); otherwise on whichever machine has it (this machine, when the base is a local-only image such as the
simulated cluster's). The build context (rendered Dockerfile, overlays/) streams in as a tar on stdin.

Delivery (sparkdeploy.ops.registry): the head runs a Distribution registry on its data-plane address; the image is
pushed into it once (from the head's own engine: no wire; from this machine: through an SSH tunnel to the
head, the only path this machine has), and every node that lacks the tag pulls it from there over the data
plane. Push and pull move only the layers the other side lacks (compared by digest), so an overlays change
moves the overlay layers and never the base again; a node that lost its images pulls them all. Each pull is
verified by docker against the layer digests and then by image ID; a mismatch is refused. No registry outside
the cluster is involved.
"""

from __future__ import annotations

import hashlib
import io
import shlex
import tarfile
import time
from typing import Callable

from sparkdeploy.errors import RemoteError
from sparkdeploy.node.layout import build_lock
from sparkdeploy.ops import registry
from sparkdeploy.remote.connection import Conn, Target, effect, held, narrate, recording
from sparkdeploy.remote.ssh import LocalConn
from sparkdeploy.remote.streams import stream_bytes


def image_id(conn: Conn, ref: str, *, made_as: str | None = None) -> str | None:
    """The ID of image `ref` on the node, None when it has none. `made_as`: `ref` was put there by this run
    (a pull), so a dry run, which pulled nothing, answers this instead."""
    res = conn.query(["docker", "image", "inspect", "-f", "{{.Id}}", ref], check=False, timeout=60, answer=made_as)
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


def build(conn: Conn, tag: str, context: dict[str, bytes], dockerfile: str = "Dockerfile",
          timeout: float = 3600) -> str:
    """docker build from the context streamed in as a tar; the image ID (a dry run answers the placeholder
    `<image id of TAG built on NODE>`). Two builds of one tag at once on one machine (two `up`s of services
    that share an image; CI's two workers) would each make their own image ID, and the tag would name only the
    last: the other would push an image it did not build and refuse it on its nodes. Under `flock` the second
    waits, then finds every step in the first one's cache, so both get the same ID."""
    tar = context_tar(context)
    argv = ["flock", build_lock(tag), "docker", "build", "-q", "-t", tag, "-f", dockerfile, "-"]
    return effect(f"{conn.name}: run {shlex.join(argv)} <build context {len(tar)} bytes "
                  f"sha256:{hashlib.sha256(tar).hexdigest()[:12]}>",
                  lambda: _build(conn, tag, argv, tar, timeout), f"<image id of {tag} built on {conn.name}>")


def _build(conn: Conn, tag: str, argv: list[str], tar: bytes, timeout: float) -> str:
    chunks = (tar[i:i + (1 << 20)] for i in range(0, len(tar), 1 << 20))
    rc, tail = stream_bytes(conn, argv, chunks, timeout=timeout)
    if rc != 0:
        raise RemoteError(f"docker build of {tag} failed: {tail.strip()[-1500:]}", node=conn.name)
    iid = image_id(conn, tag)
    if not iid:
        raise RemoteError(f"docker build said ok but {tag} is not there", node=conn.name)
    return iid


def push(conn: Conn, tag: str, registry_addr: str) -> None:
    """`docker push` of tag into the registry at registry_addr (only the layers it lacks are sent)."""
    ref = f"{registry_addr}/{tag}"
    conn.run(["docker", "tag", tag, ref])
    res = conn.run(["docker", "push", ref], check=False, timeout=3600)
    conn.run(["docker", "image", "rm", ref], check=False)  # untag only: the layers stay under `tag`
    if not res.ok:
        raise RemoteError(f"docker push of {tag} to {registry_addr} failed: {(res.stderr or res.stdout).strip()[-800:]}",
                          node=conn.name)


def push_through_tunnel(cl, local: Conn, tag: str, data_ip: str, attempts: int = 3) -> list[int]:
    """Push from this machine into the head's registry through an SSH tunnel, over a fresh connection on a retry.
    Returns the bytes sent through the tunnel by each try (the last one succeeded).

    A dropped SSH session (seen on a loaded host: OpenSSH ends the whole session on a packet for a channel it
    has freed) ends the push with EOF; the registry keeps the layers whose upload completed, so a retry sends
    the rest (a layer cut mid-upload is sent again)."""
    tries: list[int] = []
    for attempt in range(1, attempts + 1):
        try:
            with held(lambda: registry.tunnel(cl.conn(cl.head), data_ip, registry.PORT),
                      registry.Tunnel(f"<tunnel to {data_ip}:{registry.PORT}>")) as opened:
                try:
                    push(local, tag, f"127.0.0.1:{opened.port}")
                finally:
                    tries.append(opened.sent)
            return tries
        except RemoteError as err:
            if attempt == attempts:
                raise
            cl.log(f"{cl.head}: push through the SSH tunnel failed after {tries[-1]} bytes ({str(err)[-160:]}); "
                   f"retry {attempt} of {attempts - 1}")


def pull(conn: Conn, tag: str, registry_addr: str, want_id: str) -> None:
    """`docker pull` of tag from the head's registry (docker checks each layer against its digest), then the
    image ID; a mismatch is refused and the wrong image removed, so no engine starts on it."""
    ref = f"{registry_addr}/{tag}"
    res = conn.run(["docker", "pull", "-q", ref], check=False, timeout=3600)
    if not res.ok:
        raise RemoteError(f"refused {tag} from the registry at {registry_addr}: docker pull failed "
                          f"({(res.stderr or res.stdout).strip()[-600:]}). A layer that does not match its digest "
                          f"is never used; if the head's store under {registry.STORAGE_DIR} is damaged, remove the "
                          "blob named above there and re-run `up` (it is pushed again)", node=conn.name)
    conn.run(["docker", "tag", ref, tag])
    conn.run(["docker", "image", "rm", ref], check=False)
    got = image_id(conn, tag, made_as=want_id)
    if got != want_id:
        conn.run(["docker", "image", "rm", tag], check=False)
        raise RemoteError(f"refused {tag} from the registry at {registry_addr}: image ID {got}, expected {want_id}",
                          node=conn.name)


def converge(cl, out: list) -> str | None:
    """The image step of `up` for a `Context` `cl`: every node of the plan holds plan.image.tag; when a node
    lacks it, the head's registry is made to hold it first (the source of that and every later delivery's
    missing layers). Nodes that all hold the tag already (pulled by hand, or a re-run) push nothing: moving
    every layer into the registry then would only pay now for a delivery that may never come. Returns the image
    ID (a dry run that would build answers its placeholder). A dry run goes the same way under
    `connection.recording(dry=True)`, so each node's outcome lists the exact docker commands and registry files
    the real step makes. Sets cl.image_received:
    the image bytes each node was sent (`_deliver`), and cl.image_seconds: the step's wall time."""
    from sparkdeploy.steps.base import CHANGED, FAILED, OK, WOULD, Outcome, StepFailed

    tag, head, names = cl.plan.image.tag, cl.head, cl.names
    cl.image_received, cl.image_push_tries, started = {}, [], time.monotonic()
    ids = cl.pool.map(lambda c: image_id(c, tag), names)
    failed = [Outcome("image", n, FAILED, str(r)) for n, r in ids.items() if isinstance(r, Exception)]
    if failed:
        raise StepFailed("image", failed)
    have = {n: i for n, i in ids.items() if i}
    source = head if head in have else next(iter(have), None)  # a node that already holds the tag
    want = have.get(source) if source else None
    local = None
    if want is None:  # built earlier on this machine (a previous run, or by hand from `sparkdeploy render`)
        local = next((c for c in cl.pool.conns.values() if isinstance(c, LocalConn)), None) or local_conn()
        want = image_id(local, tag)
    lacking = [n for n in names if ids.get(n) is None or ids.get(n) != want]
    if not lacking:
        out += [Outcome("image", n, OK, f"has {want[:19]}") for n in names]
        return want
    with recording(dry=cl.opts.dry_run) as made:
        try:
            want, done = _deliver(cl, want, source, local, lacking)
        finally:
            effects = list(made)
    cl.image_seconds = time.monotonic() - started
    by_node = {n: [e for e in effects if e.startswith(f"{n}: ")] for n in names}
    by_node[head] = [e for e in effects if not any(e.startswith(f"{n}: ") for n in names)] + by_node[head]
    mine = []
    for n in names:
        r = done.get(n)
        if isinstance(r, Exception):
            mine.append(Outcome("image", n, FAILED, str(r), [], 0.0, by_node[n]))
        elif r:
            mine.append(Outcome("image", n, WOULD if cl.opts.dry_run else CHANGED, r[0], r[1:], 0.0, by_node[n]))
        else:
            got = cl.image_received.get(n, 0)
            mine.append(Outcome("image", n, OK, f"has {(want or '')[:19]}"
                                + (f"; {got / 1e6:.1f} MB received" if got > 1e6 else "")))
    out += mine
    if any(o.status == FAILED for o in mine):
        raise StepFailed("image", mine)
    return want


def _deliver(cl, want: str | None, source: str | None, local: Conn | None,
             lacking: list[str]) -> tuple[str, dict[str, object]]:
    """Build if nobody has the image, make the head's registry hold it, pull it where it lacks. Returns the image
    ID and {node: [detail, action...] or the exception that node met}."""
    tag, head, names = cl.plan.image.tag, cl.head, cl.names
    data_ip = cl.plan.head.data_ip
    addr = registry.address(data_ip)
    done: dict[str, object] = {}
    if want is None:
        t0 = time.monotonic()
        builder = choose_builder(cl.pool.conns, head, cl.plan.image.base, local_conn)
        narrate(cl.log, f"{builder.name}: building {tag} (FROM {cl.plan.image.base})")
        want = build(builder, tag, context(cl.plan, cl.files))
        source, local = (builder.name, None) if builder.name in names else (None, builder)
        lacking = [n for n in lacking if n != source]
        done[source or head] = [f"built {want[:19]} on {builder.name} in {time.monotonic() - t0:.1f} s",
                                f"build {tag}"]
    hc = cl.conn(head)
    ca, _ = registry.ensure(hc, data_ip, cl.log)
    trusted = cl.pool.map(lambda c: registry.trust(c, addr, ca), names)
    done.update({n: r for n, r in trusted.items() if isinstance(r, Exception)})
    cursor = registry.log_cursor(hc)
    tries, t1 = [], time.monotonic()
    if not registry.holds(hc, tag, want):
        how = ("from its engine into its registry (no wire)" if source == head else
               f"from {source} into the registry at {addr} (data plane)" if source else
               f"from this machine through an SSH tunnel to {head} (management; only the layers {head}'s "
               "registry lacks)")
        narrate(cl.log, f"{head}: registry {addr}: push {how}: {tag}")
        if source:
            push(cl.conn(source), tag, addr)
        else:
            tries = push_through_tunnel(cl, local, tag, data_ip)
        done.setdefault(head, [f"pushed {how}"])
        done[head] = done[head] + [f"push {tag} into {addr}"]
    if lacking:
        narrate(cl.log, f"{', '.join(lacking)}: pulling {tag} from {addr} (only the layers each lacks)")
    pulled = cl.pool.map(lambda c: pull(c, tag, addr, want), lacking)
    dt = time.monotonic() - t1
    # cl.conn, not hc: a tunnel that dropped the head's SSH session leaves hc dead (a dry run reads what the
    # registry sent since the cursor: nothing of its own)
    cl.image_received = image_bytes_sent(cl, registry.bytes_sent(cl.conn(head), cursor), sum(tries))
    cl.image_push_tries = tries  # bytes per try through the tunnel: a retry after a dropped session shows here
    for n, r in pulled.items():
        if isinstance(r, Exception):
            done[n] = r
        else:
            got = cl.image_received.get(n, 0)
            pull_line = [f"pull {tag} from {addr} (data plane, {cl.plan.node(n).data_ip})"]
            done[n] = (done[n] + pull_line if isinstance(done.get(n), list) else
                       [f"pulled from {addr}: {got / 1e6:.1f} MB received in {dt:.1f} s"] + pull_line)
    return want, done


def image_bytes_sent(cl, by_address: dict[str, int], tunneled: int) -> dict[str, int]:
    """{node: image bytes it was sent}: what the head's registry logged sending to the node's addresses (the
    head's own pulls and pushes stay on the host), and for the head what came through the SSH tunnel. Counted
    at the registry and the tunnel, not on the node's links, where serving traffic and SSH share the count;
    TLS, SSH and TCP framing add a few percent on the wire."""
    def to(n: str) -> int:
        node = cl.plan.node(n)
        return sum(b for addr, b in by_address.items() if addr in (node.data_ip, node.ssh.host))

    return {n: tunneled if n == cl.head else to(n) for n in cl.names}


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
    from sparkdeploy.plan import render

    chosen, _, _ = P.node_layout(inv, None)
    plan = P.plan(inv, {n.name: _roomy(n) for n in chosen}, overlays_digest=render.overlays_digest())
    return plan.image.tag, context(plan, render.render(plan))


def _roomy(node):
    """Nominal facts with plenty of memory: the image does not depend on memory, the plan must not refuse."""
    import dataclasses

    from sparkdeploy.node import facts as F

    f = F.nominal(node)
    return dataclasses.replace(f, mem_total_bytes=1 << 40, mem_available_bytes=1 << 40)


def local_conn() -> Conn:
    return LocalConn(Target("local", "localhost", local=True))
