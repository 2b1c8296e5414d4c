"""Tool declarations (JSON schemas from type hints and docstrings) and tool-call parsing.

Three call formats:
- ``json``: ``<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>`` (Qwen/Hermes style),
  several per turn allowed; whitespace around the JSON is ignored.
- ``llama3``: the whole turn is one JSON object ``{"name": "add", "parameters": {"a": 1, "b": 2}}``
  (``"arguments"`` accepted too), or several separated by ``;``, optionally after ``<|python_tag|>``
  (Llama 3.1 custom tools). A turn that is not such an object is a plain answer.
- ``python``: a fenced code block (```python ... ```), which becomes a call to the ``python`` tool with
  ``{"code": ...}``; code-interpreter environments use it.

Parsing never raises: a malformed call comes back as a ``ToolCall`` with ``error`` set, which the
environment turns into an error observation for the model.
"""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ToolCall:
    name: str | None
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    """Why the call could not be parsed, if it could not."""
    raw: str = ""


TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_CALL_FORMATS = ("json", "python", "llama3")
_JSON_CALL = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)(" + re.escape(TOOL_CALL_CLOSE) + r"|$)", re.S)
_CODE_BLOCK = re.compile(r"```(?:python|py)[ \t]*\n(.*?)(```|$)", re.S)


def parse_tool_calls(text: str, fmt: str = "json", known: Sequence[str] = ()) -> list[ToolCall]:
    """All tool calls in one policy turn, in order. ``known`` is used only for error hints."""
    if fmt == "json":
        return [
            _parse_json_call(m.group(1), closed=bool(m.group(2)), raw=m.group(0))
            for m in _JSON_CALL.finditer(text)
        ]
    if fmt == "python":
        calls = []
        for m in _CODE_BLOCK.finditer(text):
            if not m.group(2):
                calls.append(
                    ToolCall("python", error="the code block is not closed with ```", raw=m.group(0))
                )
            else:
                calls.append(ToolCall("python", {"code": m.group(1)}, raw=m.group(0)))
        return calls
    if fmt == "llama3":
        return _parse_llama3_calls(text)
    raise ValueError(f"unknown tool-call format {fmt!r}; valid: {list(TOOL_CALL_FORMATS)}")


def strip_tool_calls(text: str, fmt: str = "json") -> str:
    """``text`` without its tool-call markup, stripped: the ``content`` that goes next to OpenAI
    ``tool_calls``. For ``llama3`` a turn that is a call has no other content (``""``)."""
    if fmt == "json":
        return _JSON_CALL.sub("", text).strip()
    if fmt == "python":
        return _CODE_BLOCK.sub("", text).strip()
    if fmt == "llama3":
        return "" if _parse_llama3_calls(text) else text.strip()
    raise ValueError(f"unknown tool-call format {fmt!r}; valid: {list(TOOL_CALL_FORMATS)}")


def _parse_llama3_calls(text: str) -> list[ToolCall]:
    body = text.strip().removeprefix("<|python_tag|>").strip()
    for end_of_turn in ("<|eom_id|>", "<|eot_id|>"):
        body = body.removesuffix(end_of_turn).rstrip()
    if not body.startswith("{"):
        return []  # a plain answer
    decoder, pos = json.JSONDecoder(), 0
    calls: list[ToolCall] = []
    while pos < len(body):
        try:
            obj, end = decoder.raw_decode(body, pos)
        except json.JSONDecodeError as e:
            if '"name"' not in body:
                return []  # text that merely starts with a brace
            return [
                ToolCall(None, error=f"the tool call is not valid JSON ({e.msg} at char {e.pos})", raw=body)
            ]
        except RecursionError:
            return [ToolCall(None, error="the tool call is nested too deeply", raw=body)]
        if not isinstance(obj, dict) or "name" not in obj:
            if not calls and end == len(body):
                return []  # a JSON answer, not a call
            return [
                ToolCall(
                    None, error='each call must be an object {"name": str, "parameters": object}', raw=body
                )
            ]
        calls.append(_llama3_call(obj, body[pos:end]))
        pos = end
        rest = body[pos:].lstrip()
        if rest and not rest.startswith(";"):
            return [ToolCall(None, error="tool calls must be the whole turn, separated by ';'", raw=body)]
        pos = len(body) - len(rest.removeprefix(";").lstrip())
    return calls


def _llama3_call(obj: dict[str, Any], raw: str) -> ToolCall:
    if not isinstance(obj["name"], str):
        return ToolCall(None, error="`name` must be a string", raw=raw)
    args = obj.get("parameters", obj.get("arguments", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return ToolCall(obj["name"], error="`parameters` is a string that is not valid JSON", raw=raw)
    if not isinstance(args, dict):
        return ToolCall(obj["name"], error="`parameters` must be a JSON object", raw=raw)
    return ToolCall(obj["name"], args, raw=raw)


def _parse_json_call(body: str, closed: bool, raw: str) -> ToolCall:
    if not closed:
        return ToolCall(None, error=f"the tool call is not closed with {TOOL_CALL_CLOSE}", raw=raw)
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return ToolCall(None, error=f"the tool call is not valid JSON ({e.msg} at char {e.pos})", raw=raw)
    except RecursionError:
        return ToolCall(None, error="the tool call is nested too deeply", raw=raw)
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ToolCall(
            None, error='a tool call must be an object {"name": str, "arguments": object}', raw=raw
        )
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models emit arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return ToolCall(obj["name"], error="`arguments` is a string that is not valid JSON", raw=raw)
    if not isinstance(args, dict):
        return ToolCall(obj["name"], error="`arguments` must be a JSON object", raw=raw)
    return ToolCall(obj["name"], args, raw=raw)


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """The text a model writes to call a tool in the ``json`` format (used by demonstrations)."""
    return f"{TOOL_CALL_OPEN}{json.dumps({'name': name, 'arguments': arguments})}{TOOL_CALL_CLOSE}"


# -- schemas ------------------------------------------------------------------------------------
_JSON_TYPES: dict[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    list: "array",
    dict: "object",
}


def _type_schema(tp: Any) -> dict[str, Any]:
    origin = typing.get_origin(tp)
    if tp in _JSON_TYPES:
        return {"type": _JSON_TYPES[tp]}
    if origin is typing.Literal:
        vals = list(typing.get_args(tp))
        return {"type": _JSON_TYPES.get(type(vals[0]), "string"), "enum": vals}
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return {**_type_schema(args[0]), "nullable": True}
        return {"anyOf": [_type_schema(a) for a in args]}
    if origin in (list, Sequence, tuple):
        inner = typing.get_args(tp)
        return {"type": "array", **({"items": _type_schema(inner[0])} if inner else {})}
    if origin is dict:
        return {"type": "object"}
    raise TypeError(f"unsupported tool argument type {tp!r}")


def _doc_parts(fn: Callable) -> tuple[str, dict[str, str]]:
    """Description and per-argument docs from a Google-style docstring."""
    doc = inspect.getdoc(fn) or ""
    desc_lines, args, current, in_args = [], {}, None, False
    for line in doc.splitlines():
        stripped = line.strip()
        if stripped in ("Args:", "Arguments:", "Parameters:"):
            in_args = True
            continue
        if in_args and stripped.endswith(":") and not line.startswith(" "):
            in_args = False  # next section (Returns:, Raises:)
        if in_args:
            m = re.match(r"\s*(\w+)(?:\s*\(.*?\))?:\s*(.*)", line)
            if m and line.startswith((" ", "\t")) and (len(line) - len(line.lstrip())) <= 4:
                current = m.group(1)
                args[current] = m.group(2)
            elif current and stripped:
                args[current] += " " + stripped
        elif stripped and not args and not in_args and stripped not in ("Returns:", "Raises:"):
            desc_lines.append(stripped)
    return " ".join(desc_lines).split(" Returns:")[0], args


def tool_schema(fn: Callable) -> dict[str, Any]:
    """OpenAI-style function schema from a typed, docstringed function or bound method."""
    sig = inspect.signature(fn)
    hints = typing.get_type_hints(fn)
    desc, arg_docs = _doc_parts(fn)
    props, required = {}, []
    for name, p in sig.parameters.items():
        if name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if name not in hints:
            raise TypeError(f"tool {fn.__name__!r}: argument {name!r} needs a type hint")
        props[name] = {
            **_type_schema(hints[name]),
            **({"description": arg_docs[name]} if name in arg_docs else {}),
        }
        if p.default is inspect.Parameter.empty:
            required.append(name)
    return {
        "type": "function",
        "function": {
            "name": fn.__name__,
            "description": desc,
            "parameters": {"type": "object", "properties": props, "required": required},
        },
    }


def _matches(value: Any, tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if tp is Any:
        return True
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp in (str, bool, list, dict):
        return isinstance(value, tp)
    if origin is typing.Literal:
        return value in typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if origin in (list, Sequence, tuple):
        inner = typing.get_args(tp)
        return isinstance(value, list) and (not inner or all(_matches(v, inner[0]) for v in value))
    if origin is dict:
        return isinstance(value, dict)
    return True


def check_arguments(fn: Callable, arguments: dict[str, Any]) -> str | None:
    """None when ``arguments`` fit ``fn``'s signature, else a message for the model."""
    sig = inspect.signature(fn)
    hints = typing.get_type_hints(fn)
    params = {n: p for n, p in sig.parameters.items() if n != "self"}
    unknown = sorted(set(arguments) - set(params))
    if unknown:
        return f"{fn.__name__}() got unknown argument(s) {unknown}; expected {sorted(params)}"
    missing = [n for n, p in params.items() if p.default is inspect.Parameter.empty and n not in arguments]
    if missing:
        return f"{fn.__name__}() is missing required argument(s) {missing}"
    for name, value in arguments.items():
        tp = hints.get(name, Any)
        if not _matches(value, tp):
            want = _type_schema(tp).get("type", str(tp))
            return f"{fn.__name__}(): argument {name!r} must be {want}, got {type(value).__name__} {value!r}"
    return None
