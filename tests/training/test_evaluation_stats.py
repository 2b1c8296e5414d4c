"""The paired bootstrap behind ``agentrl eval --against``."""

from __future__ import annotations

import pytest

from agentrl.training.evaluation import paired_bootstrap


def test_a_uniform_gain_has_an_interval_around_it_and_none_has_zero_width():
    before = {f"t{i}": [False] * 8 for i in range(40)}
    after = {f"t{i}": [True] * 4 + [False] * 4 for i in range(40)}
    r = paired_bootstrap(before, after)
    assert r["mean@k"]["change"] == pytest.approx(0.5) and r["pass@k"]["change"] == 1.0
    assert r["mean@k"]["ci_low"] == r["mean@k"]["ci_high"] == pytest.approx(0.5)  # every task gained 0.5
    same = paired_bootstrap(before, before)
    assert (same["mean@k"]["ci_low"], same["mean@k"]["ci_high"]) == (0.0, 0.0)


def test_the_interval_covers_the_change_and_widens_with_noise():
    before = {f"t{i}": [i % 2 == 0] * 2 for i in range(60)}  # half the tasks right
    after = {f"t{i}": [i % 3 != 0] * 2 for i in range(60)}  # two thirds right, a different set
    r = paired_bootstrap(before, after, seed=1)["mean@k"]
    assert r["before"] == 0.5 and r["after"] == pytest.approx(40 / 60)
    assert r["ci_low"] < r["change"] < r["ci_high"] and r["ci_high"] - r["ci_low"] > 0.1
    assert r == paired_bootstrap(before, after, seed=1)["mean@k"]  # seeded


def test_different_tasks_are_refused():
    with pytest.raises(ValueError, match="not on the same tasks"):
        paired_bootstrap({"a": [True]}, {"b": [True]})
