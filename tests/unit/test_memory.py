"""memory.budget: GMU from MemAvailable (or MemTotal) minus the host reserve; unsafe explicit values refused."""

from __future__ import annotations

import pytest

from sparkdeploy.errors import PlanError
from sparkdeploy.node.facts import GIB, NodeFacts
from sparkdeploy.plan.memory import budget


def _facts(total_gib=119.7, available_gib=116.0, gpu=True):
    return NodeFacts("spark1", int(total_gib * GIB), None if available_gib is None else int(available_gib * GIB), gpu)


def _budget(facts, **kw):
    args = dict(reserve_gib=28.0, weights_gib=22.0, activation_gib=4.0, kv_bytes_per_token=81920)
    args.update(kw)
    return budget(facts, **args)


def test_derived_gmu_sits_between_the_seeds():
    b = _budget(_facts())
    assert b.gmu_source == "derived" and b.base == "MemAvailable"
    assert 0.68 < b.gpu_memory_utilization < 0.78  # 0.68 ran; 0.78 left 1.8 GiB on the head
    assert b.left_gib >= b.reserve_gib
    assert b.kv_gib == pytest.approx(b.engine_gib - 22.0 - 4.0, abs=0.01)
    assert b.kv_tokens == int(b.kv_gib * GIB // 81920)


@pytest.mark.parametrize("gmu", [0.835, 0.78])
def test_seed_failures_are_refused(gmu):
    with pytest.raises(PlanError, match="memory.gpu_memory_utilization") as err:
        _budget(_facts(), explicit_gmu=gmu)
    assert "highest safe value is 0.73" in str(err.value)


def test_seed_success_is_accepted():
    b = _budget(_facts(), explicit_gmu=0.68)
    assert b.gmu_source == "explicit" and b.gpu_memory_utilization == 0.68
    assert b.left_gib == pytest.approx(116.0 - 0.68 * 119.7, abs=0.01)


def test_memtotal_is_the_base_when_available_is_unknown():
    b = _budget(_facts(available_gib=None))
    assert b.base == "MemTotal" and b.gpu_memory_utilization == pytest.approx(0.76)


def test_less_available_memory_lowers_gmu():
    assert _budget(_facts(available_gib=100.0)).gpu_memory_utilization < _budget(_facts()).gpu_memory_utilization


def test_reserve_that_leaves_no_room_for_weights_is_refused():
    with pytest.raises(PlanError, match="memory.reserve_gib"):
        _budget(_facts(), reserve_gib=100.0)


def test_cpu_node_has_no_gmu_and_checks_the_reserve():
    b = _budget(_facts(24, 20, gpu=False), reserve_gib=4.0, weights_gib=0.1, activation_gib=0.5, cpu_kv_space_gib=1.0)
    assert b.gpu_memory_utilization is None and b.gmu_source == "cpu" and b.kv_gib == 1.0
    with pytest.raises(PlanError, match="reserve"):
        _budget(_facts(24, 6, gpu=False), reserve_gib=4.0, weights_gib=0.1, activation_gib=0.5, cpu_kv_space_gib=1.0)


def test_rows_show_the_split():
    labels = [label.strip() for label, _ in _budget(_facts()).rows()]
    for label in ("gpu-memory-utilization", "weights (per rank)", "KV pool (expected)", "host reserve", "host keeps"):
        assert label in labels


def test_the_shortlist_draft_head_comes_out_of_the_kv_pool():
    from sparkdeploy.plan.memory import shortlist_head_gib

    per_rank = shortlist_head_gib(65536, tp=2)
    assert per_rank * GIB == 65536 // 2 * 2560 * 2  # 167.8 MB per rank at TP=2
    assert shortlist_head_gib(47149, tp=2) * GIB == 47168 // 2 * 2560 * 2  # padded to 64
    assert shortlist_head_gib(0, 2) == 0  # no shortlisted head
    plain, with_head = _budget(_facts()), _budget(_facts(), draft_head_gib=per_rank)
    assert with_head.kv_gib == pytest.approx(plain.kv_gib - per_rank, abs=0.002)
    assert with_head.kv_tokens < plain.kv_tokens
    assert ("  shortlist draft head", "160 MiB") in with_head.rows()
    assert not any("draft head" in label for label, _ in plain.rows())
