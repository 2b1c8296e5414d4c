"""The OpenAI error a request gets: ``APIError`` (an HTTP status and OpenAI's ``{"error": {...}}``
body), and the validation messages in OpenAI's words: a pydantic failure of the request's schema
(``openai_request``) becomes a 400 whose ``param`` is OpenAI's path to the field
(``messages[2].tool_call_id``) and whose message says what was expected and what came (``api_error``).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError
from pydantic_core import PydanticCustomError


class APIError(Exception):
    """An OpenAI-style error: HTTP status + {"error": {"message", "type", "param", "code"}}."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(param: str | None, message: str) -> APIError:
    return APIError(400, message, param=param)


def kind(value: Any) -> str:
    """The JSON type name of a parsed value, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    names = {int: "integer", float: "number", str: "string", list: "array", dict: "object"}
    return names.get(type(value), type(value).__name__)


# pydantic's error types, in OpenAI's words; {where} is the field's path, {got} the JSON type received.
MESSAGES = {
    "missing": "{where} is required.",
    "int_type": "{where} must be an integer, got {got}.",
    "float_type": "{where} must be a number, got {got}.",
    "bool_type": "{where} must be a boolean, got {got}.",
    "string_type": "{where} must be a string, got {got}.",
    "string_too_short": "{where} must be a non-empty string.",
    "string_pattern_mismatch": "{where} must match [A-Za-z0-9_-]{{1,64}}.",
    "list_type": "{where} must be an array, got {got}.",
    "dict_type": "{where} must be an object, got {got}.",
    "model_type": "{where} must be an object, got {got}.",
    "literal_error": "{where} must be {expected}, got {value}.",
}


def fail(message: str, at: str = "") -> PydanticCustomError:
    """A rule's failure. ``message`` names the field as ``{where}`` (``api_error`` fills it in);
    ``at`` extends the field's path to the part that failed (``[3].type`` inside a list it checked)."""
    return PydanticCustomError("agentrl", message, {"at": at})


def location(loc: tuple[int | str, ...]) -> str:
    """pydantic's ``("messages", 0, "content")`` as OpenAI's ``messages[0].content``."""
    parts = list(loc)
    if len(parts) > 2 and parts[0] == "messages" and isinstance(parts[1], int):
        del parts[2]  # the role tag pydantic adds to a path inside the message union
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in parts).lstrip(".")


def api_error(error: ValidationError) -> APIError:
    """The first failure as a 400 whose ``param`` is the field's path and whose message names it."""
    first = error.errors(include_url=False)[0]
    where = location(first["loc"])
    context = first.get("ctx") or {}
    param = (where + context.get("at", "")).lstrip(".") or None
    if first["type"] == "agentrl":
        text = first["msg"]
    else:
        template = MESSAGES.get(first["type"], "{where}: {msg}.")
        value = json.dumps(first["input"]) if first["type"] == "literal_error" else ""
        got, expected = kind(first["input"]), str(context.get("expected")).replace("'", '"')
        text = template.format(where="{where}", got=got, value=value, expected=expected, msg=first["msg"])
    return bad(param, text.replace("{where}", where or "the request"))
