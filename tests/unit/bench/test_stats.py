"""Statistics on synthetic series where the truth is known: medians, noise, verdicts (never a fixed %)."""

import numpy as np
import pytest

from sparkdeploy.bench import compare as bench_compare
from sparkdeploy.bench import stats


def test_summarize_median_spread_stdev():
    s = stats.summarize([3.0, 1.0, 2.0, None])
    assert (s.n, s.median, s.min, s.max) == (3, 2.0, 1.0, 3.0)
    assert s.spread == 2.0
    assert s.stdev == pytest.approx(1.0)
    assert stats.summarize([]).median is None
    assert stats.summarize([5.0]).stdev is None


def test_median_ci95_is_the_binomial_order_statistic_interval_and_covers_the_median():
    assert stats.median_ci95(list(range(10))) == (1, 8)  # the textbook ranks: 2nd and 9th of 10
    assert stats.median_ci95(list(range(20))[::-1]) == (5, 14)  # 6th and 15th of 20, whatever the order
    assert stats.median_ci95([3.0, 1.0, 2.0]) == (1.0, 3.0)  # too few for 95%: the range
    rng = np.random.default_rng(7)
    intervals = [stats.median_ci95(list(rng.standard_cauchy(20))) for _ in range(2000)]
    covered = sum(lo <= 0.0 <= hi for lo, hi in intervals)
    assert 0.95 <= covered / 2000 <= 0.985  # long tails too; n = 20 gives 95.9% exactly


def test_pooled_stdev_ignores_group_means():
    sd, dof = stats.pooled_stdev([[1.0, 2.0, 3.0], [101.0, 102.0, 103.0]])
    assert sd == pytest.approx(1.0)
    assert dof == 4


def _series(rng, mean, sd, n):
    return list(rng.normal(mean, sd, n))


@pytest.mark.parametrize("n", [3, 5])
def test_shift_smaller_than_noise_is_within_noise(n):
    """Shift of 0.3 sd: essentially never called a change."""
    rng = np.random.default_rng(1)
    calls = [stats.verdict("x", _series(rng, 100, 5, n), _series(rng, 101.5, 5, n)).verdict for _ in range(400)]
    assert calls.count(stats.WITHIN_NOISE) / len(calls) > 0.95


@pytest.mark.parametrize("n", [3, 5])
def test_shift_much_larger_than_noise_is_detected(n):
    """Shift of 10 sd: detected, with the right sign, and in the right direction for lower-is-better."""
    rng = np.random.default_rng(2)
    up = [stats.verdict("tok_s", _series(rng, 100, 1, n), _series(rng, 110, 1, n)).verdict for _ in range(200)]
    assert up.count(stats.BETTER) / len(up) > 0.95
    assert stats.WORSE not in up
    ttft = [stats.verdict("ttft", _series(rng, 1.0, 0.01, n), _series(rng, 1.1, 0.01, n),
                          higher_is_better=False).verdict for _ in range(200)]
    assert ttft.count(stats.WORSE) / len(ttft) > 0.95


def test_no_true_shift_gives_few_false_alarms():
    rng = np.random.default_rng(3)
    calls = [stats.verdict("x", _series(rng, 50, 3, 3), _series(rng, 50, 3, 3)).verdict for _ in range(1000)]
    assert 1 - calls.count(stats.WITHIN_NOISE) / len(calls) < 0.03


def test_the_same_relative_shift_depends_on_the_metrics_own_noise():
    """The seed's lesson: a metric that swings 50% on its own must not trip a gate that a steady one trips."""
    rng = np.random.default_rng(4)
    noisy_a, noisy_b = _series(rng, 100, 25, 3), _series(rng, 110, 25, 3)
    steady_a, steady_b = _series(rng, 100, 0.5, 3), _series(rng, 110, 0.5, 3)
    assert stats.verdict("noisy", noisy_a, noisy_b).verdict == stats.WITHIN_NOISE
    assert stats.verdict("steady", steady_a, steady_b).verdict == stats.BETTER


def test_extra_baseline_repeats_sharpen_the_noise_estimate():
    a, b = [100.0, 103.0, 97.0], [104.0, 107.0, 101.0]  # sd 3 on both sides, shift 4 (about 1.3 sd)
    alone = stats.verdict("x", a, b)
    rng = np.random.default_rng(5)
    extra = [_series(rng, 100, 0.2, 10) for _ in range(5)]
    sharper = stats.verdict("x", a, b, extra_a=extra)
    assert sharper.threshold < alone.threshold
    assert sharper.noise < alone.noise


def test_deterministic_metric_any_real_difference_counts_rounding_does_not():
    assert stats.verdict("acc", [2.5, 2.5, 2.5], [2.5, 2.5, 2.5 + 1e-15]).verdict == stats.WITHIN_NOISE
    assert stats.verdict("acc", [2.5, 2.5, 2.5], [2.6, 2.6, 2.6]).verdict == stats.BETTER


def test_single_repeats_give_no_verdict():
    v = stats.verdict("x", [1.0], [2.0])
    assert v.verdict == stats.UNKNOWN and v.difference == 1.0
    assert stats.verdict("x", [], [2.0]).verdict == stats.UNKNOWN


# scipy.stats.t.ppf(1 - alpha / 2, dof), recorded (scipy 1.17.1) so the test needs no scipy either
SCIPY_T = [(1, 0.01, 63.656741162871526), (2, 0.01, 9.924843200918287), (3, 0.01, 5.840909309733355),
           (4, 0.01, 4.604094871349992), (7, 0.0005, 6.081756186049146), (10, 0.05, 2.228138851986274),
           (30, 0.01 / 12, 3.7136477413025135), (1000, 0.01, 2.580754698065951)]


@pytest.mark.parametrize(("dof", "alpha", "expected"), SCIPY_T)
def test_t_quantile_matches_scipy(dof, alpha, expected):
    assert stats.t_quantile(dof, alpha) == pytest.approx(expected, rel=1e-10)


def test_t_quantile():
    assert stats.t_quantile(4) == pytest.approx(4.604, abs=1e-3)  # the printed table's t(0.995, 4)
    assert stats.t_quantile(1000) == pytest.approx(2.581, abs=1e-3)
    assert stats.t_quantile(4, 0.01 / 20) > stats.t_quantile(4)
    assert stats.t_quantile(0) == float("inf")


def _aa_false_alarms(pairs: int, figures: int, alpha_per_figure: float) -> float:
    """Share of A/A comparisons (both sides the same gaussian, 3-5 repeats) where any figure is judged worse."""
    rng = np.random.default_rng(7)
    alarms = 0
    for _ in range(pairs):
        n_a, n_b = rng.integers(3, 6, size=2)
        alarms += any(stats.verdict("f", list(rng.normal(100, 5, n_a)), list(rng.normal(100, 5, n_b)),
                                    alpha=alpha_per_figure).verdict == stats.WORSE for _ in range(figures))
    return alarms / pairs


def test_an_aa_comparison_of_many_figures_false_alarms_at_most_one_percent():
    """Twenty noisy figures judged at 1% each alarm in several percent of A/A comparisons (a full run saw one); the
    comparison's correction divides the 1% among them. Fails if compare() stops passing the corrected alpha."""
    metrics = {f"c{i}/decode_tok_s": {"values": [1.0, 2.0, 3.0]} for i in range(20)}
    metrics |= {f"c{i}/acceptance_length": {"values": [2.5, 2.5, 2.5]} for i in range(20)}  # exact: no alarm
    results = {"kind": "probe", "service": {}, "settings": {}, "metrics": metrics}
    alpha = bench_compare.compare(results, results)["alpha_per_figure"]
    assert alpha == pytest.approx(0.01 / 20)
    assert _aa_false_alarms(600, 20, 0.01) > 0.02
    assert _aa_false_alarms(600, 20, alpha) <= 0.012


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_vals = st.lists(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), min_size=2, max_size=8)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(_vals, _vals)
def test_swapping_sides_mirrors_the_verdict(a, b):
    fwd, back = stats.verdict("x", a, b), stats.verdict("x", b, a)
    mirror = {stats.BETTER: stats.WORSE, stats.WORSE: stats.BETTER, stats.WITHIN_NOISE: stats.WITHIN_NOISE,
              stats.UNKNOWN: stats.UNKNOWN}
    assert back.verdict == mirror[fwd.verdict]
    assert fwd.threshold == pytest.approx(back.threshold)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(_vals, st.floats(min_value=-1e3, max_value=1e3), st.floats(min_value=0.01, max_value=100))
def test_verdicts_do_not_depend_on_units_or_offsets(a, offset, scale):
    """No fixed percentage: shifting every value, or changing the unit, changes no verdict."""
    b = [x * 1.1 + 3 for x in a]
    base = stats.verdict("x", a, b).verdict
    moved = stats.verdict("x", [x * scale + offset for x in a], [x * scale + offset for x in b]).verdict
    if base != stats.UNKNOWN and abs(stats.verdict("x", a, b).difference or 0) > 1e-6 * (1 + max(map(abs, a + b))):
        assert moved == base


def test_drift_between_baseline_sessions_counts_as_noise():
    """A baseline measured twice, far apart: B between the two sessions is not a change."""
    a, a_again, b = [100.0, 101.0, 99.0], [130.0, 131.0, 129.0], [115.0, 116.0, 114.0]
    assert stats.verdict("x", a, b).verdict == stats.BETTER  # repeats alone look steady
    v = stats.verdict("x", a, b, extra_a=[a_again])
    assert v.verdict == stats.WITHIN_NOISE and v.session_noise == pytest.approx(21.2, abs=0.1)
    # B must beat every baseline session by more than the repeat noise
    assert stats.verdict("x", a, [135.0, 136.0, 134.0], extra_a=[a_again]).verdict == stats.BETTER
    assert stats.verdict("x", a, [90.0, 91.0, 89.0], extra_a=[a_again]).verdict == stats.WORSE
    # steady sessions leave a real shift detectable
    steady = [[100.2, 101.0, 99.5], [99.8, 100.5, 100.1], [100.0, 99.6, 100.9]]
    assert stats.verdict("x", a, [110.0, 111.0, 109.0], extra_a=steady).verdict == stats.BETTER
