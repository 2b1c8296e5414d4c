"""``rewards.correct_number``: a computed number, not an expression that equals it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from agentrl.env import Task
from environments.rewards import correct, correct_number

TASK = Task(id="t", prompt="What is 854 - 299 * 800 - 314?", answer=-238660)


@pytest.mark.parametrize(
    ("text", "paid"),
    [
        ("\\boxed{-238660}", 1.0),
        ("\\boxed{-238,660}", 1.0),
        ("\\boxed{-238660}$", 1.0),
        ("\\boxed{854 - 299 * 800 - 314}", 0.0),
        ("\\boxed{238660}", 0.0),
        ("no answer", 0.0),
    ],
)
def test_only_a_plain_number_equal_to_the_answer_is_paid(text, paid):
    state = SimpleNamespace(info={}, final_text=text)
    assert correct_number(TASK, state) == paid
    if "*" in text:
        assert correct(TASK, state) == 1.0  # math equivalence alone pays the copied expression
