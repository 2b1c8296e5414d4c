"""Check plain nested data (parsed YAML) against a tree of dataclasses, with messages a user can act on.

Generic machinery behind ``agentrl.config``: the dataclasses are the schema. Supported field types:
nested dataclasses (sections), ``bool``, ``int``, ``float`` (ints accepted), ``str`` (numbers accepted
and turned into text), ``Literal[...]`` choices, ``X | None``, ``list[X]``, ``tuple[X, Y]``,
``dict[str, X]`` and ``Any``. Field metadata (``knob``) holds ranges (``ge``, ``gt``, ``le``, ``lt``) and
``choices``, a function returning the valid strings (names in a registry that can grow at run time).
Field documentation is the string literal right under each field (an "attribute docstring"), read
from the source with ``ast``, so the schema documents itself without a second copy of the text.

Registered sections: a section may hold, besides its own fields, one sub-section per name in a
registry (``registered_sections``): the STARE settings under ``algorithm.stare``, a user's method's
under ``algorithm.<name>``. They are keys of the section in YAML, on the command line and in the
flattened tree (``to_tree``); in the built object they live in the field marked with
``registered_sections`` and read as attributes through ``HasSections``.
"""

from __future__ import annotations

import ast
import difflib
import inspect
import itertools
import math
import textwrap
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import MISSING, field, fields, is_dataclass
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


RANGE_KEYS = ("ge", "gt", "le", "lt")


def knob(default: Any = None, *, choices: Callable[[], Sequence[str]] | None = None, **bounds: float) -> Any:
    """A dataclass field with an optional range (ge, gt, le, lt) and/or ``choices`` (a function
    returning the valid strings), both checked at load time."""
    assert set(bounds) <= set(RANGE_KEYS), bounds
    meta: dict[str, Any] = dict(bounds)
    if choices is not None:
        meta["choices"] = choices
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def registered_sections(registry: Callable[[], Mapping[str, type]]) -> Any:
    """The field that stores a section's registered sub-sections (see the module docstring):
    ``registry()`` maps each name to its settings dataclass; every name gets its defaults."""
    return field(
        default_factory=lambda: {name: tp() for name, tp in registry().items()},
        metadata={"sections": registry},
    )


class HasSections:
    """Mixin for a dataclass with a ``registered_sections`` field: its sub-sections read as attributes
    (``cfg.algorithm.stare.W``)."""

    def __getattr__(self, name: str) -> Any:
        store = _sections_field(type(self))
        sections = self.__dict__.get(store) if store else None
        if name.startswith("__") or sections is None or name not in sections:
            raise AttributeError(f"{type(self).__name__!r} has no attribute or registered section {name!r}")
        return sections[name]


def _sections_field(cls: type) -> str | None:
    """The name of ``cls``'s registered-sections field, if it has one."""
    return next((f.name for f in fields(cls) if "sections" in f.metadata), None)


def _registry(cls: type) -> Mapping[str, type]:
    store = _sections_field(cls)
    return {} if store is None else fields_by_name(cls)[store].metadata["sections"]()


def fields_by_name(cls: type) -> dict[str, Any]:
    return {f.name: f for f in fields(cls)}


def is_section(tp: Any) -> bool:
    """A field whose type is a dataclass is a section (a nested mapping of keys)."""
    return isinstance(tp, type) and is_dataclass(tp)


def field_names(cls: type) -> list[str]:
    """The keys of a section: its fields (but not the registered-sections store), then the names of
    its registered sections."""
    store = _sections_field(cls)
    return [f.name for f in fields(cls) if f.name != store] + list(_registry(cls))


def key_type(cls: type, name: str) -> Any:
    """The type of key ``name`` of section ``cls`` (a registered section's dataclass), or None."""
    if name == _sections_field(cls):
        return None
    registry = _registry(cls)
    return registry[name] if name in registry else hints(cls).get(name)


def leaf_paths(cls: type, prefix: str = "") -> Iterator[str]:
    """Every dotted key of the schema, depth first, in declaration order."""
    for name in field_names(cls):
        tp = key_type(cls, name)
        if is_section(tp):
            yield from leaf_paths(tp, f"{prefix}{name}.")
        else:
            yield prefix + name


def to_tree(obj: Any) -> dict[str, Any]:
    """A built dataclass tree as plain nested dicts, registered sections as keys of their section
    (tuples stay tuples; ``config_to_dict`` makes them lists)."""
    out: dict[str, Any] = {}
    for name in field_names(type(obj)):
        value = getattr(obj, name)
        out[name] = to_tree(value) if is_dataclass(value) else _copy(value)
    return out


def _copy(x: Any) -> Any:
    if isinstance(x, Mapping):
        return {k: _copy(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_copy(v) for v in x]
    return x


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
        tp = key_type(cls, key) if isinstance(key, str) else None
        if tp is None:
            errors.append(f"{unknown_key_message(cls, prefix, str(key), root)} [{where}]")
            continue
        if is_section(tp):
            sub, errs = check_tree(value, tp, where, path + ".", root)
            out[key], errors = sub, errors + errs
            continue
        try:
            converted = _coerce(value, tp, path)
            choices = fields_by_name(cls)[key].metadata.get("choices")
            if choices is not None and converted is not None and converted not in choices():
                raise SchemaError(choice_message(path, value, tuple(choices())))
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
    foreign = getattr(root, "__foreign_keys__", {}).get(prefix + key)
    if foreign:  # a name from another framework: say what it is called here
        return f"unknown key '{prefix}{key}' — agentrl calls it {foreign}. Valid keys in '{prefix[:-1]}': {', '.join(valid)}"
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
        if value is False and "off" in args:  # YAML 1.1 reads a bare `off` as false
            return "off"
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
        if type(value) not in (int, float):
            return _BAD
        if not math.isfinite(value):  # .inf, .nan: nothing a setting can mean by them
            raise SchemaError(f"{path}={value!r} is not a finite number: give a finite value")
        return float(value)
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
    meta = fields_by_name(type(obj))
    for name in field_names(type(obj)):
        value, path = getattr(obj, name), prefix + name
        if is_dataclass(value):
            yield from check_ranges(value, path + ".")
            continue
        bounds = _bounds(meta[name].metadata)
        if not bounds or value is None:
            continue
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if not in_range(item, bounds):
                yield path, f"{path} must be {range_text(bounds)}, got {value!r}"
                break


def _bounds(metadata: Mapping[str, Any]) -> dict[str, float]:
    return {k: metadata[k] for k in RANGE_KEYS if k in metadata}


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
    """Construct the dataclass tree from a complete, already checked nested dict (``to_tree``'s
    form). A registered section missing from ``data`` gets its defaults."""
    kwargs: dict[str, Any] = {}
    store, registry = _sections_field(cls), _registry(cls)
    for f in fields(cls):
        if f.name == store:
            kwargs[f.name] = {
                n: build(tp, data.get(n, {})) if n in data else tp() for n, tp in registry.items()
            }
        else:
            tp = hints(cls)[f.name]
            kwargs[f.name] = build(tp, data[f.name]) if is_section(tp) else data[f.name]
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
    """The attribute docstrings of a dataclass: the string literal right under each field ({} when its
    source cannot be read, e.g. a class made by ``exec``)."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
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
        kind = type_text(tp)
        if "choices" in meta:
            kind = "one of: " + ", ".join(meta["choices"]()) + (" or null" if "null" in kind else "")
        bounds = _bounds(meta)
        kind += f", {range_text(bounds)}" if bounds else ""
        shown = default_text(path, default) if default_text else None
        shown = shown if shown is not None else f"`{_yaml_scalar(default)}`"
        rows.append(f"| `{path}` | {_cell(kind)} | {_cell(shown)} | {_cell(doc)} |")
    return "\n".join(rows)


def _leaves(obj: Any, prefix: str) -> Iterator[tuple[str, Any, Any, Mapping, str]]:
    cls: Any = type(obj)
    for name in field_names(cls):
        tp, value = key_type(cls, name), getattr(obj, name)
        if is_section(tp):
            yield from _leaves(value, f"{prefix}{name}.")
        else:
            f = fields_by_name(cls)[name]
            assert f.default is not MISSING or f.default_factory is not MISSING
            yield prefix + name, tp, value, f.metadata, field_docs(cls).get(name, "")


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
