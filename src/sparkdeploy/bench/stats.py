"""Medians, spread, noise and verdicts.

The gate the seeds needed: a difference between two medians counts only if it is larger than what
repeating the *same* configuration produces. The noise is measured, per metric, from the repeats of each
side (plus any extra baseline repeats) as a pooled standard deviation; the difference of medians is
compared with a two-sided Student-t bound on that noise. One comparison judges many figures at once (every
category's acceptance and speed): compare.py judges each noisy one at 1% divided by their number
(Bonferroni), so two measurements of the same release false-alarm in at most 1% of comparisons, not figures. There is no fixed percentage anywhere: a
metric that swings 50% on its own needs a large shift to count, a steady one counts a small shift.

Repeats inside one session miss drift between sessions (a busier machine, a warmer cache, a reboot). When the
baseline was measured more than once (extra baseline files, each a session), the spread of the session
medians is noise too: B must then beat *every* baseline session's median by more than the repeat noise bound,
and, from three sessions on (when their spread can be estimated at all), also lie outside a prediction
bound for one more session's median, t(1 - alpha/2, k-1) * sd(session medians) * sqrt(1 + 1/k).
The reported threshold is that bound expressed as a distance from A's median, in the direction of B.
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import asdict, dataclass

BETTER, WORSE, WITHIN_NOISE, UNKNOWN = "better", "worse", "within noise", "unknown noise"

# standard error of a median relative to that of a mean, for normal data (sqrt(pi/2))
_MEDIAN_EFFICIENCY = math.sqrt(math.pi / 2)
ALPHA = 0.01  # a comparison's false-alarm rate, over all its figures together


def _t_within(theta: float, dof: int) -> float:
    """P(|T| <= sqrt(dof) * tan(theta)) for Student's t with a whole number of degrees of freedom: the finite
    series of Abramowitz & Stegun 26.7.3 (odd dof) and 26.7.4 (even dof), increasing in theta on [0, pi/2]."""
    cos2 = math.cos(theta) ** 2
    if dof % 2:
        series, term = 0.0, math.cos(theta)
        for k in range(1, (dof - 1) // 2 + 1):
            series, term = series + term, term * cos2 * (2 * k) / (2 * k + 1)
        return 2 / math.pi * (theta + math.sin(theta) * series)
    series, term = 0.0, 1.0
    for k in range(1, dof // 2 + 1):
        series, term = series + term, term * cos2 * (2 * k - 1) / (2 * k)
    return math.sin(theta) * series


@functools.lru_cache(maxsize=256)
def t_quantile(dof: int, alpha: float = ALPHA) -> float:
    """Two-sided Student-t bound: |T| exceeds it with probability alpha.

    Bisection on the angle of the exact distribution function, to the last bit of a float (it agrees with
    scipy's t.ppf to 1e-10 relative): the sentinel that runs after `up` needs no scipy."""
    if dof <= 0:
        return math.inf
    lo, hi = 0.0, math.pi / 2
    while lo < (mid := (lo + hi) / 2) < hi:
        lo, hi = (mid, hi) if _t_within(mid, dof) < 1 - alpha else (lo, mid)
    return math.sqrt(dof) * math.tan(mid)


@dataclass(frozen=True)
class Summary:
    """One metric over the kept runs of one side."""

    n: int
    median: float | None
    min: float | None
    max: float | None
    stdev: float | None  # sample standard deviation of the repeats (None with fewer than 2)

    @property
    def spread(self) -> float | None:
        return None if self.min is None else self.max - self.min

    def to_dict(self) -> dict:
        return asdict(self)


def median_ci95(values: list[float]) -> tuple[float, float]:
    """A distribution-free 95% confidence interval for the median of `values` (non-empty): the sorted v[j] and
    v[n-1-j] for the largest j with P(Binomial(n, 1/2) <= j) <= 2.5%, so each tail misses the median at most that
    often. No normality assumed: a shared host's ratios have long tails. Too few values (n < 6): their range."""
    v, n = sorted(values), len(values)
    tail = [sum(math.comb(n, i) for i in range(j + 1)) / 2 ** n for j in range(n)]  # P(Binomial(n, 1/2) <= j)
    j = max([i for i in range(n) if tail[i] <= 0.025], default=0)
    return v[j], v[n - 1 - j]


def summarize(values: list[float]) -> Summary:
    vals = [float(v) for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return Summary(0, None, None, None, None)
    sd = statistics.stdev(vals) if len(vals) >= 2 else None
    return Summary(len(vals), statistics.median(vals), min(vals), max(vals), sd)


def pooled_stdev(groups: list[list[float]]) -> tuple[float | None, int]:
    """Pooled standard deviation of several groups of repeats (each around its own mean), and its dof."""
    ss, dof = 0.0, 0
    for g in groups:
        if len(g) >= 2:
            m = statistics.fmean(g)
            ss += sum((x - m) ** 2 for x in g)
            dof += len(g) - 1
    if dof == 0:
        return None, 0
    return math.sqrt(ss / dof), dof


def is_noisy(groups: list[list[float]]) -> bool:
    """Do the repeats of a figure vary beyond float rounding (the floor `verdict` applies)?"""
    vals = [float(x) for g in groups for x in g if x is not None]
    sd, _ = pooled_stdev([[float(x) for x in g if x is not None] for g in groups])
    return sd is not None and sd > 1e-9 * max((abs(x) for x in vals), default=1e-12)


@dataclass(frozen=True)
class Verdict:
    metric: str
    a: float | None
    b: float | None
    difference: float | None  # b - a, in the metric's unit
    noise: float | None  # pooled stdev of the repeats
    threshold: float | None  # smallest |difference| that counts
    verdict: str
    n_a: int
    n_b: int
    session_noise: float | None = None  # stdev of the baseline sessions' medians (with extra baselines)

    def to_dict(self) -> dict:
        return asdict(self)


def verdict(metric: str, a: list[float], b: list[float], *, higher_is_better: bool = True,
            extra_a: list[list[float]] = (), alpha: float = ALPHA) -> Verdict:
    """Compare repeats `b` against baseline repeats `a` (plus optional extra baseline groups).

    Difference of medians against t(1 - alpha/2, dof) * pooled_sd * sqrt(1/n_a + 1/n_b) * sqrt(pi/2).
    With fewer than two repeats anywhere the noise is unknown and no verdict is given.
    """
    a = [float(x) for x in a if x is not None]
    b = [float(x) for x in b if x is not None]
    groups = [a, b, *[[float(x) for x in g] for g in extra_a]]
    ma = statistics.median(a) if a else None
    mb = statistics.median(b) if b else None
    if ma is None or mb is None:
        return Verdict(metric, ma, mb, None, None, None, UNKNOWN, len(a), len(b))
    diff = mb - ma
    sd, dof = pooled_stdev(groups)
    if sd is None:
        return Verdict(metric, ma, mb, diff, None, None, UNKNOWN, len(a), len(b))
    # a floor for deterministic metrics (sd == 0): float rounding is not a difference
    floor = 1e-9 * max(abs(ma), abs(mb), 1e-12)
    threshold = max(t_quantile(dof, alpha) * sd * math.sqrt(1 / len(a) + 1 / len(b)) * _MEDIAN_EFFICIENCY, floor)
    sessions = [statistics.median(g) for g in groups[:1] + groups[2:] if g]
    session_sd = None
    if len(sessions) >= 2:
        k = len(sessions)
        session_sd = statistics.stdev(sessions)
        edge = max(sessions) if diff >= 0 else min(sessions)
        bound = abs(edge - ma) + threshold
        if k >= 3:
            centre = statistics.fmean(sessions)
            bound = max(bound, abs(centre - ma) + t_quantile(k - 1, alpha) * session_sd * math.sqrt(1 + 1 / k))
        threshold = bound
    if abs(diff) <= threshold:
        word = WITHIN_NOISE
    else:
        word = BETTER if (diff > 0) == higher_is_better else WORSE
    return Verdict(metric, ma, mb, diff, sd, threshold, word, len(a), len(b), session_sd)
