"""The OpenAI Chat Completions request: its types, and the validation behind every 400.

``parse_chat_request`` turns a JSON body and its headers into a ``ChatRequest``, or raises an
``APIError`` naming the offending ``param`` the way OpenAI does. ``ChatResult`` is what a
``ChatBackend`` returns for one turn; ``agentrl.serve.openai_api`` writes it back over HTTP.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_STOP = 4  # OpenAI's limit on stop sequences
MAX_TOP_LOGPROBS = 20
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")

# Accepted and ignored: bookkeeping fields that do not change what the policy samples.
IGNORED_FIELDS = frozenset({"user", "metadata", "store", "parallel_tool_calls", "service_tier"})
CHECKED_FIELDS = frozenset(
    {
        "model",
        "messages",
        "tools",
        "tool_choice",
        "max_tokens",
        "max_completion_tokens",
        "stop",
        "temperature",
    }
    | {"top_p", "seed", "logprobs", "top_logprobs", "stream", "stream_options", "n", "response_format"}
    | {"frequency_penalty", "presence_penalty", "logit_bias", "functions", "function_call"}
)
# Fields a message of each role may carry. The assistant's last four are what openai's
# ``ChatCompletionMessage.model_dump()`` adds; they must be empty and are dropped.
MESSAGE_FIELDS = {
    "system": {"role", "content", "name"},
    "user": {"role", "content", "name"},
    "tool": {"role", "content", "tool_call_id", "name"},
    "assistant": {"role", "content", "name", "tool_calls", "reasoning_content"}
    | {"refusal", "annotations", "audio", "function_call"},
}
MUST_BE_EMPTY = {
    "refusal": "refusal messages are not supported",
    "audio": "audio output is not supported",
    "function_call": "the legacy function_call field is not supported; use tool_calls",
}


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


@dataclass
class ChatRequest:
    """A validated chat completion request (see ``parse_chat_request`` for the rules)."""

    key: str  # episode key: the X-Episode-Key header, else the bearer token (the client's api_key)
    model: str
    messages: list[
        dict
    ]  # {"role", "content": str, "tool_calls"?, "tool_call_id"?, "name"?, "reasoning_content"?}
    tools: (
        list[dict] | None
    )  # [{"type": "function", "function": {"name", "description"?, "parameters"?, "strict"?}}]
    tool_choice: str | None  # "auto" | "none" | None
    max_tokens: int | None  # max_completion_tokens or max_tokens, >= 1
    stop: list[str]
    temperature: float | None
    top_p: float | None
    seed: int | None
    logprobs: bool
    top_logprobs: int  # 0..20; the response's top_logprobs lists stay empty (see completion_body)
    stream: bool
    include_usage: bool  # stream_options.include_usage
    raw: dict  # the JSON body as received


@dataclass
class ChatResult:
    """One generated assistant turn, as the backend returns it."""

    content: str | None
    tool_calls: list[dict]  # [{"id": str, "type": "function", "function": {"name": str, "arguments": str}}]
    finish_reason: str  # "stop" | "length" | "tool_calls"
    completion_tokens: list[str]  # decoded text of each sampled token (for logprobs output)
    logprobs: list[float]  # one per sampled token
    prompt_tokens: int
    reasoning_content: str | None = None
    extra: dict = field(default_factory=dict)  # returned under the top-level key "agentrl"


class ChatBackend(Protocol):
    """What the server calls. ``chat`` may raise ``APIError`` (sent as is) or anything else (a 500).

    Optional routes, served when the backend has the method:
    ``episode(key) -> dict`` for GET /v1/episodes/{key};
    ``finish(key, body) -> dict`` for POST /v1/episodes/{key}/finish.
    """

    model_name: str

    def chat(self, request: ChatRequest) -> ChatResult: ...


# ---------------------------------------------------------------- request validation


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


def episode_key(headers: Mapping[str, str]) -> str:
    """The X-Episode-Key header if set, else the token of ``Authorization: Bearer <key>``."""
    lower = {name.lower(): value for name, value in headers.items()}
    key = lower.get("x-episode-key", "").strip()
    scheme, _, token = lower.get("authorization", "").strip().partition(" ")
    if not key and scheme.lower() == "bearer":
        key = token.strip()
    if not key:
        raise APIError(
            401,
            "No episode key. Send it as the API key (Authorization: Bearer <key>, i.e. "
            "OpenAI(api_key=<key>)) or in the X-Episode-Key header.",
            code="missing_episode_key",
        )
    return key


def parse_chat_request(body: Any, headers: Mapping[str, str]) -> ChatRequest:
    """Validate a parsed JSON body; every failure is a 4xx ``APIError`` naming its ``param``."""
    key = episode_key(headers)
    if not isinstance(body, dict):
        raise bad(None, f"The request body must be a JSON object, got {kind(body)}.")
    unknown = sorted(set(body) - CHECKED_FIELDS - IGNORED_FIELDS)
    if unknown:
        plural = "s" if len(unknown) > 1 else ""
        raise bad(unknown[0], f"Unrecognized request argument{plural} supplied: {', '.join(unknown)}")
    reject_unsupported(body)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("model", f"You must provide a model parameter (a non-empty string), got {kind(model)}.")
    logprobs = flag(body, "logprobs")
    top_logprobs = integer(body, "top_logprobs", 0, MAX_TOP_LOGPROBS) or 0
    if top_logprobs and not logprobs:
        raise bad("top_logprobs", "top_logprobs needs logprobs set to true.")
    stream_options = body.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, dict):
        raise bad("stream_options", f"stream_options must be an object, got {kind(stream_options)}.")
    return ChatRequest(
        key=key,
        model=model,
        messages=parse_messages(body.get("messages")),
        tools=parse_tools(body.get("tools")),
        tool_choice=parse_tool_choice(body.get("tool_choice")),
        max_tokens=max_tokens(body),
        stop=parse_stop(body.get("stop")),
        temperature=number(body, "temperature", 0.0, 2.0),
        top_p=number(body, "top_p", 0.0, 1.0),
        seed=integer(body, "seed"),
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        stream=flag(body, "stream"),
        include_usage=flag(stream_options or {}, "include_usage", "stream_options.include_usage"),
        raw=body,
    )


def reject_unsupported(body: dict) -> None:
    """Parameters OpenAI has but a sampled RL policy cannot honour: refused, never silently ignored."""
    n = integer(body, "n", 1)
    if n not in (None, 1):
        raise bad("n", f"n must be 1 (one choice per request), got {n}; send n separate requests.")
    if body.get("response_format") not in (None, {"type": "text"}):
        raise bad("response_format", 'response_format is not supported; only {"type": "text"} is accepted.')
    if body.get("logit_bias") not in (None, {}):
        raise bad("logit_bias", "logit_bias is not supported.")
    for legacy in ("functions", "function_call"):
        if body.get(legacy) is not None:
            raise bad(legacy, f"The legacy {legacy} parameter is not supported; use tools and tool_choice.")
    for penalty in ("frequency_penalty", "presence_penalty"):
        if number(body, penalty, -2.0, 2.0):
            raise bad(penalty, f"{penalty} is not supported: it must be 0 or absent.")


def number(body: Mapping, name: str, lo: float, hi: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad(name, f"{name} must be a number, got {kind(value)}.")
    if not lo <= value <= hi:
        raise bad(name, f"{name} must be between {lo:g} and {hi:g}, got {value}.")
    return float(value)


def integer(body: Mapping, name: str, lo: int | None = None, hi: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(name, f"{name} must be an integer, got {kind(value)}.")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        allowed = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
        raise bad(name, f"{name} must be {allowed}, got {value}.")
    return value


def flag(body: Mapping, name: str, param: str | None = None) -> bool:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise bad(param or name, f"{param or name} must be a boolean, got {kind(value)}.")
    return bool(value)


def max_tokens(body: dict) -> int | None:
    legacy = integer(body, "max_tokens", 1)
    current = integer(body, "max_completion_tokens", 1)
    if legacy is not None and current is not None and legacy != current:
        raise bad(
            "max_tokens",
            f"max_tokens ({legacy}) and max_completion_tokens ({current}) disagree; send only one.",
        )
    return current if current is not None else legacy


def parse_stop(value: Any) -> list[str]:
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise bad("stop", "stop must be a non-empty string or an array of non-empty strings.")
    if len(stops) > MAX_STOP:
        raise bad("stop", f"stop takes at most {MAX_STOP} sequences, got {len(stops)}.")
    return list(stops)


def parse_tool_choice(value: Any) -> str | None:
    if value is None or value in ("auto", "none"):
        return value
    if value == "required" or isinstance(value, dict):
        raise bad(
            "tool_choice",
            f"tool_choice {json.dumps(value)} is not supported: the policy is sampled freely, "
            'so only "auto" and "none" are accepted.',
        )
    raise bad("tool_choice", f'tool_choice must be "auto" or "none", got {json.dumps(value)}.')


def reject_unknown(obj: dict, allowed: set[str], where: str, what: str) -> None:
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise bad(
            f"{where}.{unknown[0]}",
            f"Unrecognized field(s) in {where} ({what}): {', '.join(unknown)}; "
            f"allowed: {', '.join(sorted(allowed))}.",
        )


def parse_tools(value: Any) -> list[dict] | None:
    if value is None or value == []:
        return None
    if not isinstance(value, list):
        raise bad("tools", f"tools must be an array of tool definitions, got {kind(value)}.")
    tools, names = [], set()
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise bad(f"{where}.type", f'{where} must be an object with "type": "function".')
        reject_unknown(tool, {"type", "function"}, where, "a tool")
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise bad(f"{where}.function", f"{where}.function must be an object, got {kind(fn)}.")
        reject_unknown(fn, {"name", "description", "parameters", "strict"}, f"{where}.function", "a function")
        name = fn.get("name")
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
            raise bad(f"{where}.function.name", f"{where}.function.name must match [A-Za-z0-9_-]{{1,64}}.")
        if name in names:
            raise bad(f"{where}.function.name", f"Duplicate tool name {name!r}.")
        names.add(name)
        for part, typ in (("description", str), ("parameters", dict), ("strict", bool)):
            if fn.get(part) is not None and not isinstance(fn[part], typ):
                raise bad(f"{where}.function.{part}", f"{where}.function.{part} has the wrong type.")
        kept = {part: fn[part] for part in ("name", "description", "parameters", "strict") if part in fn}
        tools.append({"type": "function", "function": kept})
    return tools


def parse_messages(value: Any) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise bad("messages", f"messages must be a non-empty array of messages, got {kind(value)}.")
    messages = [parse_message(message, f"messages[{i}]") for i, message in enumerate(value)]
    if messages[-1]["role"] == "assistant":
        raise bad(
            f"messages[{len(messages) - 1}].role",
            "The last message is an assistant message; continuing an assistant turn is not supported. "
            "End with a user or tool message.",
        )
    return messages


def parse_message(message: Any, where: str) -> dict:
    if not isinstance(message, dict):
        raise bad(where, f"{where} must be an object, got {kind(message)}.")
    role = message.get("role")
    if role not in ROLES:
        raise bad(f"{where}.role", f"Invalid role {role!r} in {where}; allowed: {', '.join(ROLES)}.")
    role = "system" if role == "developer" else role
    reject_unknown(message, MESSAGE_FIELDS[role], where, f"a {role} message")
    out: dict[str, Any] = {"role": role}
    tool_calls = []
    if role == "assistant":
        for name, reason in MUST_BE_EMPTY.items():
            if message.get(name) is not None:
                raise bad(f"{where}.{name}", f"{where}.{name}: {reason}.")
        tool_calls = parse_tool_calls(message.get("tool_calls"), f"{where}.tool_calls")
    content = message.get("content")
    if content is None and not tool_calls:
        needs = "content or tool_calls" if role == "assistant" else "content"
        raise bad(f"{where}.content", f"{where} ({role}) needs {needs}.")
    out["content"] = "" if content is None else text_content(content, f"{where}.content")
    if tool_calls:
        out["tool_calls"] = tool_calls
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise bad(f"{where}.tool_call_id", f"{where} is a tool message and needs a tool_call_id string.")
        out["tool_call_id"] = call_id
    for name in ("name", "reasoning_content"):
        if message.get(name) is not None:
            if not isinstance(message[name], str):
                raise bad(f"{where}.{name}", f"{where}.{name} must be a string, got {kind(message[name])}.")
            out[name] = message[name]
    return out


def text_content(content: Any, where: str) -> str:
    """A string, or text parts joined with newlines; any other part (image, audio, file) is refused."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(where, f"{where} must be a string or an array of text parts, got {kind(content)}.")
    texts = []
    for j, part in enumerate(content):
        part_type = part.get("type") if isinstance(part, dict) else None
        if part_type != "text":
            shown = f"a {part_type!r} part" if part_type else kind(part)
            raise bad(f"{where}[{j}].type", f"Only text content is supported; {where}[{j}] is {shown}.")
        if not isinstance(part.get("text"), str):
            raise bad(f"{where}[{j}].text", f"{where}[{j}].text must be a string.")
        texts.append(part["text"])
    return "\n".join(texts)


def parse_tool_calls(value: Any, where: str) -> list[dict]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise bad(where, f"{where} must be an array, got {kind(value)}.")
    calls = []
    for j, call in enumerate(value):
        at = f"{where}[{j}]"
        if not isinstance(call, dict):
            raise bad(at, f"{at} must be an object, got {kind(call)}.")
        reject_unknown(call, {"id", "type", "function", "index"}, at, "a tool call")  # index: from streams
        if not isinstance(call.get("id"), str) or not call["id"]:
            raise bad(f"{at}.id", f"{at}.id must be a non-empty string.")
        if call.get("type") != "function":
            raise bad(f"{at}.type", f'{at}.type must be "function", got {json.dumps(call.get("type"))}.')
        fn = call.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad(f"{at}.function", f"{at}.function must be an object with a non-empty name.")
        reject_unknown(fn, {"name", "arguments"}, f"{at}.function", "a function call")
        arguments = fn.get("arguments")
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else None
        except (ValueError, RecursionError) as e:
            raise bad(
                f"{at}.function.arguments", f"{at}.function.arguments is not valid JSON: {e}."
            ) from None
        if not isinstance(parsed, dict):
            raise bad(f"{at}.function.arguments", f"{at}.function.arguments must be JSON object text.")
        calls.append(
            {"id": call["id"], "type": "function", "function": {"name": fn["name"], "arguments": arguments}}
        )
    return calls
