"""The serving image's identity: runtime data (the draft list) is not image content."""

from __future__ import annotations

from pathlib import Path

import yaml

from sparkdeploy import inventory, plan, render
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
