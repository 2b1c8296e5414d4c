"""Seeded synthetic task generators shared by the built-in environments, and their exact solvers.

Conventions every generator here follows:

- **Seeded and deterministic**: tasks come from ``random.Random(f"{family}:{split}:{seed}")``; the same
  arguments give the same list, in the same order, on every machine (string seeds hash with SHA-512,
  independent of ``PYTHONHASHSEED``).
- **Held-out splits that never overlap**: each task has a canonical *key* (its parameters, with
  commutative parts sorted, so ``3 7 9 -> 30`` and ``9 3 7 -> 30`` share one key); the key's SHA-256
  decides its split (``test`` for a ``TEST_FRACTION`` share). A key lands in the same split for every
  seed, count and difficulty knob, so no test problem is ever trained on. Task ids are
  ``{family}-{hash of key}``: the same problem has the same id everywhere.
- **Demonstrations are diverse**: solvers take a per-task RNG (``demo_rng(seed, task)``) and sample
  among valid solutions (operand orders, step orders, code variants) instead of always writing one.

This module holds the helpers plus two families without an environment module of their own here:
arithmetic word problems (``short_cot``) and arithmetic-with-code (for ``code_interpreter``).
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import io
import random
from collections.abc import Callable, Sequence
from typing import Any

from agentrl.env import Message, Task

TEST_FRACTION = 0.2
"""Share of the key space held out for ``test``."""
DEFAULT_N = {"train": 1000, "test": 200}
"""Tasks returned when ``n`` is None."""


def split_of(key: str, test_fraction: float = TEST_FRACTION) -> str:
    """``train`` or ``test`` for a canonical task key, by hash: stable for every seed and knob."""
    h = int(hashlib.sha256(key.encode()).hexdigest()[:12], 16) / float(16**12)
    return "test" if h < test_fraction else "train"


def task_id(family: str, key: str) -> str:
    return f"{family}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def demo_rng(seed: int, task: Task) -> random.Random:
    """The RNG for one task's demonstration: independent of where the task sits in the list."""
    return random.Random(f"demo:{seed}:{task.id}")


Draw = tuple[str, str, Any, dict[str, Any]]
"""What a family's ``make(rng)`` returns: (canonical key, prompt, answer, metadata)."""


def sample_tasks(
    family: str, make: Callable[[random.Random], Draw], split: str, n: int | None, seed: int
) -> list[Task]:
    """Draw distinct tasks of one split. Raises when the knobs leave too few distinct problems
    (rather than looping forever or silently repeating test problems)."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    want = DEFAULT_N[split] if n is None else n
    rng = random.Random(f"{family}:{split}:{seed}")
    tasks: dict[str, Task] = {}
    for _ in range(50 * want + 1000):
        if len(tasks) >= want:
            return list(tasks.values())
        key, prompt, answer, metadata = make(rng)
        if split_of(key) == split and key not in tasks:
            tasks[key] = Task(id=task_id(family, key), prompt=prompt, answer=answer, metadata=metadata)
    raise ValueError(
        f"{family}: found only {len(tasks)} distinct {split} tasks of {want} requested; "
        "raise the difficulty knobs (larger numbers, more steps) or ask for fewer tasks"
    )


def first_messages(system_prompt: str | None, task: Task) -> list[Message]:
    """What ``Environment.reset`` returns by default (demos must start with exactly this)."""
    msgs: list[Message] = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return [*msgs, {"role": "user", "content": task.prompt}]


# -- arithmetic word problems (short_cot) ------------------------------------------------------
_NAMES = ("Ann", "Ben", "Cal", "Dee", "Eli", "Fay", "Gus", "Ivy", "Jo", "Kim")
_THINGS = ("apple", "card", "coin", "shell", "stamp", "marble", "pen", "book", "egg", "cup")


def make_word_problem(
    rng: random.Random, steps: int = 2, max_value: int = 20, max_factor: int = 5, ops: str = "+-*"
) -> Draw:
    """A short story: a start amount, then ``steps`` changes (``+`` gets k, ``-`` gives away k,
    ``*`` buys a packs of b, ``x`` gives a friends b each). The count never goes negative.
    Metadata ``terms`` holds the start and the changes as (sign, a, b): the change is sign*a*b."""
    name, thing = rng.choice(_NAMES), rng.choice(_THINGS)
    total = rng.randint(2, max_value)
    sentences = [f"{name} has {total} {thing}s."]
    terms: list[tuple[int, int, int]] = [(1, total, 1)]  # (sign, a, b): the change is sign*a*b
    for _ in range(steps):
        kind = rng.choice(ops)
        a, b = rng.randint(2, max_factor), rng.randint(2, max_factor)
        k = rng.randint(1, max_value)
        if kind == "-" and k <= total:
            sentences.append(f"{name} gives away {k}.")
            terms.append((-1, k, 1))
        elif kind == "x" and a * b <= total:
            sentences.append(f"{name} gives {a} friends {b} each.")
            terms.append((-1, a, b))
        elif kind == "*":
            sentences.append(f"{name} buys {a} packs of {b}.")
            terms.append((1, a, b))
        else:  # "+", or a subtraction that would go below zero
            sentences.append(f"{name} gets {k} more.")
            terms.append((1, k, 1))
        total += terms[-1][0] * terms[-1][1] * terms[-1][2]
    prompt = " ".join(sentences) + f" How many {thing}s does {name} have now?"
    key = f"word|{terms}"  # the arithmetic, not the names: a test problem is never a renamed train one
    return key, prompt, total, {"family": "word_problem", "terms": terms, "steps": steps}


def solve_word_problem(terms: Sequence[Sequence[int]], rng: random.Random) -> str:
    """Worked solution: products first (factors in random order), then the signed terms folded in
    a random order that keeps every partial count >= 0. Ends with ``\\boxed{answer}``."""
    lines, values = [], []
    for sign, a, b in terms:
        if b != 1:
            x, y = (a, b) if rng.random() < 0.5 else (b, a)
            lines.append(f"{x}*{y}={a * b}")
        values.append(sign * a * b)
    order = _nonnegative_order(values, rng)
    acc = values[order[0]]
    for i in order[1:]:
        v = values[i]
        new = acc + v
        if v < 0:
            lines.append(f"{acc}-{-v}={new}")
        elif rng.random() < 0.5:
            lines.append(f"{v}+{acc}={new}")
        else:
            lines.append(f"{acc}+{v}={new}")
        acc = new
    return "\n".join([*lines, f"\\boxed{{{acc}}}"])


def _nonnegative_order(values: list[int], rng: random.Random) -> list[int]:
    """A random order of the terms, starting with a positive one, whose running sums stay >= 0
    (the story order always qualifies, so a few tries suffice)."""
    for _ in range(8):
        order = rng.sample(range(len(values)), len(values))
        acc, ok = 0, values[order[0]] > 0
        for i in order:
            acc += values[i]
            ok = ok and acc >= 0
        if ok:
            return order
    return list(range(len(values)))


# -- arithmetic with code (code_interpreter) ----------------------------------------------------
def make_code_arithmetic(
    rng: random.Random, num_terms: int = 3, digits: int = 3, max_n: int = 200, kinds: str = "expr,range_sum"
) -> Draw:
    """``expr``: "What is 482 * 37 + 911?" (``num_terms`` numbers of ``digits`` digits);
    ``range_sum``: "What is the sum of the numbers from 1 to 57 that are divisible by 3?"."""
    kind = rng.choice(kinds.split(","))
    if kind == "range_sum":
        hi, d = rng.randint(10, max_n), rng.randint(2, 9)
        prompt = f"What is the sum of the numbers from 1 to {hi} that are divisible by {d}?"
        answer = sum(i for i in range(1, hi + 1) if i % d == 0)
        return (
            f"range_sum|{hi}|{d}",
            prompt,
            answer,
            {"family": "code_arithmetic", "kind": kind, "hi": hi, "d": d},
        )
    if kind != "expr":
        raise ValueError(f"unknown code-arithmetic kind {kind!r}; valid: expr, range_sum")
    nums = [rng.randint(10 ** (digits - 1), 10**digits - 1) for _ in range(num_terms)]
    expr = str(nums[0])
    for n in nums[1:]:
        expr += f" {rng.choice('+-*')} {n}"
    answer = eval(
        compile(ast.parse(expr, mode="eval"), "<expr>", "eval"), {"__builtins__": {}}
    )  # own digits and + - *
    return (
        f"expr|{expr}",
        f"What is {expr}?",
        answer,
        {"family": "code_arithmetic", "kind": kind, "expression": expr},
    )


def code_for(task: Task, rng: random.Random) -> str:
    """One of several correct programs for a code-arithmetic task."""
    meta = task.metadata
    if meta["kind"] == "range_sum":
        hi, d = meta["hi"], meta["d"]
        return rng.choice(
            [
                f"print(sum(i for i in range(1, {hi + 1}) if i % {d} == 0))",
                f"print(sum(range({d}, {hi + 1}, {d})))",
                f"total = 0\nfor i in range(1, {hi + 1}):\n"
                f"    if i % {d} == 0:\n        total += i\nprint(total)",
            ]
        )
    expr = _commute(meta["expression"], rng)
    return rng.choice([f"print({expr})", f"result = {expr}\nprint(result)", f"x = {expr}\nprint(x)"])


def _commute(expr: str, rng: random.Random) -> str:
    """Swap the operands of the top-level + or * half the time (same value, different text)."""
    tree = ast.parse(expr, mode="eval").body
    if isinstance(tree, ast.BinOp) and isinstance(tree.op, (ast.Add, ast.Mult)) and rng.random() < 0.5:
        tree = ast.BinOp(left=tree.right, op=tree.op, right=tree.left)
        return ast.unparse(tree)
    return expr


def run_trusted(code: str) -> str:
    """Stdout of a program this module wrote (never model output: that goes to a sandbox)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(code, {"__builtins__": {"print": print, "range": range, "sum": sum}})
    return buf.getvalue()


def code_arithmetic_demos(
    tasks: Sequence[Task],
    seed: int = 0,
    first: Callable[[Task], list[Message]] | None = None,
    render_output: Callable[[str], str] = str.rstrip,
) -> list[list[Message]]:
    """Tool-using demonstrations for a code interpreter: write a ```python block, read what it
    prints (a ``tool`` message), answer in ``\\boxed{}``. ``first`` gives the opening messages (pass
    the environment's ``reset``); ``render_output`` turns stdout into the tool message text (pass
    the environment's own formatting so replays match)."""
    demos = []
    for task in tasks:
        rng = demo_rng(seed, task)
        code = code_for(task, rng)
        msgs = first(task) if first else [{"role": "user", "content": task.prompt}]
        msgs = [
            *msgs,
            {"role": "assistant", "content": f"```python\n{code}\n```"},
            {"role": "tool", "name": "python", "content": render_output(run_trusted(code))},
            {"role": "assistant", "content": f"\\boxed{{{task.answer}}}"},
        ]
        demos.append(msgs)
    return demos


def code_arithmetic_tasks(split: str, n: int | None = None, seed: int = 0, **knobs: Any) -> list[Task]:
    """Tasks for a code-interpreter environment (knobs: see ``make_code_arithmetic``)."""
    return sample_tasks("code_arith", lambda rng: make_code_arithmetic(rng, **knobs), split, n, seed)
