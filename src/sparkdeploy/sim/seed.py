"""Nodes that start out holding images, as a Spark holds the vLLM image its owner pulled before the kit came.

A seed is a Docker volume holding a Docker data directory into which the images were loaded once (a throwaway
dockerd in a container of the node image). A new node's own volume is filled from it before the node first
boots: the layer directories (`overlay2/`) as hard links, everything else copied, because dockerd keeps
databases it locks and rewrites in place beside them. Seeding a node with a 2.3 GB image takes about a second and
writes no layer bytes; loading it through `docker load` over SSH takes a minute per pair, and pushing it through
the head's registry several. A node never changes a layer directory in place (containers write to their own
upper directory; an image removed is unlinked), so nodes seeded from one volume stay independent.

Seeds are kept between runs, named by the image IDs they hold, and finished only when MARK is written.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import subprocess
import time
from pathlib import Path
from typing import Sequence

from sparkdeploy import poll, timing
from sparkdeploy.errors import SimError
from sparkdeploy.paths import cache_dir
from sparkdeploy.sim import containers, host_docker
from sparkdeploy.sim._proc import Reporter, file_lock

VOLUME_PREFIX = "sparkdeploy-sim-seed-"
MARK = ".sparkdeploy-seed.json"  # written last: a seed volume without it is unfinished and is made again
LAYERS = "overlay2"  # hard-linked; every other entry of the data directory is copied


def volume_name(image_ids: Sequence[str]) -> str:
    return VOLUME_PREFIX + hashlib.sha256(",".join(sorted(set(image_ids))).encode()).hexdigest()[:12]


def _mountpoint(volume: str) -> Path | None:
    info = host_docker.inspect_or_none(host_docker.api().inspect_volume, volume, f"docker volume inspect {volume}")
    return Path(info["Mountpoint"]) if info else None


def ensure(ids: dict[str, str], node_image: str, reporter: Reporter) -> str:
    """The seed volume holding the host images `ids` ({ref: image ID}; made once: one `docker load` per image);
    its name. It is named by the IDs alone: a node tags any other name of them when it boots (`tag`)."""
    volume = volume_name(list(ids.values()))
    with file_lock(cache_dir() / "locks" / "sim-seed.lock"):
        where = _mountpoint(volume)
        if where is not None and (where / MARK).is_file():
            return volume
        with reporter.phase("seed volume", f"{volume}: {', '.join(ids)}") as info, \
                timing.span("image seed", f"{len(ids)} image(s)"):
            t0 = time.monotonic()
            containers.remove_volume(volume, f"docker volume rm {volume}")
            host_docker.call(f"docker volume create {volume}", host_docker.api().create_volume, volume,
                             labels={containers.CLUSTER_LABEL: "seed"})
            _load(volume, ids, node_image)
            where = _mountpoint(volume)
            assert where is not None
            (where / MARK).write_text(json.dumps({"images": ids}, indent=1) + "\n")
            _prune_others(volume, reporter)
            info["detail"] = f"{volume} in {time.monotonic() - t0:.1f} s"
    return volume


def _load(volume: str, ids: dict[str, str], node_image: str) -> None:
    """Run dockerd alone (no systemd) in a container of the node image over the volume, stream each image's save
    from this host's engine into its `docker load`, then stop it cleanly."""
    api = host_docker.api()
    name = f"{volume}-loader"
    containers.remove_container(name, f"docker rm {name}")
    script = "echo '{}' > /tmp/daemon.json && exec dockerd --config-file /tmp/daemon.json --storage-driver overlay2"
    created = host_docker.call(f"docker run {name}", api.create_container, node_image, name=name,
                               entrypoint=["sh", "-c", script], stop_signal="SIGTERM",  # not systemd's
                               labels={containers.CLUSTER_LABEL: "seed"}, detach=True,
                               host_config=containers.host_config(volume, "none", node=False))
    try:
        host_docker.call(f"docker start {name}", api.start, created["Id"])

        def answering() -> None:
            if host_docker.exec_run(name, ["docker", "info"], what=f"{name}: docker info").rc != 0:
                raise poll.NotYet("dockerd not answering")

        poll.until(answering, timeout=120, interval=0.5)
        for ref in {image_id: ref for ref, image_id in ids.items()}.values():  # one load per image
            save = host_docker.call(f"docker save {ref}", host_docker.api(host_docker.STREAM_TIMEOUT).get_image,
                                    ref, chunk_size=host_docker.CHUNK)
            done = host_docker.exec_fed(name, ["docker", "load", "-q"], save, what=f"{name}: docker load {ref}")
            if done.rc != 0:
                raise SimError(f"seed {volume}: docker load of {ref} failed: {done.out.strip()[-400:]}")
        host_docker.call(f"docker stop {name}", api.stop, name, timeout=60)
    except poll.TimedOut as out:
        raise SimError(f"seed {volume}: the loader's dockerd did not answer ({out.last}); see `docker logs "
                       f"{name}`") from None
    finally:
        containers.remove_container(name, f"docker rm {name}")


def _prune_others(keep: str, reporter: Reporter) -> None:
    """Remove older seeds (the nodes made from them keep their hard-linked layers)."""
    for vol in host_docker.call("docker volume ls", host_docker.api().volumes).get("Volumes") or ():
        name = vol["Name"]
        if name.startswith(VOLUME_PREFIX) and name != keep:
            try:
                host_docker.api().remove_volume(name, force=True)
                reporter.note(f"removed the older seed {name}")
            except host_docker.engine_errors():
                pass  # in use by a loader of another run: left for the next prune


def plant(seed: str, volume: str) -> bool:
    """Fill a node's Docker volume from the seed, when the volume is new or empty (a kept volume is the node's
    own and is never touched). True when it was filled."""
    src = _mountpoint(seed)
    if src is None or not (src / MARK).is_file():
        raise SimError(f"seed volume {seed} is missing or unfinished; run `sparkdeploy sim up` again to make it")
    dst = _mountpoint(volume)
    if dst is None:
        host_docker.call(f"docker volume create {volume}", host_docker.api().create_volume, volume)
        dst = _mountpoint(volume)
        assert dst is not None
    if any(dst.iterdir()):
        return False
    for entry in sorted(src.iterdir()):
        if entry.name == MARK:
            continue
        argv = ["cp", "-a", "--link", str(entry), str(dst)] if entry.name == LAYERS else \
            ["cp", "-a", str(entry), str(dst)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            containers.remove_volume(volume, f"docker volume rm {volume}")
            raise SimError(f"seeding {volume} from {seed} failed ({' '.join(argv[:3])} {entry.name}): "
                           f"{done.stderr.strip()[-300:]}")
    return True


def tag(node, ids: dict[str, str]) -> None:
    """Give a seeded node's images the names asked for ({ref: image ID}): a seed made for other names of the
    same images holds them under those."""
    script = " && ".join(f"docker tag {image_id} {shlex.quote(ref)}" for ref, image_id in ids.items())
    done = containers.exec_in(node, script, timeout=60)
    if done.rc != 0:
        raise SimError(f"{node.name}: tagging its seeded images failed: {(done.err or done.out).strip()[-300:]}")
