"""Metric snapshots and counter deltas, parsed with prometheus_client's parser, including counter resets."""

import pytest

from sparkdeploy.bench import metrics
from sparkdeploy.errors import BenchError

from .metrics_text import metrics_text


def test_parse_sums_over_labels_and_filters_by_label():
    snap = metrics.parse(metrics_text(success=7, per_pos=(30, 20)))
    assert snap.value(metrics.SUCCESS) == 7  # stop + length summed
    assert snap.value(metrics.SUCCESS, finished_reason="stop") == 0
    assert snap.value(metrics.ACCEPTED_PER_POS, position="1") == 20
    assert snap.label_values(metrics.ACCEPTED_PER_POS, "position") == ["0", "1"]
    assert metrics.SUCCESS in snap.counters and metrics.RUNNING not in snap.counters


def test_spec_decode_delta_gives_acceptance_length_and_per_position():
    before = metrics.parse(metrics_text(drafts=10, draft_tokens=20, accepted=10, per_pos=(6, 4)))
    after = metrics.parse(metrics_text(drafts=46, draft_tokens=92, accepted=72, per_pos=(40, 32)))
    spec = metrics.Delta(before, after).spec_decode()
    assert spec["drafts"] == 36 and spec["accepted_tokens"] == 62
    assert spec["acceptance_length"] == pytest.approx(1 + 62 / 36)
    assert spec["acceptance_rate"] == pytest.approx(62 / 72)
    assert spec["per_position"] == pytest.approx([34 / 36, 28 / 36])


def test_no_speculation_means_no_acceptance_figures():
    a, b = metrics.parse(metrics_text(spec=False)), metrics.parse(metrics_text(spec=False, success=1))
    assert metrics.Delta(a, b).spec_decode() is None
    same = metrics.parse(metrics_text(drafts=5))
    assert metrics.Delta(same, same).spec_decode() is None  # no drafts during the run


def test_prefix_cache_and_server_timing_deltas():
    before = metrics.parse(metrics_text(hits=128, queries=511, gen_tokens=100, ttft_sum=1.0, ttft_count=2,
                                        decode_sum=2.0, decode_count=2))
    after = metrics.parse(metrics_text(hits=128 + 9464, queries=511 + 9600, gen_tokens=100 + 64, ttft_sum=1.5,
                                       ttft_count=3, decode_sum=2.9, decode_count=3))
    d = metrics.Delta(before, after)
    pc = d.prefix_cache()
    assert pc["hits"] == 9464 and pc["hit_rate"] == pytest.approx(9464 / 9600)
    timing = d.server_timing()
    assert timing["ttft_s"] == pytest.approx(0.5)
    assert timing["decode_tok_s"] == pytest.approx(63 / 0.9)


def test_counter_going_backwards_is_a_reset():
    before = metrics.parse(metrics_text(success=50, drafts=400))
    after = metrics.parse(metrics_text(success=3, drafts=30))  # restarted, then served 3 requests
    with pytest.raises(metrics.CounterReset, match="went backwards"):
        metrics.Delta(before, after)


def test_restart_whose_counters_grew_past_the_old_values_is_still_a_reset():
    """A restart between runs can leave every counter higher than before; `_created` gives it away."""
    before = metrics.parse(metrics_text(success=2, created=1.7e9, start=1.7e9))
    after = metrics.parse(metrics_text(success=5, created=1.7e9 + 60, start=1.7e9))
    with pytest.raises(metrics.CounterReset, match="re-created"):
        metrics.Delta(before, after)
    restarted = metrics.parse(metrics_text(success=5, created=1.7e9, start=1.7e9 + 60))
    with pytest.raises(metrics.CounterReset, match="restarted"):
        metrics.Delta(before, restarted)


def test_counter_that_disappears_is_a_reset():
    before = metrics.parse(metrics_text(drafts=10))
    after = metrics.parse(metrics_text(spec=False))
    with pytest.raises(metrics.CounterReset, match="disappeared"):
        metrics.Delta(before, after)


def test_new_label_values_are_not_a_reset():
    before = metrics.parse(metrics_text(per_pos=(1,)))
    after = metrics.parse(metrics_text(per_pos=(3, 2)))
    assert metrics.Delta(before, after)(metrics.ACCEPTED_PER_POS, position="1") == 2


def test_garbage_is_a_bench_error():
    with pytest.raises(BenchError, match="not Prometheus"):
        metrics.parse("this is { not metrics\n")
