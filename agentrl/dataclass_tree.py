"""Check plain nested data (parsed YAML) against a tree of dataclasses, with messages a user can act on.

Generic machinery behind ``agentrl.config``: the dataclasses are the schema. Supported field types:
nested dataclasses (sections), ``bool``, ``int``, ``float`` (ints accepted), ``str`` (numbers accepted
and turned into text), ``Literal[...]`` choices, ``X | None``, ``list[X]``, ``tuple[X, Y]``,
``dict[str, X]`` and ``Any``. Ranges live in field metadata (``ge``, ``gt``, ``le``, ``lt``). Field
documentation is the string literal right under each field (an "attribute docstring"), read from the
source with ``ast``, so the schema documents itself without a second copy of the text.
"""

from __future__ import annotations

import ast
import difflib
import inspect
import itertools
import textwrap
import types
from collections.abc import Iterator, Mapping
from dataclasses import MISSING, fields, is_dataclass
from functools import cache
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

_BAD = object()
"""Returned by ``_coerce`` when a value does not have the expected type."""


class SchemaError(ValueError):
    """One problem at one key; ``agentrl.config`` collects them into a ``ConfigError``."""


@cache
def hints(cls: type) -> dict[str, Any]:
    """Resolved field types of a dataclass (annotations are strings under ``from __future__``)."""
    return get_type_hints(cls)


def is_section(tp: Any) -> bool:
    """A field whose type is a dataclass is a section (a nested mapping of keys)."""
    return isinstance(tp, type) and is_dataclass(tp)


def field_names(cls: type) -> list[str]:
    return [f.name for f in fields(cls)]


def leaf_paths(cls: type, prefix: str = "") -> Iterator[str]:
    """Every dotted key of the schema, depth first, in declaration order."""
    for name in field_names(cls):
        tp = hints(cls)[name]
        if is_section(tp):
            yield from leaf_paths(tp, f"{prefix}{name}.")
        else:
            yield prefix + name


# -------------------------------------------------------------------------------------- checking
def check_tree(
    raw: Any, cls: type, where: str, prefix: str = "", root: type | None = None
) -> tuple[dict[str, Any], list[str]]:
    """Check the keys present in ``raw`` (a partial config) against section ``cls`` of schema ``root``;
    returns the converted values and one message per problem, each ending with ``where`` the value
    came from (a file, an override)."""
    root = root or cls
    if not isinstance(raw, Mapping):
        what = f"section '{prefix[:-1]}'" if prefix else "a config"
        return {}, [f"{what} must be a mapping of keys, got {raw!r} ({type(raw).__name__}) [{where}]"]
    out: dict[str, Any] = {}
    errors: list[str] = []
    for key, value in raw.items():
        path = f"{prefix}{key}"
        if not isinstance(key, str) or key not in hints(cls):
            errors.append(f"{unknown_key_message(cls, prefix, str(key), root)} [{where}]")
            continue
        tp = hints(cls)[key]
        if is_section(tp):
            sub, errs = check_tree(value, tp, where, path + ".", root)
            out[key], errors = sub, errors + errs
            continue
        try:
            converted = _coerce(value, tp, path)
        except SchemaError as e:
            errors.append(f"{e} [{where}]")
            continue
        if converted is _BAD:
            errors.append(f"{path} must be {type_text(tp)}, got {value!r} ({type(value).__name__}) [{where}]")
        else:
            out[key] = converted
    return out, errors


def unknown_key_message(cls: type, prefix: str, key: str, root: type) -> str:
    """``unknown key 'trainer.totl_steps' — did you mean 'trainer.total_steps'? Valid keys in ...``.
    Looks for a close name in the same section first, then for the same name in another section."""
    valid = sorted(field_names(cls))
    guess = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    hint = prefix + guess[0] if guess else None
    if hint is None:
        everywhere = list(leaf_paths(root))
        same_leaf = [p for p in everywhere if p.rsplit(".", 1)[-1] == key]
        close = difflib.get_close_matches(prefix + key, everywhere, n=1, cutoff=0.75)
        hint = next(iter(same_leaf + close), None)
    did = f" — did you mean '{hint}'?" if hint else "."
    if not prefix:
        return f"unknown section '{key}'{did} Valid sections: {', '.join(valid)}"
    return f"unknown key '{prefix}{key}'{did} Valid keys in '{prefix[:-1]}': {', '.join(valid)}"


def _coerce(value: Any, tp: Any, path: str) -> Any:
    """``value`` converted to ``tp``, or ``_BAD``; a value outside a Literal raises a choice error."""
    if tp is Any:
        return value
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        if isinstance(value, str) and value in args:
            return value
        raise SchemaError(choice_message(path, value, args))
    if origin in (Union, types.UnionType):
        if value is None:
            return None if type(None) in args else _BAD
        for arm in (a for a in args if a is not type(None)):
            converted = _coerce(value, arm, path)
            if converted is not _BAD:
                return converted
        return _BAD
    if tp is bool or tp is int:
        return value if type(value) is tp else _BAD  # exact: True is not an int here
    if tp is float:
        return float(value) if type(value) in (int, float) else _BAD
    if tp is str:
        if type(value) in (int, float):
            return str(value)
        if isinstance(value, str) and "${" in value:
            raise SchemaError(
                f"{path}={value!r}: interpolation ('${{...}}') is not supported; derived values "
                "(such as run.output_dir) are filled in when the config loads"
            )
        return value if isinstance(value, str) else _BAD
    if origin in (list, tuple):
        return _coerce_sequence(value, origin, args, path)
    if origin is dict:
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            return _BAD
        items = {k: _coerce(v, args[1], f"{path}.{k}") for k, v in value.items()}
        return _BAD if any(v is _BAD for v in items.values()) else items
    raise TypeError(f"schema field {path} has an unsupported type {tp!r}")


def _coerce_sequence(value: Any, origin: type, args: tuple, path: str) -> Any:
    if not isinstance(value, (list, tuple)):
        return _BAD
    if origin is tuple and args and args[-1] is not Ellipsis:
        if len(value) != len(args):
            return _BAD
        items = [_coerce(v, a, f"{path}[{i}]") for i, (v, a) in enumerate(zip(value, args))]
    else:
        items = [_coerce(v, args[0] if args else Any, f"{path}[{i}]") for i, v in enumerate(value)]
    if any(v is _BAD for v in items):
        return _BAD
    return tuple(items) if origin is tuple else items


def choice_message(path: str, value: Any, choices: tuple) -> str:
    guess: list[str] = []
    if isinstance(value, str):  # compare case-insensitively so 'c2' suggests 'C2'
        lower = {str(c).lower(): str(c) for c in choices}
        guess = [lower[g] for g in difflib.get_close_matches(value.lower(), list(lower), n=1)]
    did = f"did you mean {guess[0]!r}? " if guess else ""
    return f"{path}={value!r} is not a valid choice; {did}Valid: {', '.join(sorted(map(str, choices)))}"


def check_ranges(obj: Any, prefix: str = "") -> Iterator[tuple[str, str]]:
    """``(path, message)`` for every field of a built dataclass tree outside its declared range."""
    for f in fields(obj):
        value, path = getattr(obj, f.name), prefix + f.name
        if is_dataclass(value):
            yield from check_ranges(value, path + ".")
            continue
        if not f.metadata or value is None:
            continue
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if not in_range(item, f.metadata):
                yield path, f"{path} must be {range_text(f.metadata)}, got {value!r}"
                break


def in_range(x: float, b: Mapping[str, float]) -> bool:
    return (
        ("ge" not in b or x >= b["ge"])
        and ("gt" not in b or x > b["gt"])
        and ("le" not in b or x <= b["le"])
        and ("lt" not in b or x < b["lt"])
    )


def range_text(b: Mapping[str, float]) -> str:
    """``>= 1``, ``in (0, 1]``..."""
    low = f"[{b['ge']:g}" if "ge" in b else f"({b['gt']:g}" if "gt" in b else None
    high = f"{b['le']:g}]" if "le" in b else f"{b['lt']:g})" if "lt" in b else None
    if low and high:
        return f"in {low}, {high}"
    if low:
        return (">= " if low[0] == "[" else "> ") + low[1:]
    if high:
        return ("<= " if high[-1] == "]" else "< ") + high[:-1]
    return "any value"


def build(cls: type, data: Mapping[str, Any]) -> Any:
    """Construct the dataclass tree from a complete, already checked nested dict."""
    kwargs = {}
    for name in field_names(cls):
        tp = hints(cls)[name]
        kwargs[name] = build(tp, data[name]) if is_section(tp) else data[name]
    return cls(**kwargs)


# --------------------------------------------------------------------------------- documentation
def type_text(tp: Any) -> str:
    """A short human name for a field type: ``int``, ``float or null``, ``one of: a, b``..."""
    origin, args = get_origin(tp), get_args(tp)
    if tp is Any:
        return "any value"
    if tp is type(None):
        return "null"
    if origin is Literal:
        return "one of: " + ", ".join(map(str, args))
    if origin in (Union, types.UnionType):
        return " or ".join(type_text(a) for a in args)
    if origin is list:
        return f"list of {type_text(args[0])}"
    if origin is tuple:
        return "[" + ", ".join(type_text(a) for a in args) + "]"
    if origin is dict:
        return "mapping" if args[1] is Any else f"mapping of {type_text(args[1])}"
    return getattr(tp, "__name__", str(tp))


@cache
def field_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings of a dataclass: the string literal right under each field."""
    source = textwrap.dedent(inspect.getsource(cls))
    body = ast.parse(source).body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for stmt, nxt in itertools.pairwise(body):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[stmt.target.id] = inspect.cleandoc(nxt.value.value)
    return docs


def describe_table(cls: type, default_text: Any = None) -> str:
    """A markdown table with one row per leaf key: key, type (and range), default, description.
    ``default_text(path, default)`` may replace how a default is shown (e.g. "from the preset")."""
    rows = ["| key | type | default | description |", "|---|---|---|---|"]
    for path, tp, default, meta, doc in _leaves(cls(), ""):
        kind = type_text(tp) + (f", {range_text(meta)}" if meta else "")
        shown = default_text(path, default) if default_text else None
        shown = shown if shown is not None else f"`{_yaml_scalar(default)}`"
        rows.append(f"| `{path}` | {_cell(kind)} | {_cell(shown)} | {_cell(doc)} |")
    return "\n".join(rows)


def _leaves(obj: Any, prefix: str) -> Iterator[tuple[str, Any, Any, Mapping, str]]:
    cls: Any = type(obj)
    for f in fields(cls):
        tp, value = hints(cls)[f.name], getattr(obj, f.name)
        if is_section(tp):
            yield from _leaves(value, f"{prefix}{f.name}.")
        else:
            assert f.default is not MISSING or f.default_factory is not MISSING
            yield prefix + f.name, tp, value, f.metadata, field_docs(cls).get(f.name, "")


def _yaml_scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return "[" + ", ".join(_yaml_scalar(v) for v in value) + "]"
    return "{}" if value == {} else str(value)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")
