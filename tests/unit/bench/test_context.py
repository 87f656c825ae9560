"""What results record about the release: URL only, an inventory, and the live-release seam."""

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sparkdeploy.bench import context, results
from sparkdeploy.cli import main
from sparkdeploy.errors import BenchError, RemoteError

from .fake_vllm import FakeVllm

REPO = Path(__file__).resolve().parents[3]


@dataclass
class Ssh:
    host: str


@dataclass
class Node:
    name: str
    role: str
    data_ip: str
    ssh: Ssh
    gpu: str = "gb10"


@dataclass
class Ports:
    api: int = 8000


@dataclass
class Inv:
    nodes: tuple
    ports: Ports = field(default_factory=Ports)
    cluster: str = "pair"


def test_api_urls_prefer_the_heads_data_ip_then_its_ssh_host():
    inv = Inv((Node("n2", "worker", "10.1.0.2", Ssh("a2")), Node("n1", "head", "10.1.0.1", Ssh("a1"))), Ports(9000))
    assert context.api_urls(inv) == ["http://10.1.0.1:9000", "http://a1:9000"]
    with pytest.raises(BenchError, match="pass --url"):
        context.api_urls(Inv(()))


def test_context_from_the_shipped_inventory_records_image_vocab_patches_nodes():
    path = REPO / "inventory.yaml"
    inv = context.load_inventory(path)
    ctx = context.from_inventory(inv, path)
    assert ctx["source"] == "inventory" and ctx["release_source"].startswith("inventory")
    assert ctx["image"]["vllm_version"] and ctx["nodes"][0]["role"] in ("head", "worker")
    assert isinstance(ctx["patches"], list)
    assert "vocab_hash" in ctx  # the example inventory names a vocab list
    assert context.api_urls(inv)[0].endswith(f":{inv.ports.api}")


def test_live_release_seam_overrides_desired_values_and_records_failures():
    inv = Inv((Node("n1", "head", "10.1.0.1", Ssh("a1")),))
    try:
        context.set_live_release_reader(lambda i: {"release": "r42", "image": "sha256:abc", "vocab_hash": None})
        ctx = context.from_inventory(inv, "inv.yaml")
        assert ctx["release"] == "r42" and ctx["image"] == "sha256:abc" and ctx["release_source"].startswith("live")

        def broken(i):
            raise RemoteError("ssh refused", node="n1")

        context.set_live_release_reader(broken)
        ctx = context.from_inventory(inv, "inv.yaml")
        assert ctx["release_source_error"] == "n1: ssh refused"
    finally:
        context.set_live_release_reader(None)


def test_cli_probe_through_an_inventory_records_its_context(tmp_path, monkeypatch):
    with FakeVllm() as fake:
        port = int(fake.url.rsplit(":", 1)[1])
        inv = Inv((Node("n1", "head", "127.0.0.1", Ssh("127.0.0.1")),), Ports(port))
        monkeypatch.setattr(context, "load_inventory", lambda path, service=None: inv)
        (tmp_path / "inv.yaml").write_text("stub: true\n")
        out = tmp_path / "r.json"
        assert main(["bench", "probe", "--inventory", str(tmp_path / "inv.yaml"), "--tokens", "8", "--runs", "1",
                     "--warmup", "0", "--out", str(out)]) == 0
    r = results.load(out)
    assert r["service"]["url"] == f"http://127.0.0.1:{port}"
    assert r["context"]["source"] == "inventory" and r["context"]["nodes"][0]["name"] == "n1"


def test_cli_without_url_or_inventory_is_an_input_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "probe"]) == 2
