"""The report's rule for "supported": a paired t test whose false-positive rate is its α."""

import random
import statistics

import pytest

from agentrl.study.report import paired_t, supported
from agentrl.study.report.significance import smallest_supported, t_critical, t_two_sided_p


def test_t_distribution_against_published_quantiles():
    for df, t975 in ((1, 12.706), (2, 4.303), (4, 2.776), (9, 2.262), (30, 2.042)):
        assert t_critical(df) == pytest.approx(t975, abs=2e-3)
    assert t_two_sided_p(2.0, 2) == pytest.approx(0.1835, abs=1e-3)  # the old "t > 2" rule at n = 3
    assert t_two_sided_p(0.0, 5) == pytest.approx(1.0)


def test_false_positive_rate_under_the_null_is_alpha_and_the_old_rule_was_not():
    rng = random.Random(0)
    draws = [[rng.gauss(0, 1) for _ in range(3)] for _ in range(4000)]
    rate = sum(supported(d) for d in draws) / len(draws)
    assert 0.04 < rate < 0.06
    old = sum(abs(statistics.fmean(d)) > 2 * statistics.stdev(d) / 3**0.5 for d in draws) / len(draws)
    assert 0.16 < old < 0.21  # 18.4 % (stare-review)


def test_smallest_supported_difference_and_degenerate_seeds():
    assert smallest_supported([0.1, -0.1, 0.3]) == pytest.approx(4.303 * 0.2 / 3**0.5, rel=1e-3)
    assert paired_t([0.2, 0.2]) == (float("inf"), 0.0) and supported([0.2, 0.2])
    assert not supported([0.4]) and not supported([])
