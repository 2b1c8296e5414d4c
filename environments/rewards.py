"""Reward functions shared by the built-in environments: ``fn(task, state) -> float``.

Compose them with ``Reward(name, fn, weight)`` in an environment's ``rewards()``; weight 0 makes a
logged metric. They do not catch exceptions: a reward function that raises is recorded by the runner
as the episode's failure at the ``reward`` boundary (a bug to see, not a zero to hide).
"""

from __future__ import annotations

import re

from agentrl.env import EpisodeState, Task
from environments.math_equiv import extract_answer, is_equivalent, normalize

_PLAIN_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


def final_answer(state: EpisodeState) -> str | None:
    """The answer ``step`` found (``info["answer"]``), else the one in the last policy turn."""
    if state.info.get("answer") is not None:
        return str(state.info["answer"])
    return extract_answer(state.final_text)


def correct(task: Task, state: EpisodeState) -> float:
    """1 when the final answer is mathematically equivalent to ``task.answer`` (see math_equiv)."""
    return float(is_equivalent(final_answer(state), task.answer))


def correct_number(task: Task, state: EpisodeState) -> float:
    """1 when the final answer is a plain number (after ``normalize``: no expression, no variable)
    equal to ``task.answer``. For tasks that ask for a computed value, where an expression equal to
    the answer (``\\boxed{854 - 299 * 800}``) computes nothing (docs/tasks.md, code_interpreter)."""
    answer = final_answer(state)
    if answer is None or not _PLAIN_NUMBER.fullmatch(normalize(answer)):
        return 0.0
    return float(is_equivalent(answer, task.answer))


def has_answer(task: Task, state: EpisodeState) -> float:
    """Format metric: 1 when the episode ended with an extractable final answer."""
    return float(final_answer(state) is not None)


def num_tool_calls(task: Task, state: EpisodeState) -> float:
    """How many tool results the episode received (one per call, errors included)."""
    return float(sum(1 for m in state.messages if m.get("role") == "tool"))


def response_chars(task: Task, state: EpisodeState) -> float:
    """Characters the policy wrote over the whole episode (length metric for Long CoT)."""
    return float(sum(len(m.get("content") or "") for m in state.messages if m.get("role") == "assistant"))
