"""countdown: reach a target with given numbers; many different answers are right.

``Numbers: 3 7 25. Target: 46.`` The model answers with an arithmetic expression in ``\\boxed{}``
(``25+3*7``, ``3*7+25``, ...), using each number at most once (all of them with ``use_all=True``)
and ``+ - * /`` with parentheses. The verifier parses the expression with ``ast`` (integers and the
four operations only), checks the numbers against the given multiset and evaluates it exactly with
fractions: nothing the model writes is executed.

Targets are chosen among values the given numbers can reach with at least ``min_solutions``
genuinely different expressions (operand order of ``+``/``*`` not counted), so there is something
for exploration to find and entropy has value. The solver enumerates every expression (positive
integer intermediates) for up to 4 numbers, or samples random expression trees beyond that, and
the demonstrations pick one solution at random: the boxed expression alone, or with
``show_steps=True`` its steps first (one ``a op b = c`` line each). Knobs: ``num_numbers`` (3),
``max_number`` (12), ``min_target``/``max_target`` (2/60), ``min_solutions`` (2), ``use_all``
(False), ``show_steps`` (False: a 2 M-parameter model warm-started for 300 steps invented numbers in
the steps and reached 0.4% mean@4; the bare expression teaches it to copy the given numbers).
"""

from __future__ import annotations

import ast
import functools
import random
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction
from typing import Any, NamedTuple

from agentrl.env import Environment, EpisodeState, Message, Reward, StepResult, Task, register
from environments.generators import Draw, demo_rng, first_messages, sample_tasks
from environments.rewards import final_answer, has_answer
from environments.short_cot import answer_step


class Expr(NamedTuple):
    value: int
    text: str
    prec: int
    """3 for a number, 2 for * and /, 1 for + and -: decides where parentheses go."""
    canon: str
    """Text with the operands of + and * sorted: equal for solutions that only commute."""
    steps: tuple[str, ...]


def _wrap(e: Expr, below: int) -> str:
    return f"({e.text})" if e.prec < below else e.text


def _node(a: Expr, op: str, b: Expr, value: int, text: str, prec: int, commutes: bool) -> Expr:
    left, right = sorted((a.canon, b.canon)) if commutes else (a.canon, b.canon)
    return Expr(
        value, text, prec, f"({left}{op}{right})", (*a.steps, *b.steps, f"{a.value}{op}{b.value}={value}")
    )


def combine(x: Expr, y: Expr) -> list[Expr]:
    """Every ``x op y`` and ``y op x`` with a positive integer result, excluding no-ops (``*1``, ``/1``)."""
    out = []
    for a, b in ((x, y), (y, x)):
        out.append(_node(a, "+", b, a.value + b.value, f"{a.text}+{b.text}", 1, True))
        if a.value > b.value:
            out.append(_node(a, "-", b, a.value - b.value, f"{a.text}-{_wrap(b, 2)}", 1, False))
        if a.value > 1 and b.value > 1:
            out.append(_node(a, "*", b, a.value * b.value, f"{_wrap(a, 2)}*{_wrap(b, 2)}", 2, True))
        if b.value > 1 and a.value % b.value == 0:
            out.append(_node(a, "/", b, a.value // b.value, f"{_wrap(a, 2)}/{_wrap(b, 3)}", 2, False))
    return out


def _atom(n: int) -> Expr:
    return Expr(n, str(n), 3, str(n), ())


def all_solutions(numbers: tuple[int, ...], use_all: bool) -> dict[int, dict[str, list[Expr]]]:
    """value -> canonical form -> expressions, by exhaustive search (for up to ~4 numbers)."""
    found: dict[int, dict[str, list[Expr]]] = {}

    def record(e: Expr) -> None:
        variants = found.setdefault(e.value, {}).setdefault(e.canon, [])
        if all(v.text != e.text for v in variants):
            variants.append(e)

    def search(items: tuple[Expr, ...]) -> None:
        if not use_all or len(items) == 1:
            for e in items:
                if e.prec < 3:  # a bare given number is not a solution
                    record(e)
        for i in range(len(items)):
            for j in range(i + 1, len(items)):
                rest = items[:i] + items[i + 1 : j] + items[j + 1 :]
                for e in combine(items[i], items[j]):
                    search((*rest, e))

    search(tuple(_atom(n) for n in numbers))
    return found


def sampled_solutions(
    numbers: tuple[int, ...], use_all: bool, rng: random.Random, tries: int = 3000
) -> dict[int, dict[str, list[Expr]]]:
    """Like ``all_solutions`` from random expression trees (for many numbers, where enumerating
    every expression is too slow); misses some solutions, never reports a wrong one."""
    found: dict[int, dict[str, list[Expr]]] = {}
    for _ in range(tries):
        k = len(numbers) if use_all else rng.randint(2, len(numbers))
        items = [_atom(n) for n in rng.sample(numbers, k)]
        while len(items) > 1:
            x, y = items.pop(rng.randrange(len(items))), items.pop(rng.randrange(len(items)))
            items.append(rng.choice(combine(x, y)))
        e = items[0]
        variants = found.setdefault(e.value, {}).setdefault(e.canon, [])
        if all(v.text != e.text for v in variants):
            variants.append(e)
    return found


@functools.lru_cache(maxsize=8192)
def _counts(numbers: tuple[int, ...], use_all: bool) -> dict[int, int]:
    """value -> number of canonical solutions; cached (it is small) to draw many tasks quickly."""
    return {v: len(forms) for v, forms in all_solutions(numbers, use_all).items()}


def solutions_for(
    numbers: Sequence[int], use_all: bool, rng: random.Random
) -> dict[int, dict[str, list[Expr]]]:
    key = tuple(sorted(numbers))
    return all_solutions(key, use_all) if len(key) <= 4 else sampled_solutions(key, use_all, rng)


def make_countdown(
    rng: random.Random,
    num_numbers: int = 3,
    max_number: int = 12,
    min_target: int = 2,
    max_target: int = 60,
    min_solutions: int = 2,
    use_all: bool = False,
    show_steps: bool = False,
) -> Draw:
    for _ in range(1000):
        numbers = [rng.randint(1, max_number) for _ in range(num_numbers)]
        key = tuple(sorted(numbers))
        sampled = sampled_solutions(key, use_all, rng) if len(key) > 4 else None
        counts = _counts(key, use_all) if sampled is None else {v: len(f) for v, f in sampled.items()}
        targets = [
            v
            for v in sorted(counts)
            if min_target <= v <= max_target and v not in numbers and counts[v] >= min_solutions
        ]
        if targets:
            break
    else:
        raise ValueError(
            "countdown: no target satisfies the knobs; lower min_solutions or widen the target range"
        )
    target = rng.choice(targets)
    rule = "all the numbers once" if use_all else "each number at most once"
    prompt = f"Numbers: {' '.join(map(str, numbers))}. Target: {target}. Use {rule} with + - * /."
    meta = {
        "family": "countdown",
        "numbers": numbers,
        "target": target,
        "use_all": use_all,
        "num_solutions": counts[target],
        "show_steps": show_steps,
    }
    if sampled is not None:  # kept for the demos, whose own random search may miss the target
        example = next(iter(sampled[target].values()))[0]
        meta["example"] = [*example.steps, example.text]
    return f"countdown|{list(key)}|{target}|{use_all}", prompt, target, meta


# -- the verifier ---------------------------------------------------------------------------------
_BIN = (ast.Add, ast.Sub, ast.Mult, ast.Div)


def evaluate(expression: str) -> tuple[Fraction, list[int]] | None:
    """Exact value and the integers used, for ``+ - * /`` over integers; None for anything else
    (other syntax, division by zero, a non-integer literal, or more than 200 characters)."""
    s = expression
    for a, b in (
        ("\\times", "*"),
        ("\\cdot", "*"),
        ("\\div", "/"),
        ("×", "*"),
        ("÷", "/"),
        ("\\left", ""),
        ("\\right", ""),
    ):
        s = s.replace(a, b)
    if len(s) > 200:
        return None
    try:
        tree = ast.parse(s.strip(), mode="eval").body
    except (SyntaxError, ValueError):
        return None
    used: list[int] = []

    def ev(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            used.append(node.value)
            return Fraction(node.value)
        if isinstance(node, ast.BinOp) and isinstance(node.op, _BIN):
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Add):
                return a + b
            if isinstance(node.op, ast.Sub):
                return a - b
            if isinstance(node.op, ast.Mult):
                return a * b
            return a / b
        raise ValueError("unsupported syntax")

    try:
        return ev(tree), used
    except (ValueError, ZeroDivisionError, RecursionError):
        return None


def check_solution(expression: str, numbers: Sequence[int], target: int, use_all: bool = False) -> bool:
    """True when ``expression`` equals ``target`` using only the given numbers (each at most once, or
    exactly once with ``use_all``). A trailing ``= target`` is accepted."""
    lhs, sep, rhs = expression.rpartition("=")
    if sep and rhs.strip() == str(target):
        expression = lhs
    result = evaluate(expression)
    if result is None:
        return False
    value, used = result
    have, want = Counter(used), Counter(numbers)
    fits = have == want if use_all else all(have[k] <= want[k] for k in have)
    return fits and value == target


def reaches_target(task: Task, state: EpisodeState) -> float:
    """1 when the boxed expression reaches the target with the allowed numbers."""
    answer = final_answer(state)
    meta = task.metadata
    return float(
        answer is not None and check_solution(answer, meta["numbers"], meta["target"], meta["use_all"])
    )


def uses_given_numbers(task: Task, state: EpisodeState) -> float:
    """Metric: the expression parses and uses only allowed numbers (right or wrong value)."""
    answer = final_answer(state)
    result = evaluate(answer) if answer is not None else None
    if result is None:
        return 0.0
    have, want = Counter(result[1]), Counter(task.metadata["numbers"])
    return float(all(have[k] <= want[k] for k in have))


@register
class Countdown(Environment):
    name = "countdown"
    system_prompt = "Reach the target. Give the expression as \\boxed{expression}."
    max_turns = 1

    def step(self, action: str) -> StepResult:
        return answer_step(action)

    @classmethod
    def load_tasks(cls, split: str, n: int | None = None, seed: int = 0, **knobs: Any) -> list[Task]:
        """Solvable countdown problems; knobs go to ``make_countdown``."""
        return sample_tasks("countdown", lambda rng: make_countdown(rng, **knobs), split, n, seed)

    @classmethod
    def demonstrations(cls, tasks: Sequence[Task], seed: int = 0) -> list[list[Message]]:
        """One random solution per task (a random canonical form, then a random operand order):
        the boxed expression, after its steps one per line when the task says ``show_steps``."""
        demos = []
        for task in tasks:
            rng = demo_rng(seed, task)
            meta = task.metadata
            forms = solutions_for(meta["numbers"], meta["use_all"], rng).get(meta["target"])
            if forms:
                e = rng.choice(forms[rng.choice(sorted(forms))])
                steps, expression = list(e.steps), e.text
            else:
                *steps, expression = meta["example"]
            shown = steps if meta.get("show_steps") else []
            text = "\n".join([*shown, f"\\boxed{{{expression}}}"])
            demos.append([*first_messages(cls.system_prompt, task), {"role": "assistant", "content": text}])
        return demos

    def rewards(self) -> list[Reward]:
        return [
            Reward("correct", reaches_target, 1.0),
            Reward("has_answer", has_answer, 0.0),
            Reward("uses_given_numbers", uses_given_numbers, 0.0),
        ]
