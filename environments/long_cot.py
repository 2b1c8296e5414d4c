"""long_cot: single-turn reasoning with a long budget and an integer answer.

Built-in tasks are long-hand multiplication (``What is 482*37?``) whose solver writes every digit
product, carry and column addition, a few hundred tokens at the CPU default (3 by 2 digits) and
thousands at 10 by 10 (knobs ``digits_a``, ``digits_b``; ``multiplication_tokens`` estimates the
length). Competition-style integer problems (AIME 2024/2025, DAPO-Math-17k) come in through the
``agentrl.env.data`` adapters and use the same rewards.

Length: the environment does not count tokens (the runner does). The max-length knob is
``rollout.max_tokens_per_turn`` in the config (tens of thousands on GPU); DAPO's soft overlong
punishment is applied by the trainer from ``algorithm.overlong`` (on in the ``dapo`` preset, with
``L_max`` derived from that budget). ``response_chars`` is logged (weight 0) to watch the length.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from agentrl.env import BOXED_ANSWER, Environment, Message, Reward, StepResult, Task, register
from environments.generators import Draw, demo_rng, first_messages, sample_tasks
from environments.rewards import correct, has_answer, response_chars
from environments.short_cot import answer_step, solution_to_demo


def make_multiplication(rng: random.Random, digits_a: int = 3, digits_b: int = 2) -> Draw:
    a = rng.randint(10 ** (digits_a - 1), 10**digits_a - 1)
    b = rng.randint(10 ** (digits_b - 1), 10**digits_b - 1)
    key = f"mul|{min(a, b)}|{max(a, b)}"  # a*b and b*a are one problem
    return key, f"What is {a}*{b}?", a * b, {"family": "long_multiplication", "a": a, "b": b}


def _times_digit(a: int, d: int) -> list[str]:
    """``a * d`` digit by digit from the right; the last digit writes its whole value."""
    lines, carry = [f"{a}*{d}:"], 0
    digits = str(a)[::-1]
    for i, x in enumerate(digits):
        p = int(x) * d + carry
        last = i == len(digits) - 1
        lines.append(
            f"{x}*{d}+{carry}={p}, write {p}"
            if last
            else f"{x}*{d}+{carry}={p}, write {p % 10}, carry {p // 10}"
        )
        carry = p // 10
    return lines


def _add(x: int, y: int) -> list[str]:
    """Column addition of ``x + y`` with carries, least significant column first."""
    lines, carry = [f"{x}+{y}:"], 0
    width = max(len(str(x)), len(str(y)))
    sx, sy = str(x).zfill(width)[::-1], str(y).zfill(width)[::-1]
    for i in range(width):
        s = int(sx[i]) + int(sy[i]) + carry
        last = i == width - 1
        lines.append(
            f"{sx[i]}+{sy[i]}+{carry}={s}, write {s}"
            if last
            else f"{sx[i]}+{sy[i]}+{carry}={s}, write {s % 10}, carry {s // 10}"
        )
        carry = s // 10
    return lines


def multiplication_trace(a: int, b: int) -> str:
    """The long-hand product: one partial product per digit of ``b`` (shifted), then a running sum."""
    lines, partials = [], []
    for k, d in enumerate(int(c) for c in str(b)[::-1]):
        lines += _times_digit(a, d)
        value = a * d * 10**k
        lines.append(f"={a * d}" + (f", shifted {k}: {value}" if k else ""))
        partials.append(value)
    acc = partials[0]
    for p in partials[1:]:
        lines += _add(acc, p)
        acc += p
        lines.append(f"={acc}")
    return "\n".join([*lines, f"\\boxed{{{a * b}}}"])


def multiplication_tokens(digits_a: int, digits_b: int) -> int:
    """Rough response length in tokens for a tokenizer with single-digit tokens (~12 per line)."""
    lines = digits_b * (digits_a + 2) + (digits_b - 1) * (digits_a + digits_b + 2) + 1
    return 12 * lines


@register
class LongCoT(Environment):
    name = "long_cot"
    system_prompt = "Think step by step. Give the final integer answer as \\boxed{N}."
    max_turns = 1
    stop_conditions = (BOXED_ANSWER,)  # the turn ends with the token that closes its answer

    def step(self, action: str) -> StepResult:
        return answer_step(action)

    @classmethod
    def load_tasks(cls, split: str, n: int | None = None, seed: int = 0, **knobs: Any) -> list[Task]:
        """Long-hand multiplication; knobs ``digits_a``, ``digits_b``."""
        return sample_tasks("long_cot", lambda rng: make_multiplication(rng, **knobs), split, n, seed)

    @classmethod
    def demonstrations(cls, tasks: Sequence[Task], seed: int = 0) -> list[list[Message]]:
        """Full traces; half of them multiply the other way round (``b*a``): both are right."""
        demos = []
        for task in tasks:
            meta = task.metadata
            if "a" in meta:
                a, b = meta["a"], meta["b"]
                if demo_rng(seed, task).random() < 0.5:
                    a, b = b, a
                text = multiplication_trace(a, b)
            elif meta.get("solution"):
                text = solution_to_demo(str(meta["solution"]), task.answer)
            else:
                raise ValueError(f"task {task.id!r} has neither factors nor a reference solution")
            demos.append([*first_messages(cls.system_prompt, task), {"role": "assistant", "content": text}])
        return demos

    def rewards(self) -> list[Reward]:
        return [
            Reward("correct", correct, 1.0),
            Reward("has_answer", has_answer, 0.0),
            Reward("response_chars", response_chars, 0.0),
        ]
