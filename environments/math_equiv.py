"""Final-answer extraction and math-equivalence checking (sympy, guarded against hostile input).

Two answers are equivalent when they denote the same mathematical object:

- numbers compare *exactly* as rationals: ``1/2`` == ``0.5`` == ``\\frac{1}{2}`` == ``\\dfrac12``, but
  ``1/3`` != ``0.33`` and ``5.0`` == ``5``;
- closed-form constants compare by value to 60 digits: ``2\\sqrt{2}`` == ``\\sqrt{8}``, ``\\pi/2`` ==
  ``\\frac{\\pi}{2}``;
- expressions with variables compare by evaluation at several random rational points (polynomial
  identity testing): ``2(x+1)`` == ``2x+2``, ``x+1`` != ``x-1``;
- tuples and intervals compare element by element with the same brackets (``(1,2]`` != ``(1,2)``);
  a bare list ``1, 2`` and a set ``\\{1,2\\}`` compare as unordered collections.

Normalisation before comparing: ``$``, ``\\left``/``\\right``, spacing commands, ``\\text{..}``
wrappers, thousands separators (``1,000`` and ``1{,}000``; a whole answer ``1,234`` is read as one
number, not a pair), words after a number (units: ``5 dollars``, ``12 cm``), degrees, a leading
``x =``, and the percent sign. **Percent**: ``50\\%`` == ``50`` and != ``0.5``, because GSM8K/MATH
references write the number of percent; a model answering a percent question with ``0.5`` is wrong.

Safety: answers are model output. Nothing is passed to ``eval``/``sympify``: the normalised string is
tokenised, parsed with Python's ``ast`` into a whitelisted tree (numbers, one-letter variables, + - * /
^, a few functions), and built into sympy node by node with caps on length, node count, integer sizes
and exponents, so ``9^9^9^9`` or ``10^{10^{10}}`` is rejected in microseconds instead of hanging.
Unparseable answers fall back to a whitespace/case-insensitive string comparison.
"""

from __future__ import annotations

import ast
import math
import random
import re
from fractions import Fraction
from typing import TYPE_CHECKING

from agentrl.env import extract_boxed

if TYPE_CHECKING:
    import sympy  # imported lazily below: plain numbers never need it, and its import is slow

MAX_CHARS = 300
"""Longer answers are compared as strings only (no parsing)."""
_MAX_NODES = 200
_MAX_INT_DIGITS = 40
_MAX_EXPONENT = 1000
_MAX_RESULT_DIGITS = 5000

# -- extraction ---------------------------------------------------------------------------------
_HASHES = re.compile(r"####\s*([^\n]+)")
_ANSWER_LINE = re.compile(r"(?im)^\s*answer\s*:\s*(.+?)\s*$")


def extract_answer(text: str | None) -> str | None:
    """The final answer in a response: the last ``\\boxed{..}``, else the last ``#### X`` (GSM8K), else
    the last ``Answer: X`` line (DAPO's prompt format); None when there is none."""
    if not text:
        return None
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed
    for pattern in (_HASHES, _ANSWER_LINE):
        found = pattern.findall(text)
        if found:
            return found[-1].strip()
    return None


# -- normalisation ------------------------------------------------------------------------------
_DROP = ("\\displaystyle", "\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\$", "$", "{,}", "°")
_WRAPPERS = (
    "\\boxed",
    "\\fbox",
    "\\text",
    "\\textbf",
    "\\mathrm",
    "\\mathbf",
    "\\mbox",
    "\\operatorname",
    "\\textnormal",
)
_MATH_WORDS = {"sqrt", "pi", "sin", "cos", "tan", "log", "ln", "exp", "abs", "oo", "infty", "frac", "cdot"}
_UNIT_TAIL = re.compile(r"^(?P<head>.*[\d)}\]])\s*(?P<tail>(?:[A-Za-z]{2,}\.?(?:\^\{?\d\}?)?\s*)+)$")
_LHS = re.compile(r"^\s*\\?[A-Za-z]\w*\s*=\s*(?P<rhs>[^=]+)$")
_THOUSANDS = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")


def _read_group(s: str, i: int) -> tuple[str, int] | None:
    """The argument starting at ``s[i]``: a balanced ``{..}`` group, a ``\\command`` or one char."""
    while i < len(s) and s[i] == " ":
        i += 1
    if i >= len(s):
        return None
    if s[i] == "{":
        depth = 0
        for j in range(i, len(s)):
            depth += {"{": 1, "}": -1}.get(s[j], 0)
            if depth == 0:
                return s[i + 1 : j], j + 1
        return None
    if s[i] == "\\":
        m = re.match(r"\\[A-Za-z]+", s[i:])
        if m:
            return m.group(0), i + m.end()
    return s[i], i + 1


def _unwrap(s: str, command: str) -> str:
    """``\\text{abc}`` -> `` abc `` for every occurrence of ``command``."""
    out: list[str] = []
    i = 0
    while True:
        j = s.find(command + "{", i)
        if j < 0:
            return "".join(out) + s[i:]
        group = _read_group(s, j + len(command))
        if group is None:
            return "".join(out) + s[i:]
        out.append(s[i:j] + " " + group[0] + " ")
        i = group[1]


def normalize(answer: str) -> str:
    """Strip the presentation (dollar signs, units, text wrappers, separators) from an answer."""
    s = answer.strip()
    for token in _DROP:
        s = s.replace(token, "")
    for cmd in _WRAPPERS:
        s = _unwrap(s, cmd)
    s = re.sub(r"\^\s*\{?\s*\\circ\s*\}?", "", s).replace("\\circ", "")
    s = s.replace("\\%", "").replace("%", "").replace("\\ ", " ").replace("~", " ")
    s = re.sub(r"\\[dt]frac", r"\\frac", s).strip()
    m = _LHS.match(s)
    if m and "," not in s:
        s = m.group("rhs").strip()
    m = _UNIT_TAIL.match(s)
    if m and not any(w.lower().rstrip(".") in _MATH_WORDS for w in re.findall(r"[A-Za-z]+", m.group("tail"))):
        s = m.group("head").strip()
    s = s.rstrip(".").strip()
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    return s


# -- exact numbers (the common case: no sympy at all) -----------------------------------------
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d{1,3})?")
_FRACTION = re.compile(r"([-+]?\d+)\s*/\s*([-+]?\d+)")


def _as_fraction(s: str) -> Fraction | None:
    try:
        if _NUMBER.fullmatch(s):
            return Fraction(s)
        m = _FRACTION.fullmatch(s)
        if m and int(m.group(2)) != 0:
            return Fraction(int(m.group(1)), int(m.group(2)))
    except (ValueError, ZeroDivisionError):
        return None
    return None


# -- LaTeX to a plain infix string ------------------------------------------------------------
_COMMANDS = {
    "\\cdot": "*", "\\times": "*", "\\ast": "*", "\\div": "/", "\\pi": " pi ", "\\infty": " oo ",
    "\\ln": " ln ", "\\log": " log ", "\\sin": " sin ", "\\cos": " cos ", "\\tan": " tan ", "\\exp": " exp ",
}  # fmt: skip


def _latex_to_infix(s: str) -> str | None:
    """``\\frac{a}{b}`` -> ``((a)/(b))``, ``\\sqrt[n]{x}`` -> ``((x)^(1/(n)))``, braces -> parens;
    None when an unknown command remains."""
    out, i = [], 0
    while i < len(s):
        if s.startswith("\\frac", i):
            a = _read_group(s, i + 5)
            b = a and _read_group(s, a[1])
            if not a or not b:
                return None
            inner = [_latex_to_infix(a[0]), _latex_to_infix(b[0])]
            if None in inner:
                return None
            out.append(f"(({inner[0]})/({inner[1]}))")
            i = b[1]
        elif s.startswith("\\sqrt", i):
            j, root = i + 5, "2"
            if s.startswith("[", j):
                k = s.find("]", j)
                if k < 0:
                    return None
                root, j = s[j + 1 : k], k + 1
            a = _read_group(s, j)
            body = a and _latex_to_infix(a[0])
            if not a or body is None:
                return None
            out.append(f"sqrt({body})" if root == "2" else f"(({body})^(1/({root})))")
            i = a[1]
        elif s[i] == "\\":
            m = re.match(r"\\[A-Za-z]+", s[i:])
            cmd = m.group(0) if m else s[i : i + 2]
            if cmd not in _COMMANDS:
                return None
            out.append(_COMMANDS[cmd])
            i += len(cmd)
        else:
            out.append({"{": "(", "}": ")", "[": "(", "]": ")"}.get(s[i], s[i]))
            i += 1
    return "".join(out)


# -- tokens, implicit multiplication, guarded construction ------------------------------------
_TOKEN = re.compile(
    r"\s*(?:(?P<num>\d+\.?\d*|\.\d+)(?P<exp>[eE][-+]?\d{1,3})?|(?P<name>[A-Za-z]+)|(?P<op>\*\*|[-+*/^()]))"
)
_FUNCS = {"sqrt": "sqrt", "sin": "sin", "cos": "cos", "tan": "tan", "log": "log", "ln": "log", "exp": "exp",
          "abs": "Abs"}  # fmt: skip
_CONSTS = {"pi": "pi", "oo": "oo", "e": "E"}
"""Names the model may write -> sympy attribute names."""


def _to_python(s: str) -> str | None:
    """Tokenise an infix string and insert the implicit ``*`` (``2x``, ``2sqrt(2)``, ``(a)(b)``)."""
    tokens: list[tuple[str, str]] = []
    i = 0
    s = s.strip()
    while i < len(s):
        m = _TOKEN.match(s, i)
        if not m or m.end() == i:
            return None
        i = m.end()
        if m.group("num"):
            value = Fraction(m.group("num") + (m.group("exp") or ""))
            tokens.append(("atom", f"({value.numerator}/{value.denominator})"))
        elif m.group("name"):
            name = m.group("name")
            if name in _FUNCS:
                tokens.append(("func", name))
            elif name in _CONSTS:
                tokens.append(("atom", name))
            elif len(name) <= 2:  # ``xy`` is the product x*y
                tokens.extend(("atom", c) for c in name)
            else:  # a word ("Evelyn", "odd"): compare as text, not as a product of letters
                return None
        else:
            op = m.group("op")
            tokens.append(("(" if op == "(" else ")" if op == ")" else "op", "**" if op == "^" else op))
    out: list[str] = []
    prev = ""
    for kind, text in tokens:
        if prev in ("atom", ")") and kind in ("atom", "func", "("):
            out.append("*")
        if prev == "func" and kind != "(":
            return None
        out.append(text)
        prev = kind
    return " ".join(out)


class _Reject(Exception):
    """The expression is outside what we agree to build (too big, unknown syntax)."""


def _digits(x: sympy.Expr) -> int:
    import sympy

    if isinstance(x, sympy.Rational):
        return len(str(abs(x.p))) + len(str(x.q))
    return 0


def _build(node: ast.AST, budget: list[int]) -> sympy.Expr:
    import sympy

    budget[0] -= 1
    if budget[0] < 0:
        raise _Reject("too many nodes")
    if isinstance(node, ast.Expression):
        return _build(node.body, budget)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        if len(str(node.value)) > _MAX_INT_DIGITS:
            raise _Reject("integer too long")
        return sympy.Integer(node.value)
    if isinstance(node, ast.Name):
        return getattr(sympy, _CONSTS[node.id]) if node.id in _CONSTS else sympy.Symbol(node.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _build(node.operand, budget)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS:
        if len(node.args) != 1 or node.keywords:
            raise _Reject("functions take one argument")
        return getattr(sympy, _FUNCS[node.func.id])(_build(node.args[0], budget))
    if isinstance(node, ast.BinOp):
        a, b = _build(node.left, budget), _build(node.right, budget)
        if isinstance(node.op, ast.Add):
            return a + b
        if isinstance(node.op, ast.Sub):
            return a - b
        if isinstance(node.op, ast.Mult):
            return a * b
        if isinstance(node.op, ast.Div):
            return a / b
        if isinstance(node.op, ast.Pow):
            return _power(a, b)
    raise _Reject(f"unsupported syntax {type(node).__name__}")


def _power(base: sympy.Expr, exponent: sympy.Expr) -> sympy.Expr:
    """``base**exponent`` unless sympy would build a huge number (``9^9^9`` stops here)."""
    if exponent.is_Number:
        if abs(exponent) > _MAX_EXPONENT:
            raise _Reject("exponent too large")
        if base.is_Number and _digits(base) * abs(float(exponent)) > _MAX_RESULT_DIGITS:
            raise _Reject("power too large")
    return base**exponent


def to_sympy(answer: str) -> sympy.Expr | None:
    """A normalised answer as a sympy expression, or None when it is not a (safe) expression."""
    if len(answer) > MAX_CHARS:
        return None
    infix = _latex_to_infix(answer)
    code = infix and _to_python(infix)
    if not code:
        return None
    try:
        tree = ast.parse(code, mode="eval")
        return _build(tree, [_MAX_NODES])
    except (_Reject, SyntaxError, ValueError, TypeError, ZeroDivisionError, RecursionError, MemoryError):
        return None


def _values_equal(a: sympy.Expr, b: sympy.Expr) -> bool | None:
    """Numeric comparison to 60 digits; None when either side is not a finite number."""
    import sympy

    try:
        va, vb = sympy.N(a, 60), sympy.N(b, 60)
    except (TypeError, ValueError, ArithmeticError):
        return None
    if va.has(sympy.zoo, sympy.nan) or vb.has(sympy.zoo, sympy.nan) or not (va.is_number and vb.is_number):
        return None
    if va.has(sympy.oo, -sympy.oo) or vb.has(sympy.oo, -sympy.oo):
        return bool(va == vb)
    scale = max(1.0, float(abs(va)))
    return bool(abs(va - vb) <= sympy.Float(10) ** -45 * scale)


def sympy_equal(a: sympy.Expr, b: sympy.Expr) -> bool:
    """Exact for rationals, 60-digit numeric for constants, random points for variables."""
    import sympy

    if a == b:
        return True
    if isinstance(a, sympy.Rational) and isinstance(b, sympy.Rational):
        return False
    symbols = sorted(a.free_symbols | b.free_symbols, key=str)
    if not symbols:
        return bool(_values_equal(a, b))
    if len(symbols) > 6:
        return False
    rng = random.Random(0)
    checked = 0
    for _ in range(8):
        point = {x: sympy.Rational(rng.randint(1, 97), rng.randint(1, 13)) for x in symbols}
        same = _values_equal(a.subs(point), b.subs(point))
        if same is False:
            return False
        checked += same is True
        if checked >= 4:
            return True
    return False


# -- collections ---------------------------------------------------------------------------------
def _split_top(s: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, c in enumerate(s):
        depth += 1 if c in "([{" else -1 if c in ")]}" else 0
        if c == "," and depth == 0:
            parts.append(s[start:i].strip())
            start = i + 1
    return [*parts, s[start:].strip()]


def _as_collection(s: str) -> tuple[str, list[str]] | None:
    """``(1,2]`` -> ("(]", ["1","2"]); ``\\{1,2\\}`` -> ("set", ..); ``1, 2`` -> ("list", ..)."""
    if s.startswith("\\{") and s.endswith("\\}"):
        return "set", _split_top(s[2:-2])
    if len(s) >= 2 and s[0] in "([" and s[-1] in ")]" and not _depth_closes_early(s):
        inner = _split_top(s[1:-1])
        if len(inner) > 1:
            return s[0] + s[-1], inner
    parts = _split_top(s)
    return ("list", parts) if len(parts) > 1 else None


def _depth_closes_early(s: str) -> bool:
    """True for ``(1)+(2)``-like strings whose first bracket closes before the end."""
    depth = 0
    for i, c in enumerate(s):
        depth += 1 if c in "([{" else -1 if c in ")]}" else 0
        if depth == 0 and i < len(s) - 1:
            return True
    return False


def _loose(s: str) -> str:
    return re.sub(r"\s+", "", s).lower()


def _scalar_equal(a: str, b: str) -> bool:
    if a == b:
        return bool(a)
    fa, fb = _as_fraction(a), _as_fraction(b)
    if fa is not None and fb is not None:
        return fa == fb
    ea, eb = to_sympy(a), to_sympy(b)
    if ea is None or eb is None:
        return _loose(a) == _loose(b) and bool(a)
    try:
        return sympy_equal(ea, eb)
    except (TypeError, ValueError, ArithmeticError, RecursionError):
        return False


def is_equivalent(pred: str | None, ref: str | int | float | None) -> bool:
    """True when the predicted answer denotes the same value/object as the reference. Never raises
    on any string input; bounded work (see the module docstring)."""
    if pred is None or ref is None:
        return False
    if isinstance(ref, float) and not math.isfinite(ref):
        return False
    a, b = normalize(str(pred)), normalize(str(ref))
    if not a or not b:
        return False
    if len(a) > MAX_CHARS or len(b) > MAX_CHARS:
        return a == b
    ca, cb = _as_collection(a), _as_collection(b)
    if ca is None and cb is None:
        return _scalar_equal(a, b)
    if ca is None or cb is None or ca[0] != cb[0] or len(ca[1]) != len(cb[1]):
        return False
    if ca[0] in ("set", "list"):  # unordered: every element matches a distinct one
        rest = list(cb[1])
        for x in ca[1]:
            hit = next((k for k, y in enumerate(rest) if is_equivalent(x, y)), None)
            if hit is None:
                return False
            rest.pop(hit)
        return True
    return all(is_equivalent(x, y) for x, y in zip(ca[1], cb[1]))
