"""Serving image present on every node: build once, deliver layers through the head's registry, verify by ID.

Build happens on the head when the head's engine has the base image (a real Spark with the pinned vLLM image
pulled); otherwise on whichever machine has it (this machine, when the base is a local-only image such as the
simulated cluster's). The build context (rendered Dockerfile, overlays/) streams in as a tar on stdin.

Delivery (sparkdeploy.registry): the head runs a Distribution registry on its data-plane address; the image is
pushed into it once (from the head's own engine: no wire; from this machine: through an SSH tunnel to the
head, the only path this machine has), and every node that lacks the tag pulls it from there over the data
plane. Push and pull move only the layers the other side lacks (compared by digest), so an overlays change
moves the overlay layers and never the base again; a node that lost its images pulls them all. Each pull is
verified by docker against the layer digests and then by image ID; a mismatch is refused. No registry outside
the cluster is involved.
"""

from __future__ import annotations

import io
import tarfile
import time
from typing import Callable

from sparkdeploy import registry
from sparkdeploy.errors import RemoteError
from sparkdeploy.connection import Conn, Target
from sparkdeploy.remote import LocalConn
from sparkdeploy.streams import stream_bytes


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


def push(conn: Conn, tag: str, registry_addr: str) -> None:
    """`docker push` of tag into the registry at registry_addr (only the layers it lacks are sent)."""
    ref = f"{registry_addr}/{tag}"
    conn.run(["docker", "tag", tag, ref])
    res = conn.run(["docker", "push", ref], check=False, timeout=3600)
    conn.run(["docker", "image", "rm", ref], check=False)  # untag only: the layers stay under `tag`
    if not res.ok:
        raise RemoteError(f"docker push of {tag} to {registry_addr} failed: {(res.stderr or res.stdout).strip()[-800:]}",
                          node=conn.name)


def push_through_tunnel(cl, local: Conn, tag: str, data_ip: str, attempts: int = 3) -> None:
    """Push from this machine into the head's registry through an SSH tunnel, over a fresh connection on a retry.

    A dropped SSH session (seen on a loaded host: OpenSSH ends the whole session on a packet for a channel it
    has freed) ends the push with EOF; the registry keeps the layers that arrived, so a retry sends the rest."""
    for attempt in range(1, attempts + 1):
        try:
            with registry.tunnel(cl.conn(cl.head), data_ip, registry.PORT) as port:
                push(local, tag, f"127.0.0.1:{port}")
            return
        except RemoteError as err:
            if attempt == attempts:
                raise
            cl.log(f"{cl.head}: push through the SSH tunnel failed ({str(err)[-160:]}); retry {attempt} of "
                   f"{attempts - 1}")


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
    got = image_id(conn, tag)
    if got != want_id:
        conn.run(["docker", "image", "rm", tag], check=False)
        raise RemoteError(f"refused {tag} from the registry at {registry_addr}: image ID {got}, expected {want_id}",
                          node=conn.name)


def rx_bytes(conn: Conn) -> int:
    """Bytes received so far on the node's network interfaces (loopback and container bridges excluded):
    what any delivery, of any protocol, cost the node."""
    res = conn.run(["sh", "-c", "for d in /sys/class/net/*; do n=${d##*/}; case $n in lo|docker*|veth*|br-*) ;; "
                                "*) cat $d/statistics/rx_bytes;; esac; done"], check=False)
    return sum(int(x) for x in res.stdout.split() if x.isdigit())


def converge(cl, out: list) -> str | None:
    """The image step of `up` for a `Cluster` `cl`: every node of the plan holds plan.image.tag, and so does the
    head's registry (the source of the next delivery's missing layers). Returns the image ID (None: dry run
    with nothing built yet). Sets cl.image_received: bytes each node received while the image was delivered,
    and cl.image_seconds: the step's wall time."""
    from sparkdeploy.steps.base import CHANGED, FAILED, OK, WOULD, Outcome, StepFailed

    tag, head, names = cl.plan.image.tag, cl.head, cl.names
    data_ip = cl.plan.head.data_ip
    addr = registry.address(data_ip)
    cl.image_received, started = {}, time.monotonic()
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
    hc = cl.conn(head)
    in_registry = want is not None and registry.holds(hc, tag, want)
    lacking = [n for n in names if ids.get(n) is None or ids.get(n) != want]
    if not lacking and in_registry:
        out += [Outcome("image", n, OK, f"has {want[:19]}") for n in names]
        return want
    push_what = ("push from its engine into its registry (no wire)" if source == head else
                 f"push from {source} into the registry at {addr} (data plane)" if source else
                 f"push from this machine through an SSH tunnel to {head} (management; layers {head}'s registry lacks)")
    if cl.opts.dry_run:
        acts = {n: [f"pull {tag} from {addr} (data plane, {cl.plan.node(n).data_ip})"] for n in lacking}
        head_acts = ([] if want else [f"build {tag}"]) + ([] if in_registry else [f"{push_what}: {tag}"])
        acts[head] = head_acts + acts.get(head, [])
        out += [Outcome("image", n, WOULD if acts.get(n) else OK, "", acts.get(n, [])) for n in names]
        return want
    t0 = time.monotonic()
    if want is None:
        builder = choose_builder(cl.pool.conns, head, cl.plan.image.base, local_conn)
        cl.log(f"{builder.name}: building {tag} (FROM {cl.plan.image.base})")
        want = build(builder, tag, cl.image_context())
        source, local = (builder.name, None) if builder.name in names else (None, builder)
        lacking = [n for n in lacking if n != source]
        out.append(Outcome("image", source or head, CHANGED, f"built {want[:19]} on {builder.name}", [f"build {tag}"],
                           time.monotonic() - t0))
    ca, _ = registry.ensure(hc, data_ip, cl.log)
    trusted = cl.pool.map(lambda c: registry.trust(c, addr, ca), names)
    before = cl.pool.map(rx_bytes, names)
    t1 = time.monotonic()
    if not registry.holds(hc, tag, want):
        cl.log(f"{head}: registry {addr}: {push_what}: {tag}")
        if source:
            push(cl.conn(source), tag, addr)
        else:
            push_through_tunnel(cl, local, tag, data_ip)
    if lacking:
        cl.log(f"{', '.join(lacking)}: pulling {tag} from {addr} (only the layers each lacks)")
    pulled = cl.pool.map(lambda c: pull(c, tag, addr, want), lacking)
    dt = time.monotonic() - t1
    after = cl.pool.map(rx_bytes, names)
    for n in names:
        if isinstance(before.get(n), int) and isinstance(after.get(n), int):
            cl.image_received[n] = after[n] - before[n]
    for n in names:
        got = cl.image_received.get(n, 0)
        r = pulled.get(n) or trusted.get(n)
        if isinstance(r, Exception):
            out.append(Outcome("image", n, FAILED, str(r)))
        elif n in pulled:
            out.append(Outcome("image", n, CHANGED, f"pulled from {addr}: {got / 1e6:.1f} MB received in {dt:.1f} s",
                               [f"pull {tag} from {addr}"], dt))
        elif not any(o.step == "image" and o.node == n for o in out):
            out.append(Outcome("image", n, OK, f"has {want[:19]}" + (f"; {got / 1e6:.1f} MB received" if got > 1e6 else "")))
    cl.image_seconds = time.monotonic() - started
    if any(o.status == FAILED for o in out if o.step == "image"):
        raise StepFailed("image", [o for o in out if o.step == "image"])
    return want


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
