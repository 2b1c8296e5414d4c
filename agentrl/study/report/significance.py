"""When the seeds support a paired difference: a two-sided paired t test at a named level.

Under a zero-mean Gaussian null the test marks a fraction ``ALPHA`` of comparisons, whatever the
number of seeds (tests/study/test_significance.py checks it by simulation). The rule it replaces
("same sign on every seed and the mean beyond two standard errors") is a t > 2 test at df = n − 1:
it marks 18 % of null comparisons at n = 3 (docs/study.md, "Reading the report").
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

ALPHA = 0.05
"""Two-sided level of the paired t test: the share of null comparisons marked **supported**."""
MIN_SEEDS_ACCURACY = 5
"""Fewer seeds than this: a held-out accuracy comparison is reported as not testable (its per-seed
spread of 0.1–0.2 mean@8 leaves no power for the few-point differences the paper reports)."""


def t_two_sided_p(t: float, df: int) -> float:
    """P(|T| ≥ |t|) for Student's t with ``df`` degrees of freedom (Simpson's rule on the density in
    u = atan(x / √df), where the integrand is smooth and the range finite)."""
    if math.isinf(t):
        return 0.0
    if math.isnan(t):
        return math.nan
    nu = float(df)
    # x = √ν·tan u turns the density f(x) dx into c·cos(u)^(ν−1) du on [0, atan(|t|/√ν)]
    c = math.exp(math.lgamma((nu + 1) / 2) - math.lgamma(nu / 2)) / math.sqrt(math.pi)
    top = math.atan(abs(t) / math.sqrt(nu))
    n = 2000  # even
    h = top / n
    total = sum((4 if i % 2 else 2) * math.cos(i * h) ** (nu - 1) for i in range(1, n))
    area = c * h / 3 * (1 + total + math.cos(top) ** (nu - 1))
    return max(0.0, 1.0 - 2.0 * area)


def t_critical(df: int, alpha: float = ALPHA) -> float:
    """|t| beyond which ``t_two_sided_p`` < ``alpha`` (bisection)."""
    lo, hi = 0.0, 1e3
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_two_sided_p(mid, df) > alpha else (lo, mid)
    return hi


def paired_t(diffs: Sequence[float]) -> tuple[float, float]:
    """(t, two-sided p) of the mean of per-seed differences against 0; NaN with fewer than 2 seeds."""
    if len(diffs) < 2:
        return math.nan, math.nan
    m, sd = statistics.fmean(diffs), statistics.stdev(diffs)
    if sd == 0:
        return (math.copysign(math.inf, m), 0.0) if m else (0.0, 1.0)
    t = m / (sd / math.sqrt(len(diffs)))
    return t, t_two_sided_p(t, len(diffs) - 1)


def supported(diffs: Sequence[float], alpha: float = ALPHA) -> bool:
    """The seeds support the difference: the paired t test rejects a zero mean at ``alpha``."""
    _, p = paired_t(diffs)
    return not math.isnan(p) and p < alpha


def smallest_supported(diffs: Sequence[float], alpha: float = ALPHA) -> float:
    """The smallest |mean| this many seeds with this spread could support: t_crit·sd/√n."""
    if len(diffs) < 2:
        return math.inf
    return t_critical(len(diffs) - 1, alpha) * statistics.stdev(diffs) / math.sqrt(len(diffs))
