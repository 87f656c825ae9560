"""The serving image's identity: runtime data (the draft list) is not image content."""

from __future__ import annotations

from pathlib import Path

import yaml

from sparkdeploy import plan
from sparkdeploy.model import inventory
from sparkdeploy.plan import render
from sparkdeploy.steps import image as img

FIXTURES = Path(__file__).parent / "fixtures"


def _sim_with_list(tmp_path: Path, lines: int) -> inventory.Inventory:
    data = yaml.safe_load((FIXTURES / "inventory.sim.yaml").read_text())
    vocab = tmp_path / f"list-{lines}.txt"
    vocab.write_text("".join(f"{i}\n" for i in range(lines)))
    data["vocab"] = str(vocab)
    path = tmp_path / f"inventory-{lines}.yaml"
    path.write_text(yaml.safe_dump(data))
    return inventory.load(path)


def test_a_list_change_keeps_the_image_and_its_build_context(tmp_path):
    a, b = _sim_with_list(tmp_path, 1000), _sim_with_list(tmp_path, 1004)
    pa, pb = plan.plan(a, overlays_digest="x"), plan.plan(b, overlays_digest="x")
    assert pa.image.tag == pb.image.tag and pa.image.labels == pb.image.labels
    assert img.context(pa, render.render(pa)) == img.context(pb, render.render(pb))
    assert not any(k.startswith("vocab/") for k in img.context(pa, render.render(pa)))


def test_an_overlays_change_makes_a_new_image(tmp_path):
    inv = _sim_with_list(tmp_path, 1000)
    assert plan.plan(inv, overlays_digest="x").image.tag != plan.plan(inv, overlays_digest="y").image.tag


def test_registry_certificate_is_for_the_data_plane_address_only():
    from sparkdeploy.ops import registry

    tls = registry.make_tls("10.0.0.1")
    assert registry.cert_serves(tls[registry.CERT_FILE], tls[registry.CA_FILE], "10.0.0.1")
    assert not registry.cert_serves(tls[registry.CERT_FILE], tls[registry.CA_FILE], "10.0.0.2")
    other = registry.make_tls("10.0.0.1")
    assert not registry.cert_serves(tls[registry.CERT_FILE], other[registry.CA_FILE], "10.0.0.1")  # foreign CA
    assert b"addr: 10.0.0.1:5443" in registry.config_text("10.0.0.1")


def test_plan_says_which_path_each_image_and_checkpoint_transfer_takes():
    p = plan.plan(inventory.load(FIXTURES.parents[2] / "inventory.yaml"), overlays_digest="x")
    head, worker = p.nodes
    assert p.image.registry == f"{head.data_ip}:5443"
    pulls = [t for t in p.image.transfers if t.startswith(f"{head.name} -> {worker.name}")]
    assert len(pulls) == 1 and f"over data plane {worker.data_ip} ({worker.netdev})" in pulls[0]
    assert "SSH tunnel" in p.image.transfers[0]
    fetch, sync = p.weights_transfers  # and the checkpoint's: fetched once on the head, synced over the data plane
    assert fetch.startswith("fetch:") and head.name in fetch
    assert sync.startswith(f"{head.name} -> {worker.name}") and f"over data plane {worker.data_ip}" in sync


def test_registry_collect_untags_what_no_kept_release_names_then_frees_the_blobs(tmp_path, monkeypatch):
    """Real listing of a registry store laid out as Distribution lays it; the changes recorded by a dry run."""
    from sparkdeploy.ops import registry
    from sparkdeploy.remote.connection import Target, recording
    from sparkdeploy.remote.ssh import LocalConn

    monkeypatch.setattr(registry, "STORAGE_DIR", str(tmp_path))
    tags = tmp_path / "docker/registry/v2/repositories/sparkdeploy/serving/_manifests/tags"
    for t in ("0.33.0-aaa", "0.33.0-bbb", "0.33.0-ccc"):
        (tags / t / "current").mkdir(parents=True)
    head = LocalConn(Target("node1", "localhost", local=True))
    keep = {"sparkdeploy/serving:0.33.0-aaa", "sparkdeploy/serving:0.33.0-ccc", "other/repo:0.33.0-bbb"}
    with recording(dry=True) as made:
        assert registry.collect(head, "sparkdeploy/serving", keep) == ["0.33.0-bbb"]
    assert made == [f"node1: run rm -rf {tags}/0.33.0-bbb",
                    f"node1: run systemctl stop {registry.UNIT_NAME}",
                    f"node1: run {registry.BINARY} garbage-collect --delete-untagged {registry.CONFIG}",
                    f"node1: run systemctl start {registry.UNIT_NAME}"]
    with recording(dry=True) as made:
        assert registry.collect(head, "sparkdeploy/serving", keep | {"sparkdeploy/serving:0.33.0-bbb"}) == []
    assert made == []  # nothing to drop: the registry is not stopped
    assert (tags / "0.33.0-bbb").is_dir()  # the dry run removed nothing


# Lines as the sim head's registry (Debian docker-registry 2.8.2) wrote them to its journal during a pull; the
# logfmt line is its error log, which counts nothing.
REGISTRY_LOG = '''\
172.30.174.11 - - [03/Dec/2026:22:43:08 +0000] "HEAD /v2/sparkdeploy/serving-sim/blobs/sha256:4e34 HTTP/1.1" 200 0 "" "docker/20.10.24+dfsg1"
time="2026-12-03T22:43:08.786845422Z" level=error msg="response completed with error" err.code="blob unknown" http.request.method=HEAD http.request.remoteaddr="172.30.174.11:44078" http.response.status=404 http.response.written=157
172.30.174.11 - - [03/Dec/2026:22:43:08 +0000] "HEAD /v2/sparkdeploy/serving-sim/blobs/sha256:e796 HTTP/1.1" 404 157 "" "docker/20.10.24+dfsg1"
172.30.174.12 - - [03/Dec/2026:22:43:09 +0000] "GET /v2/ HTTP/1.1" 200 2 "" "docker/20.10.24+dfsg1"
172.30.174.12 - - [03/Dec/2026:22:43:09 +0000] "GET /v2/sparkdeploy/serving-sim/manifests/sha256:18e1 HTTP/1.1" 200 2201 "" "docker/20.10.24+dfsg1"
172.30.174.12 - - [03/Dec/2026:22:43:09 +0000] "GET /v2/sparkdeploy/serving-sim/blobs/sha256:a39c HTTP/1.1" 200 123164 "" "docker/20.10.24+dfsg1"
172.30.174.12 - - [03/Dec/2026:22:43:09 +0000] "GET /v2/sparkdeploy/serving-sim/blobs/sha256:4e34 HTTP/1.1" 200 29707 "" "docker/20.10.24+dfsg1"
'''


def test_registry_log_gives_the_bytes_sent_to_each_client():
    from sparkdeploy.ops import registry

    assert registry.sent_by_client(REGISTRY_LOG) == {"172.30.174.11": 157, "172.30.174.12": 2 + 2201 + 123164 + 29707}
    assert registry.sent_by_client("-- No entries --\n") == {}
