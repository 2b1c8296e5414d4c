"""The OpenAI Chat Completions protocol of ``agentrl serve``: validation, response shapes, HTTP.

A ``ChatBackend`` owns episodes and generation. This module only speaks the protocol: it turns an
HTTP request into a validated ``ChatRequest`` (``parse_chat_request``), calls ``backend.chat``, and
writes the ``ChatResult`` back as a ``chat.completion`` object, or writes an OpenAI-style error
(``{"error": {"message", "type", "param", "code"}}``). Malformed requests get a 4xx naming the
offending ``param``; anything the backend raises other than ``APIError`` becomes a 500
``server_error``; the server itself keeps running either way.

Streaming (``stream: true``) re-encodes the finished result as server-sent events (role, reasoning,
content, tool calls, finish reason with the logprobs, usage): the backend returns a whole turn at
once, so the client sees nothing until generation ends, then the same turn a non-streaming call gets.

One thread per connection (``ThreadingHTTPServer``): ``backend.chat`` blocks while the engine
generates and many agents call at once, so the backend must be thread-safe. The server binds
127.0.0.1 unless another host is passed: whoever reaches the port can drive the policy.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import math
import re
import socket
import socketserver
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

logger = logging.getLogger(__name__)

ROLES = ("system", "developer", "user", "assistant", "tool")
FINISH_REASONS = ("stop", "length", "tool_calls")
MAX_STOP = 4  # OpenAI's limit on stop sequences
MAX_TOP_LOGPROBS = 20
MIN_LOGPROB = -9999.0  # what OpenAI reports for a token of probability ~0; JSON has no -Infinity
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
SERVED = "this server serves only chat completions (POST /v1/chat/completions)"

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


# ---------------------------------------------------------------- responses


def check_result(request: ChatRequest, result: ChatResult) -> None:
    """A backend bug is a 500 here, not a malformed response the client chokes on."""
    if result.finish_reason not in FINISH_REASONS:
        raise ValueError(f"backend finish_reason {result.finish_reason!r} is not one of {FINISH_REASONS}")
    if request.logprobs and len(result.completion_tokens) != len(result.logprobs):
        raise ValueError(
            f"backend returned {len(result.completion_tokens)} tokens but {len(result.logprobs)} logprobs"
        )


def usage(result: ChatResult) -> dict:
    completion = len(result.logprobs)
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": result.prompt_tokens + completion,
    }


def logprobs_body(request: ChatRequest, result: ChatResult) -> dict | None:
    """OpenAI's choice.logprobs. ``bytes`` encodes the decoded text, so a token that splits a UTF-8
    character shows U+FFFD's bytes. ``top_logprobs`` stays empty: the engine samples, it does not rank."""
    if not request.logprobs:
        return None
    return {
        "content": [
            {
                "token": token,
                "logprob": logprob if math.isfinite(logprob) else MIN_LOGPROB,
                "bytes": list(token.encode("utf-8")),
                "top_logprobs": [],
            }
            for token, logprob in zip(result.completion_tokens, result.logprobs)
        ]
    }


def completion_body(request: ChatRequest, result: ChatResult, completion_id: str, created: int) -> dict:
    """The ``chat.completion`` object, with ``result.extra`` under the top-level key "agentrl"."""
    message: dict[str, Any] = {"role": "assistant", "content": result.content}
    if result.tool_calls:
        message["tool_calls"] = result.tool_calls
    if result.reasoning_content is not None:
        message["reasoning_content"] = result.reasoning_content
    choice = {
        "index": 0,
        "message": message,
        "logprobs": logprobs_body(request, result),
        "finish_reason": result.finish_reason,
    }
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": request.model,
        "choices": [choice],
        "usage": usage(result),
        "agentrl": result.extra,
    }


def stream_chunks(
    request: ChatRequest, result: ChatResult, completion_id: str, created: int
) -> Iterator[dict]:
    """The same turn as ``chat.completion.chunk`` objects; the finish chunk carries the logprobs and
    "agentrl", and a usage chunk (no choices) follows when ``include_usage`` is set."""

    def chunk(delta: dict, finish_reason: str | None = None, logprobs: dict | None = None) -> dict:
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        head = {"id": completion_id, "object": "chat.completion.chunk", "created": created}
        return {**head, "model": request.model, "choices": [choice]}

    yield chunk({"role": "assistant"})
    if result.reasoning_content:
        yield chunk({"reasoning_content": result.reasoning_content})
    if result.content is not None:
        yield chunk({"content": result.content})
    for index, call in enumerate(result.tool_calls):
        yield chunk({"tool_calls": [{"index": index, **call}]})
    yield {**chunk({}, result.finish_reason, logprobs_body(request, result)), "agentrl": result.extra}
    if request.include_usage:
        yield {**chunk({}), "choices": [], "usage": usage(result)}


# ---------------------------------------------------------------- HTTP


class ClientGone(Exception):
    """The client closed its connection; nothing more can be sent to it."""


def parse_json(data: bytes) -> Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as e:
        raise bad(
            None, f"We could not parse the JSON body of your request ({e}); send a JSON object."
        ) from None


def not_found(method: str, path: str) -> APIError:
    message = f"Invalid URL ({method} {path})"
    return APIError(
        404, f"{message}: {SERVED}." if path.startswith("/v1/") else f"{message}.", code="unknown_url"
    )


class RequestHandler(BaseHTTPRequestHandler):
    """One connection; keep-alive, so a thread serves many requests of the same client in turn."""

    protocol_version = "HTTP/1.1"
    server_version = "agentrl-serve"
    server: ServerCore

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in two writes; with Nagle's algorithm the second waits for the
        # client's delayed ACK (~40 ms on Linux), which would be most of a small model's turn.
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_GET(self) -> None:
        self.dispatch(self.command)

    do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

    def handle(self) -> None:
        # A client may reset its idle keep-alive connection (httpx does after a stream it did not
        # read to the end); the wait for its next request then fails, which is no error of ours.
        try:
            super().handle()
        except (ConnectionError, TimeoutError) as e:
            logger.debug("connection from %s ended: %r", self.address_string(), e)

    def dispatch(self, method: str) -> None:
        self.started = False  # a response's status line went out: too late to send an error
        path = urlsplit(self.path).path.rstrip("/") or "/"
        try:
            self.body = self.read_body()
            self.route(method, path)()
        except ClientGone:
            self.close_connection = True
            logger.debug("client %s went away during %s %s", self.address_string(), method, path)
        except APIError as e:
            self.send_api_error(e)
        except Exception as e:
            logger.exception("%s %s failed", method, path)
            self.send_api_error(APIError(500, f"{type(e).__name__}: {e}", type="server_error"))

    def route(self, method: str, path: str) -> Callable[[], None]:
        routes: dict[str, Callable[[], None]]
        if path == "/v1/chat/completions":
            routes = {"POST": self.chat}
        elif path == "/v1/models":
            routes = {"GET": self.models}
        elif path == "/health":
            routes = {"GET": lambda: self.send_json(200, {"status": "ok"})}
        elif match := re.fullmatch(r"/v1/episodes/([^/]+)(/finish)?", path):
            key = unquote(match[1])
            if match[2]:
                routes = {"POST": lambda: self.episode_route("finish", key)}
            else:
                routes = {"GET": lambda: self.episode_route("episode", key)}
        else:
            raise not_found(method, path)
        if method not in routes:
            self.allow = ", ".join(routes)
            raise APIError(
                405, f"{method} is not allowed on {path}; use {self.allow}.", code="method_not_allowed"
            )
        return routes[method]

    def chat(self) -> None:
        headers = dict(self.headers.items())
        episode_key(headers)  # a missing key is a 401 before any complaint about the body
        request = parse_chat_request(parse_json(self.body), headers)
        result = self.server.backend.chat(request)
        check_result(request, result)
        completion_id, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        if not request.stream:
            self.send_json(200, completion_body(request, result, completion_id, created))
            return
        # Encoded before the status line goes out, so a result that cannot be encoded is still a 500.
        events = [
            f"data: {json.dumps(c)}\n\n".encode()
            for c in stream_chunks(request, result, completion_id, created)
        ]
        self.send_events([*events, b"data: [DONE]\n\n"])

    def models(self) -> None:
        model = {"id": self.server.backend.model_name, "object": "model", "created": 0, "owned_by": "agentrl"}
        self.send_json(200, {"object": "list", "data": [model]})

    def episode_route(self, name: str, key: str) -> None:
        method = getattr(self.server.backend, name, None)
        if method is None:
            raise APIError(404, f"This backend has no episode routes (no {name}()).", code="unknown_url")
        if name == "finish":
            body = parse_json(self.body) if self.body.strip() else {}
            if not isinstance(body, dict):
                raise bad(None, f"The request body must be a JSON object, got {kind(body)}.")
            self.send_json(200, method(key, body))
        else:
            self.send_json(200, method(key))

    def read_body(self) -> bytes:
        """The request body, read whole even when refused, so the keep-alive stream stays in step."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            raise APIError(411, "Chunked request bodies are not supported; send Content-Length.")
        try:
            length = int(self.headers.get("Content-Length", "0"))
            if length < 0:
                raise ValueError
        except ValueError:
            self.close_connection = True
            raise bad(None, "Invalid Content-Length header.") from None
        limit = self.server.max_body_bytes
        if length > limit:
            self.discard(length)
            raise APIError(
                413,
                f"The request body is {length} bytes; this server accepts at most {limit}.",
                code="request_too_large",
            )
        return self.read_exactly(length)

    def read_exactly(self, length: int) -> bytes:
        try:
            data = self.rfile.read(length)
        except (ConnectionError, TimeoutError) as e:
            raise ClientGone from e
        if len(data) < length:
            raise ClientGone
        return data

    def discard(self, length: int) -> None:
        """Read and drop an oversize body (closing with unread data would reset the connection before
        the client reads the 413); past 256 MiB, just close."""
        self.close_connection = True
        if length <= 256 * 2**20:
            for start in range(0, length, 2**20):
                self.read_exactly(min(2**20, length - start))

    def send_api_error(self, error: APIError) -> None:
        if self.started:  # mid-stream: the client sees the connection end early
            self.close_connection = True
            return
        allow = {"Allow": self.allow} if error.status == 405 else {}
        try:
            self.send_json(error.status, error.body(), allow)
        except ClientGone:
            self.close_connection = True

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own protocol errors (bad request line, unsupported method) in OpenAI's shape."""
        self.close_connection = True
        self.started = False
        kind_ = "server_error" if code >= 500 else "invalid_request_error"
        text = message or self.responses.get(code, ("Error",))[0]
        self.send_api_error(APIError(code, f"{text} ({self.requestline or 'no request line'})", type=kind_))

    def start_response(self, status: int, headers: Mapping[str, str]) -> None:
        self.started = True
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()

    def send_json(self, status: int, obj: Any, headers: Mapping[str, str] | None = None) -> None:
        data = json.dumps(obj).encode()
        more = {"Content-Type": "application/json", "Content-Length": str(len(data)), **(headers or {})}
        self.write(lambda: self.start_response(status, more), b"" if self.command == "HEAD" else data)

    def send_events(self, events: list[bytes]) -> None:
        """Server-sent events in chunked transfer encoding, so the connection can be kept alive."""
        headers = {
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "Transfer-Encoding": "chunked",
        }
        self.write(lambda: self.start_response(200, headers))
        for event in events:
            self.write(None, b"%x\r\n%s\r\n" % (len(event), event))
        self.write(None, b"0\r\n\r\n")

    def write(self, head: Callable[[], None] | None, data: bytes = b"") -> None:
        try:
            if head is not None:
                head()
            if data:
                self.wfile.write(data)
        except (ConnectionError, TimeoutError) as e:
            raise ClientGone from e

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s %s", self.address_string(), format % args)


class ServerCore(ThreadingHTTPServer):
    """ThreadingHTTPServer that knows its backend and its open connections (to end them on close)."""

    daemon_threads = True
    request_queue_size = 1024  # the listen backlog: every agent of a batch may connect at once

    def __init__(self, address: tuple[str, int], backend: ChatBackend, max_body_bytes: int) -> None:
        self.backend = backend
        self.max_body_bytes = max_body_bytes
        self.connections: set[socket.socket] = set()
        self.lock = threading.Lock()
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, RequestHandler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind does a reverse DNS lookup of the host, which can stall for seconds.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.lock:
            self.connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.lock:
            self.connections.discard(request)
        super().shutdown_request(request)

    def end_connections(self) -> None:
        with self.lock:
            open_now = list(self.connections)
        for connection in open_now:
            with contextlib.suppress(OSError):  # already closed by the client
                connection.shutdown(socket.SHUT_RDWR)


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class OpenAIServer:
    """The HTTP server: ``OpenAIServer(backend).start()``, then point ``openai.OpenAI(base_url=server.url,
    api_key=<episode key>)`` at it; ``close()`` (or a ``with`` block) stops it."""

    POLL_S = 0.1  # how often serve_forever checks for close(); bounds close()'s wait
    JOIN_S = 2.0

    def __init__(
        self, backend: ChatBackend, host: str = "127.0.0.1", port: int = 0, max_body_bytes: int = 16 * 2**20
    ) -> None:
        if max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be positive, got {max_body_bytes}")
        self.core = ServerCore((host, port), backend, max_body_bytes)
        self.thread: threading.Thread | None = None
        self.serving = False
        self.closed = False
        if not is_loopback(host):
            logger.warning("serving on %s: anyone who can reach %s can drive the policy", host, self.url)

    @property
    def url(self) -> str:
        host, port = str(self.core.server_address[0]), self.core.server_address[1]
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/v1"

    def start(self) -> OpenAIServer:
        if self.serving or self.closed:
            raise RuntimeError("this server was already started")
        self.serving = True
        self.thread = threading.Thread(target=self.core.serve_forever, args=(self.POLL_S,), daemon=True)
        self.thread.name = f"agentrl-serve:{self.core.server_port}"
        self.thread.start()
        return self

    def serve_forever(self) -> None:
        if self.serving or self.closed:
            raise RuntimeError("this server was already started")
        self.serving = True
        self.core.serve_forever(self.POLL_S)

    def close(self) -> None:
        """Stop accepting, close the socket, end open connections, join the thread (at most ~2 s)."""
        if self.closed:
            return
        self.closed = True
        if self.serving:  # shutdown() waits for serve_forever, so only once it has been called
            self.core.shutdown()
        self.core.server_close()
        self.core.end_connections()
        if self.thread is not None:
            self.thread.join(self.JOIN_S)

    def __enter__(self) -> OpenAIServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
