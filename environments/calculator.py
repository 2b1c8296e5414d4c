"""calculator: multi-turn arithmetic with a JSON-called calculator tool.

The model reads an arithmetic question, calls ``calculate`` one or more times with
``<tool_call>{"name": "calculate", "arguments": {"expression": "..."}}</tool_call>``, reads the
result, and answers in ``\\boxed{}``. Many completions are correct (operands of + and * in any order,
one call or several), so there is something for exploration to keep. The calculator is a safe
arithmetic evaluator over an AST: no model code ever runs.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import operator
import random
from collections.abc import Sequence
from typing import Any, ClassVar

from agentrl.env import Environment, EpisodeState, Message, Reward, Task, ToolFeedback, register, tool
from agentrl.tools import format_tool_call

_OPS: dict[type, Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


def safe_eval(expression: str, max_abs: int = 10**12) -> int:
    """Evaluate integer arithmetic (+ - * // %, parentheses, unary minus). Anything else, or a
    result beyond ``max_abs``, raises ``ToolFeedback`` with a message for the model."""
    if len(expression) > 200:
        raise ToolFeedback("expression too long (max 200 characters)")
    try:
        tree = ast.parse(expression.replace("×", "*").replace("÷", "//"), mode="eval")
    except SyntaxError as e:
        raise ToolFeedback(f"cannot parse {expression!r}: {e.msg}") from None

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, (ast.FloorDiv, ast.Mod)) and right == 0:
                raise ToolFeedback("division by zero")
            v = _OPS[type(node.op)](left, right)
            if abs(v) > max_abs:
                raise ToolFeedback("result too large")
            return v
        raise ToolFeedback(
            f"unsupported syntax {ast.unparse(node)!r}: use integers, + - * // % and parentheses"
        )

    return ev(tree)


def make_task(rng: random.Random, n_operands: int, max_value: int) -> Task:
    nums = [rng.randint(2, max_value) for _ in range(n_operands)]
    ops = [rng.choice("+-*") for _ in range(n_operands - 1)]
    expr = str(nums[0])
    for op, n in zip(ops, nums[1:]):
        expr += f" {op} {n}"
    if n_operands >= 3 and rng.random() < 0.5:  # parenthesise the first pair sometimes
        first, rest = expr.split(" ", 3)[:3], expr.split(" ", 3)[3:]
        expr = f"({' '.join(first)})" + (f" {rest[0]}" if rest else "")
    answer = safe_eval(expr)
    return Task(id=f"calc-{expr}", prompt=f"What is {expr}?", answer=answer, metadata={"expression": expr})


def _split_of(task_id: str, test_fraction: float) -> str:
    h = int(hashlib.sha256(task_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "test" if h < test_fraction else "train"


def _equivalent_forms(expr: str, rng: random.Random, spacing: bool = False) -> str:
    """A random expression equal to ``expr``: the operands of a top-level + or * commuted half the
    time, and with ``spacing`` the spaces around operators dropped a quarter of the time."""
    tree = ast.parse(expr, mode="eval").body
    if isinstance(tree, ast.BinOp) and isinstance(tree.op, (ast.Add, ast.Mult)) and rng.random() < 0.5:
        op = "+" if isinstance(tree.op, ast.Add) else "*"
        left, right = ast.unparse(tree.left), ast.unparse(tree.right)
        if isinstance(tree.right, ast.BinOp):
            right = f"({right})"
        expr = f"{right} {op} {left}"
    if spacing and rng.random() < 0.25:
        expr = expr.replace(" ", "")
    return expr


TEACHERS = ("one", "diverse")
# What the teacher may say before its call and after the result: several phrasings, all correct, so
# a warm start learns a distribution over them (entropy that RL can keep or collapse).
_BEFORE_CALL = ("", "", "Let me calculate {expr}.\n", "I'll use the calculator.\n")
_AFTER_RESULT = (
    "The answer is \\boxed{{{answer}}}.",
    "\\boxed{{{answer}}}",
    "{expr} = \\boxed{{{answer}}}.",
    "So the result is \\boxed{{{answer}}}.",
)


@register
class Calculator(Environment):
    name = "calculator"
    system_prompt = (
        "Solve the arithmetic question. Use the calculate tool, then give the final answer as \\boxed{N}."
    )
    tool_format = "json"
    max_turns = 4
    n_operands: ClassVar[int] = 3
    max_value: ClassVar[int] = 30

    @tool
    def calculate(self, expression: str) -> str:
        """Evaluate an integer arithmetic expression.

        Args:
            expression: integers with + - * // % and parentheses, e.g. "(3 + 4) * 5".
        """
        return str(safe_eval(expression))

    @classmethod
    def load_tasks(cls, split: str, n: int | None = None, seed: int = 0, **options: Any) -> list[Task]:
        """Distinct tasks from a seeded generator; train/test split by a hash of the expression, so
        the splits never overlap whatever the seed or count."""
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        unknown = sorted(set(options) - {"n_operands", "max_value", "teacher"})
        if unknown:
            raise TypeError(
                f"calculator's tasks take n_operands, max_value and teacher, not {', '.join(unknown)}"
            )
        n_operands = int(options.get("n_operands", cls.n_operands))
        max_value = int(options.get("max_value", cls.max_value))
        if n_operands < 1 or max_value < 2:
            raise ValueError(
                f"calculator: needs n_operands >= 1 and max_value >= 2, got {n_operands} and {max_value}"
            )
        teacher = str(options.get("teacher", "one"))
        if teacher not in TEACHERS:
            raise ValueError(f"calculator: data.options.teacher={teacher!r}; valid: {', '.join(TEACHERS)}")
        want = 256 if n is None else n
        rng = random.Random(f"calculator-{split}-{seed}-{n_operands}-{max_value}")
        tasks: dict[str, Task] = {}
        for _ in range(want * 200):
            if len(tasks) == want:
                break
            task = make_task(rng, n_operands, max_value)
            if _split_of(task.id, 0.2) == split:
                tasks.setdefault(task.id, task)
        if n is not None and len(tasks) < n:
            raise ValueError(
                f"calculator: found only {len(tasks)} distinct {split} tasks of {n} with n_operands={n_operands}, "
                f"max_value={max_value}: raise max_value or n_operands, or ask for fewer (data.num_train/num_test)"
            )
        # how the solver demonstrates each task (SFT only; RL never reads it)
        return [dataclasses.replace(t, metadata={**t.metadata, "teacher": teacher}) for t in tasks.values()]

    @classmethod
    def demonstrations(cls, tasks: Sequence[Task], seed: int = 0) -> list[list[Message]]:
        """Solver demonstrations: one call with the expression (operands of + and * in either
        order), the tool's answer, then the boxed result. A task drawn with
        ``data.options.teacher: diverse`` is demonstrated more diversely: an optional sentence
        before the call, the expression with or without spaces, and one of four phrasings of the
        answer (the default, ``one``, always says "The answer is \\boxed{N}.")."""
        rng = random.Random(seed)
        env = cls()
        demos = []
        for task in tasks:
            asked = task.metadata["expression"]
            diverse = task.metadata.get("teacher", "one") == "diverse"
            expr = _equivalent_forms(asked, rng, spacing=diverse)
            msgs = env.reset(task, seed)
            call = format_tool_call("calculate", {"expression": expr})
            before = rng.choice(_BEFORE_CALL).format(expr=asked) if diverse else ""
            msgs.append({"role": "assistant", "content": before + call})
            msgs.append({"role": "tool", "name": "calculate", "content": env.calculate(expr)})
            after = rng.choice(_AFTER_RESULT) if diverse else _AFTER_RESULT[0]
            msgs.append({"role": "assistant", "content": after.format(expr=asked, answer=task.answer)})
            demos.append(msgs)
        return demos

    def rewards(self) -> list[Reward]:
        return [
            Reward("correct", correct, 1.0),
            Reward("used_tool", used_tool, 0.0),
        ]


def correct(task: Task, state: EpisodeState) -> float:
    answer = state.info.get("answer")
    if answer is None:
        return 0.0
    try:
        return float(int(str(answer).replace(",", "").strip()) == int(task.answer))
    except ValueError:
        return 0.0


def used_tool(task: Task, state: EpisodeState) -> float:
    return float(any(m.get("role") == "tool" for m in state.messages))
