"""short_cot: single-turn math reasoning with a verifiable final answer.

The model reads a problem and answers in one turn; the answer is the last ``\\boxed{..}`` (or a GSM8K
``#### 42`` line) and is checked with ``math_equiv.is_equivalent``, which accepts equivalent forms
(``1/2``, ``0.5``, ``\\frac{1}{2}``) and rejects wrong ones. Built-in tasks are arithmetic word
problems (``generators.make_word_problem``: knobs ``steps``, ``max_value``, ``max_factor``, ``ops``);
real datasets (GSM8K, MATH-500) come in through ``agentrl.env.data`` adapters with the same rewards.
Many completions are right: the solver folds the terms in any order that stays non-negative.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from agentrl.env import BOXED_ANSWER, Environment, Message, Reward, StepResult, Task, register
from environments.generators import (
    demo_rng,
    first_messages,
    make_word_problem,
    sample_tasks,
    solve_word_problem,
)
from environments.math_equiv import extract_answer
from environments.rewards import correct, has_answer


@register
class ShortCoT(Environment):
    name = "short_cot"
    system_prompt = "Solve the problem. Give the final answer as \\boxed{N}."
    max_turns = 1
    stop_conditions = (BOXED_ANSWER,)  # the turn ends with the token that closes its answer

    def step(self, action: str) -> StepResult:
        return answer_step(action)

    @classmethod
    def load_tasks(cls, split: str, n: int | None = None, seed: int = 0, **knobs: Any) -> list[Task]:
        """Arithmetic word problems; knobs go to ``generators.make_word_problem``."""
        return sample_tasks("short_cot", lambda rng: make_word_problem(rng, **knobs), split, n, seed)

    @classmethod
    def demonstrations(cls, tasks: Sequence[Task], seed: int = 0) -> list[list[Message]]:
        """Solver traces for generated tasks; for dataset tasks, the reference solution
        (``metadata["solution"]``) rewritten to end in ``\\boxed{answer}``."""
        demos = []
        for task in tasks:
            if "terms" in task.metadata:
                text = solve_word_problem(task.metadata["terms"], demo_rng(seed, task))
            elif task.metadata.get("solution"):
                text = solution_to_demo(str(task.metadata["solution"]), task.answer)
            else:
                raise ValueError(f"task {task.id!r} has neither solver terms nor a reference solution")
            demos.append([*first_messages(cls.system_prompt, task), {"role": "assistant", "content": text}])
        return demos

    def rewards(self) -> list[Reward]:
        return [Reward("correct", correct, 1.0), Reward("has_answer", has_answer, 0.0)]


def answer_step(action: str) -> StepResult:
    """A single-turn episode's only step: whatever the model wrote is its final answer (boxed, or a
    ``####`` / ``Answer:`` line); a turn without one is a void turn. Tool-call text is not run."""
    answer = extract_answer(action)
    info: dict[str, Any] = {"answer": answer} if answer is not None else {"void_turn": True}
    return StepResult([], 0.0, True, False, info)


def solution_to_demo(solution: str, answer: Any) -> str:
    """A dataset's worked solution as a demonstration: GSM8K's ``<<48/2=24>>`` calculator notes
    dropped, its ``#### 72`` line turned into ``\\boxed{72}``; a solution that already boxes its
    answer (MATH) is kept as is."""
    text = re.sub(r"<<[^<>]*>>", "", solution).strip()
    if "\\boxed{" in text:
        return text
    text = re.sub(r"\n?####[^\n]*$", "", text).rstrip()
    return f"{text}\n\\boxed{{{answer}}}"
