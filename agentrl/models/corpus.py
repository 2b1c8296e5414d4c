"""A deterministic synthetic text corpus for training the tiny models' BPE tokenizer.

Tiny models are built offline, so their tokenizer cannot come from a hub. The corpus below is generated
by code from a seed and covers what the tiny models will read and write: English math word problems
with worked solutions, digits and arithmetic, LaTeX-ish answers (``\\boxed{}``, ``\\frac{}{}``), Python
code, fenced ```python blocks and their output, JSON tool calls in ``<tool_call>`` tags, and whole
ChatML conversations with system/user/assistant/tool turns. Same seed, same text, byte for byte, so the
tokenizer (and every id a test pins) is reproducible.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator

NAMES = (
    "Alice", "Bob", "Carla", "David", "Emma", "Farid", "Grace", "Hiro", "Ines", "James", "Kofi", "Lena",
    "Maya", "Noah", "Olga", "Pedro", "Quinn", "Rosa", "Sam", "Tara", "Umar", "Vera", "Wei", "Yara", "Zoe",
)  # fmt: skip
ITEMS = (
    "apples", "books", "coins", "marbles", "pencils", "stickers", "cookies", "tickets", "shells", "cards",
    "eggs", "flowers", "stamps", "boxes", "bottles", "candles", "balloons", "oranges", "cupcakes", "toys",
)  # fmt: skip
PLACES = ("store", "market", "school", "library", "park", "bakery", "garden", "farm", "museum", "office")
UNITS = ("dollars", "meters", "hours", "minutes", "kilograms", "liters", "miles", "days", "weeks", "points")
WORDS = (
    "the", "a", "of", "and", "to", "in", "is", "that", "it", "for", "on", "with", "as", "was", "each", "how",
    "many", "much", "more", "less", "than", "total", "left", "after", "before", "every", "what", "which",
    "number", "sum", "product", "difference", "twice", "half", "times", "result", "answer", "first",
    "second", "then", "so", "we", "need", "find", "compute", "value", "let", "there", "are", "has", "have",
    "buys", "sells", "gives", "gets", "spends", "earns", "remaining", "altogether", "per", "average",
    "price", "cost", "speed", "distance", "time", "rate", "equal", "divide", "multiply", "add", "subtract",
    "step", "check", "because", "therefore", "question", "problem", "solution", "simple", "function",
    "returns", "prints", "list", "string", "integer", "call", "tool", "result", "output", "error",
)  # fmt: skip
TOOL_NAMES = ("calculator", "python", "search", "lookup", "get_weather", "add", "multiply", "convert")
SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "You are a careful math tutor. Reason step by step and put the final answer in \\boxed{}.",
    "You solve problems with Python. Write code in ```python blocks; the output is returned to you.",
    "You are an agent that uses tools. Call a tool when it helps, then give the final answer.",
    "Answer briefly.",
)
UNICODE_LINES = (
    "café naïve résumé über straße",
    "π ≈ 3.14159, √2 ≈ 1.414, 3 × 4 = 12, 10 ÷ 2 = 5, x² + y² = r²",
    "温度は 25 度です。数学 математика μαθηματικά",
    "emoji: 🙂 🚀 ✅ — “quotes” and ‘single’ … done",
)


def _expr(rng: random.Random, depth: int = 0) -> str:
    """A random arithmetic expression (integers, + - * /, parentheses)."""
    if depth > 1 or rng.random() < 0.4:
        return str(rng.randint(0, 10 ** rng.randint(1, 4)))
    op = rng.choice(("+", "-", "*", "/", "+", "-"))
    left, right = _expr(rng, depth + 1), _expr(rng, depth + 1)
    text = f"{left} {op} {right}"
    return f"({text})" if depth and rng.random() < 0.5 else text


def _safe_eval(expr: str) -> str:
    try:
        value = eval(expr, {"__builtins__": {}}, {})  # our own generated arithmetic only
    except ZeroDivisionError:
        return "undefined"
    if isinstance(value, float):
        return str(round(value, 4))
    return str(value)


def word_problem(rng: random.Random) -> tuple[str, str]:
    """A word problem and a worked solution ending in a boxed answer."""
    name, other = rng.sample(NAMES, 2)
    item, place = rng.choice(ITEMS), rng.choice(PLACES)
    a, b, c = rng.randint(2, 60), rng.randint(2, 40), rng.randint(2, 12)
    kind = rng.randrange(4)
    if kind == 0:
        q = f"{name} has {a} {item}. {name} buys {b} more at the {place} and gives {c} to {other}. How many {item} does {name} have now?"
        s = f"{name} starts with {a} {item}. After buying {b}, {name} has {a} + {b} = {a + b}. Giving away {c} leaves {a + b} - {c} = {a + b - c}."
        ans = str(a + b - c)
    elif kind == 1:
        q = f"Each box holds {c} {item}. {name} fills {b} boxes. How many {item} are there in total?"
        s = f"There are {b} boxes with {c} {item} each, so the total is {b} * {c} = {b * c}."
        ans = str(b * c)
    elif kind == 2:
        q = f"{name} shares {a * c} {item} equally among {c} friends. What fraction of the {item} does each friend get, and how many is that?"
        s = f"Each friend gets \\frac{{1}}{{{c}}} of the {item}, which is {a * c} / {c} = {a}."
        ans = str(a)
    else:
        unit = rng.choice(UNITS)
        q = f"A trip takes {a} {unit} on the first day and {b} {unit} on the second day. What is the average per day?"
        avg = (a + b) / 2
        s = f"The total is {a} + {b} = {a + b}. The average is \\frac{{{a + b}}}{{2}} = {avg:g}."
        ans = f"{avg:g}"
    return q, f"{s} The answer is \\boxed{{{ans}}}."


def arithmetic_line(rng: random.Random) -> str:
    expr = _expr(rng)
    return f"{expr} = {_safe_eval(expr)}"


def python_snippet(rng: random.Random) -> tuple[str, str]:
    """A short Python program and what it prints."""
    n, m, k = rng.randint(2, 20), rng.randint(1, 9), rng.randint(2, 5)
    var = rng.choice(("x", "n", "total", "result", "value", "count", "s", "i"))
    kind = rng.randrange(5)
    if kind == 0:
        code = f"{var} = 0\nfor i in range({n}):\n    {var} += i * {m}\nprint({var})"
        out = str(sum(i * m for i in range(n)))
    elif kind == 1:
        code = f"def square(x):\n    return x * x\n\nprint(square({n}) + {m})"
        out = str(n * n + m)
    elif kind == 2:
        code = f"import math\n\nprint(math.factorial({k}) // {m})"
        out = str(__import__("math").factorial(k) // m)
    elif kind == 3:
        code = f"nums = [i ** 2 for i in range({k + 1})]\nprint(sum(nums), len(nums))"
        out = f"{sum(i**2 for i in range(k + 1))} {k + 1}"
    else:
        code = f'def f(a, b):\n    if a > b:\n        return a - b\n    else:\n        return b - a\n\nprint(f"diff = {{f({n}, {m})}}")'
        out = f"diff = {abs(n - m)}"
    return code, out


def tool_call(rng: random.Random) -> tuple[str, dict, str]:
    """A tool name, arguments, and a plausible result."""
    name = rng.choice(TOOL_NAMES)
    if name in ("calculator", "python"):
        expr = _expr(rng)
        key = "expression" if name == "calculator" else "code"
        val = expr if name == "calculator" else f"print({expr})"
        return name, {key: val}, _safe_eval(expr)
    if name in ("add", "multiply"):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        return name, {"a": a, "b": b}, str(a + b if name == "add" else a * b)
    if name == "get_weather":
        city = rng.choice(("Paris", "Tokyo", "Lima", "Oslo", "Cairo"))
        return name, {"city": city}, json.dumps({"city": city, "temp_c": rng.randint(-5, 35)})
    if name == "convert":
        v = rng.randint(1, 500)
        return name, {"value": v, "unit": rng.choice(UNITS)}, str(v * 2)
    key = rng.choice(("capital of France", "population", "boiling point", rng.choice(WORDS)))
    return name, {"query": key}, f"{key}: {rng.randint(1, 9999)}"


def tool_schema(name: str) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The {name} tool.",
            "parameters": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
        },
    }


def prose(rng: random.Random) -> str:
    n = rng.randint(8, 30)
    words = [rng.choice(WORDS) for _ in range(n)]
    words[0] = words[0].capitalize()
    return " ".join(words) + rng.choice((".", "?", "!", "."))


def conversation(rng: random.Random) -> tuple[list[dict], list[dict] | None]:
    """A chat (messages, tools) mixing answers, tool calls and code runs."""
    messages: list[dict] = []
    if rng.random() < 0.6:
        messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    q, sol = word_problem(rng)
    messages.append({"role": "user", "content": q})
    tools = None
    kind = rng.randrange(3)
    if kind == 1:
        name, args, result = tool_call(rng)
        tools = [tool_schema(name)]
        call = "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"
        messages.append({"role": "assistant", "content": f"{prose(rng)} {call}"})
        messages.append({"role": "tool", "name": name, "content": result})
    elif kind == 2:
        code, out = python_snippet(rng)
        messages.append({"role": "assistant", "content": f"Let me compute it.\n```python\n{code}\n```"})
        messages.append({"role": "tool", "name": "python", "content": out})
    messages.append({"role": "assistant", "content": sol})
    return messages, tools


def generate_corpus(
    seed: int = 0,
    n_docs: int = 3000,
    render_chat: Callable[[list[dict], list[dict] | None], str] | None = None,
) -> Iterator[str]:
    """Yield ``n_docs`` documents. ``render_chat(messages, tools)`` renders conversations with the real
    chat template (so the tokenizer learns the exact markup); without it conversations are skipped."""
    rng = random.Random(seed)
    for i in range(n_docs):
        kind = i % 8
        if kind == 0:
            q, s = word_problem(rng)
            yield f"Question: {q}\nAnswer: {s}"
        elif kind == 1:
            yield "\n".join(arithmetic_line(rng) for _ in range(rng.randint(3, 10)))
        elif kind == 2:
            code, out = python_snippet(rng)
            yield f"```python\n{code}\n```\n```output\n{out}\n```"
        elif kind == 3:
            name, args, result = tool_call(rng)
            yield f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>\n{result}"
        elif kind == 4:
            yield " ".join(prose(rng) for _ in range(rng.randint(2, 6)))
        elif kind == 5 and render_chat is not None:
            yield render_chat(*conversation(rng))
        elif kind == 6:
            a, b = rng.randint(1, 99), rng.randint(2, 99)
            yield f"$\\frac{{{a}}}{{{b}}} + {a} = \\frac{{{a + a * b}}}{{{b}}}$, so the answer is $\\boxed{{\\frac{{{a + a * b}}}{{{b}}}}}$."
        elif kind == 7:
            yield rng.choice(UNICODE_LINES) + " " + prose(rng)
        else:
            q, s = word_problem(rng)
            yield f"{q}\n{s}"
