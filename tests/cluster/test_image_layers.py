"""The image step on the simulated pair: layers through the head's registry, not whole images.

One deployed cluster for the module, tests in file order: a list-only change ships nothing; an overlays-only
change moves less than twice the changed layers to each node; a corrupted layer in the head's registry is
refused with a clear message; the node that lost its images then gets the full image and comes up healthy.
Overlays are a private copy (SPARKDEPLOY_ROOT) so the overlays change never touches the checkout.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
import yaml

from sparkdeploy.model import inventory as I
from sparkdeploy.node import layout
from sparkdeploy.ops import registry
from sparkdeploy.steps import deploy as D
from sparkdeploy.steps import image as img
from sparkdeploy.steps.deploy import Context, Options

pytestmark = pytest.mark.cluster

READY = 600.0


def _inventory(base: Path, tmp: Path, name: str, vocab: Path | None = None) -> Path:
    """The sim inventory with a reserve that fits a small VM and, optionally, another draft list."""
    data = yaml.safe_load(base.read_text())
    data["memory"] = {"reserve_gib": 2.0}
    if vocab is not None:
        data["vocab"] = str(vocab)
    out = tmp / f"{name}.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


LAST_UP: dict = {}  # the last up's log lines and tunnel tries, for the byte assertions' messages


def up(inv: Path, dry_run: bool = False) -> tuple[object, dict[str, int], str]:
    """An in-process `up`: (result, image bytes each node was sent in the image step, image tag)."""
    lines: list[str] = []
    c = Context(I.load(inv), Options(dry_run=dry_run, ready_timeout=READY, log=lines.append))
    try:
        res = D.up(c)
        LAST_UP.update(log=lines, tries=list(c.image_push_tries))
        return res, dict(c.image_received), c.plan.image.tag if c.plan else ""
    finally:
        c.close()


def blob_path(digest: str) -> str:
    hexd = digest.split(":", 1)[1]
    return f"{registry.STORAGE_DIR}/docker/registry/v2/blobs/sha256/{hexd[:2]}/{hexd}/data"


@pytest.fixture(scope="module")
def layered(sim_cluster, sim_engine_image, tmp_path_factory):
    """Deployed once on a private data root (overlays copied, the rest linked to the checkout)."""
    from sparkdeploy import paths

    tmp = tmp_path_factory.mktemp("layers")
    root = tmp / "root"
    root.mkdir()
    for entry in paths.repo_root().iterdir():
        if entry.name == "overlays":
            shutil.copytree(entry, root / "overlays", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            (root / entry.name).symlink_to(entry)
    saved = os.environ.get("SPARKDEPLOY_ROOT")
    os.environ["SPARKDEPLOY_ROOT"] = str(root)
    try:  # put the root back even when the deploy fails: later modules on this worker render from it
        inv = _inventory(sim_cluster.inventory, tmp, "base")
        _, _, tag = up(inv, dry_run=True)
        if not _in_registry(inv, tag):
            _lose_images(sim_cluster, sim_cluster.worker)
        res, _, tag = up(inv)
        assert res.healthy, res.message
        assert _in_registry(inv, tag), f"the head's registry does not hold {tag}"
        yield {"inv": inv, "tmp": tmp, "root": root, "tag": tag}
    finally:
        if saved is None:
            os.environ.pop("SPARKDEPLOY_ROOT", None)
        else:
            os.environ["SPARKDEPLOY_ROOT"] = saved


def _in_registry(inv: Path, tag: str) -> bool:
    """Whether the head's registry holds `tag`. The tests below need the base image to have reached the worker
    through it: `up` sends an image only to a node that lacks it, and the session pair starts with every node
    holding the serving image loaded from the host, whose layers a pull cannot recognize (run30a: the worker of a
    pair that had sent nothing pulled the whole image for an overlays-only change)."""
    c = Context(I.load(inv), Options())
    try:
        c.connect([])
        return bool(registry.layer_sizes(c.conn(c.head), tag))
    finally:
        c.close()


def test_list_only_change_builds_and_ships_nothing(layered, sim_cluster):
    vocab = Path(yaml.safe_load(layered["inv"].read_text())["vocab"])
    shorter = layered["tmp"] / "list-minus-4.txt"
    shorter.write_text("".join(vocab.read_text().splitlines(keepends=True)[:-4]))
    inv = _inventory(sim_cluster.inventory, layered["tmp"], "list-changed", shorter)
    dry, _, tag = up(inv, dry_run=True)
    assert tag == layered["tag"]
    image = [o for o in dry.outcomes if o.step == "image"]
    assert image and all(o.status == "ok" and not o.actions for o in image), [o.to_dict() for o in image]
    res, received, _ = up(inv)
    assert res.healthy, res.message
    assert received == {}  # the image step delivered nothing to any node


def test_overlays_only_change_moves_less_than_twice_the_changed_layers(layered, sim_cluster):
    with open(layered["root"] / "overlays" / "spark_overlays" / "__init__.py", "a") as f:
        f.write(f"# test_image_layers: an overlays-only change {time.time()}\n")
    inv = layered["inv"]
    old_tag = layered["tag"]
    res, received, tag = up(inv)
    assert res.healthy, res.message
    assert tag != old_tag
    head = sim_cluster.head.name
    c = Context(I.load(inv), Options())
    try:
        c.connect([])
        old, new = registry.layer_sizes(c.conn(head), old_tag), registry.layer_sizes(c.conn(head), tag)
    finally:
        c.close()
    changed = sum(size for digest, size in new.items() if digest not in old)
    assert 0 < changed < 0.1 * sum(new.values()), (changed, sum(new.values()))  # the base is not among them
    head, worker, tries = sim_cluster.head.name, sim_cluster.worker.name, LAST_UP["tries"]
    assert received[head] == sum(tries), (received, tries)  # the head: what came through the tunnel, every try
    # A push whose SSH session dropped (a loaded host) is tried again and re-sends what had not landed: the try
    # that succeeded is the measure then, and the retry is in the log.
    one_try = {head: tries[-1] if tries else 0, worker: received[worker]}
    for node, got in one_try.items():
        assert got < 2 * changed, (node, got, changed, tries, [l for l in LAST_UP["log"] if "push" in l])
    if len(tries) > 1:
        print(f"\nthe push was tried {len(tries)} times: {tries} bytes; "
              + "; ".join(l for l in LAST_UP["log"] if "retry" in l))
    assert received[worker] >= changed, (received, changed)  # it pulled every changed layer
    layered["tag"] = tag


def _lose_images(sim, node) -> None:
    """The node loses every image and layer: its containers go first (a stopped one, from any earlier module or
    check, keeps its image's layers on disk after `image rm -f`, and a later pull then needs almost nothing)."""
    sim.ssh(node, f"systemctl stop {layout.PLAIN.unit}; docker ps -aq | xargs -r docker rm -f; "
                  "docker image prune -af", timeout=300, check=True)


def test_corrupted_layer_is_refused(layered, sim_cluster):
    sim, head, worker = sim_cluster, sim_cluster.head, sim_cluster.worker
    _lose_images(sim, worker)
    c = Context(I.load(layered["inv"]), Options())
    try:
        c.connect([])
        sizes = registry.layer_sizes(c.conn(head.name), layered["tag"])
    finally:
        c.close()
    digest = min(sizes, key=sizes.get)  # the smallest layer: fails fast, the worker lacks every layer
    path = blob_path(digest)
    sim.ssh(head, f"cp {path} /root/blob.saved && printf 'corrupt' | dd of={path} bs=1 seek=16 conv=notrunc",
            check=True)
    try:
        res, _, _ = up(layered["inv"])
    finally:
        sim.ssh(head, f"cp /root/blob.saved {path} && rm /root/blob.saved", check=True)
    assert not res.healthy
    failed = [o for o in res.outcomes if o.step == "image" and o.status == "failed"]
    assert [o.node for o in failed] == [worker.name], res.message
    assert "refused" in failed[0].detail and "docker pull failed" in failed[0].detail, failed[0].detail
    assert sim.ssh(worker, f"docker image inspect {layered['tag']}").rc != 0  # nothing half-delivered is tagged


def test_node_that_lost_its_images_gets_the_full_image_and_comes_up_healthy(layered, sim_cluster):
    worker = sim_cluster.worker
    if sim_cluster.ssh(worker, f"docker image inspect {layered['tag']}").rc == 0:
        _lose_images(sim_cluster, worker)
    res, received, tag = up(layered["inv"])
    assert res.healthy, res.message
    c = Context(I.load(layered["inv"]), Options())
    try:
        c.connect([])
        total = sum(registry.layer_sizes(c.conn(sim_cluster.head.name), tag).values())
        assert img.image_id(c.conn(worker.name), tag) == img.image_id(c.conn(sim_cluster.head.name), tag)
    finally:
        c.close()
    assert received[worker.name] >= 0.95 * total, (received, total)


def test_two_builds_of_one_tag_at_once_make_one_image_id(sim_node_image):
    """CI's two workers once built the serving image in the same second on this machine: two image IDs for one
    tag, so one worker pushed the other's build and its nodes refused it. Under the build lock the second build
    waits and takes every step from the first one's cache (without it, the IDs differ: the created times do)."""
    import uuid

    from sparkdeploy.fanout import each

    tag = f"sparkdeploy-test-build-lock:{uuid.uuid4().hex[:12]}"
    files = {"Dockerfile": f"FROM {sim_node_image}\nRUN echo {uuid.uuid4().hex} > /built\n".encode()}
    conn = img.local_conn()
    try:
        first, second = each([1, 2], lambda _: img.build(conn, tag, files, timeout=300))
        assert first == second == img.image_id(conn, tag)
    finally:
        conn.run(["docker", "image", "rm", "-f", tag], check=False, timeout=120)
