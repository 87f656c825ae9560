"""64 GB and 128 GB Sparks side by side: every memory figure comes from each node's own facts, a profile that does
not fit is refused per node with its shortfall (exit 2), and the shipped 64 GB-pair profile plans on two 64 GB
boxes (tests/unit/fixtures/facts.64gb-pair.yaml stands in for them)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sparkdeploy import paths
from sparkdeploy.cli import main
from sparkdeploy.errors import PlanError
from sparkdeploy.model import inventory
from sparkdeploy.model.facts_file import load_facts_file
from sparkdeploy.plan import plan

FIXTURES = Path(__file__).parent / "fixtures"
FACTS_64 = FIXTURES / "facts.64gb-pair.yaml"
FACTS_128 = FIXTURES / "facts.pair.yaml"


def _inventory(tmp_path: Path, profile: str | None = None) -> Path:
    """The shipped pair inventory, with another profile where given."""
    data = yaml.safe_load(paths.default_inventory().read_text())
    data["vocab"] = str(paths.repo_root() / data["vocab"])
    if profile:
        data["profile"] = profile
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_the_64gb_pair_profile_plans_on_two_64gb_boxes_from_their_own_memtotal(tmp_path):
    p = plan(inventory.load(_inventory(tmp_path, "qwen3.5-35b-a3b-fp8-tp2")), load_facts_file(FACTS_64))
    for node in p.nodes:
        m = node.memory
        assert (m.mem_total_gib, m.mem_available_gib, m.base_gib) == (59.8, 56.2, 56.2)
        assert m.gpu_memory_utilization == 0.47  # floor((56.2 - 28) / 59.8, 0.01)
        assert m.weights_gib == 17.5 and m.kv_gib > 1.3  # one 262k sequence of KV: 262144 x 5120 B = 1.25 GiB
        assert "--gpu-memory-utilization" in node.serve_argv
        assert node.serve_argv[node.serve_argv.index("--gpu-memory-utilization") + 1] == "0.47"
    # the same profile on 128 GB boxes takes a larger fraction of a larger pool: nothing is a 128 GB constant
    big = plan(inventory.load(_inventory(tmp_path, "qwen3.5-35b-a3b-fp8-tp2")), load_facts_file(FACTS_128))
    assert big.head.memory.gpu_memory_utilization == 0.72 and big.head.memory.mem_total_gib == 119.7


def test_the_big_profile_is_refused_on_64gb_boxes_with_each_nodes_shortfall(tmp_path, capsys):
    inv = inventory.load(_inventory(tmp_path))  # qwen3.8-flash-next-nvfp4: 44 GiB over two ranks
    with pytest.raises(PlanError) as err:
        plan(inv, load_facts_file(FACTS_64))
    message = str(err.value)
    assert message.startswith("2 nodes do not fit:")
    for node in ("spark1", "spark2"):
        assert f"node {node}: short by 8.1 GiB: with MemAvailable 56.2 GiB of MemTotal 59.8 GiB" in message
    assert "10.0 GiB of KV for one max_model_len sequence" in message  # 131072 x 81920 B per rank
    assert main(["plan", "--inventory", str(_inventory(tmp_path)), "--facts", str(FACTS_64)]) == 2
    assert "short by 8.1 GiB" in capsys.readouterr().err


def test_a_64gb_box_beside_a_128gb_box_is_the_only_one_refused(tmp_path):
    mixed = yaml.safe_load(FACTS_128.read_text())
    mixed["nodes"]["spark2"] = yaml.safe_load(FACTS_64.read_text())["nodes"]["spark2"]
    facts_path = tmp_path / "facts.yaml"
    facts_path.write_text(yaml.safe_dump(mixed))
    with pytest.raises(PlanError) as err:
        plan(inventory.load(_inventory(tmp_path)), load_facts_file(facts_path))
    assert str(err.value).startswith("node spark2: short by") and "spark1" not in str(err.value)
