"""The OpenAI Chat Completions request: its schema, and the validation behind every 400.

The request is declared as pydantic models (``ChatBody`` and the message, tool and tool-call models it
holds), strict: a string is never coerced to a number, an unknown field is refused, never dropped.
``parse_chat_request`` validates a JSON body with them and turns it into a ``ChatRequest``; a
validation failure becomes an ``APIError`` whose ``param`` is OpenAI's path to the offending field
(``messages[2].tool_call_id``) and whose message says what was expected and what came
(``openai_errors``).
``ChatResult`` is what a ``ChatBackend`` returns for one turn; ``agentrl.serve.openai_api`` writes it
back over HTTP.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal, Protocol

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from agentrl.serve.openai_errors import APIError, api_error, bad, fail, kind

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_STOP = 4  # OpenAI's limit on stop sequences
MAX_TOP_LOGPROBS = 20
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]
"""OpenAI's ``reasoning_effort`` values (``none`` and ``xhigh`` came with GPT-5.1 and later)."""
TOOL_NAME = r"^[A-Za-z0-9_-]{1,64}$"


@dataclass
class ChatRequest:
    """A validated chat completion request (see ``ChatBody`` for the rules)."""

    key: str
    """The episode key: the X-Episode-Key header, else the bearer token (the client's ``api_key``)."""
    model: str
    messages: list[dict]
    """``{"role", "content": str, "tool_calls"?, "tool_call_id"?, "name"?, "reasoning_content"?}``"""
    tools: list[dict] | None
    """``[{"type": "function", "function": {"name", "description"?, "parameters"?, "strict"?}}]``"""
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
    reasoning_effort: ReasoningEffort | None = None  # the backend decides what it can honour


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
    try:
        chat = ChatBody.model_validate(body)
    except ValidationError as e:
        raise api_error(e) from None
    return ChatRequest(
        key=key,
        model=chat.model,
        messages=[message.as_dict() for message in chat.messages or []],
        tools=[tool.model_dump(exclude_unset=True) for tool in chat.tools] if chat.tools else None,
        tool_choice=chat.tool_choice,
        max_tokens=chat.max_completion_tokens if chat.max_completion_tokens is not None else chat.max_tokens,
        stop=chat.stop,
        temperature=chat.temperature,
        top_p=chat.top_p,
        seed=chat.seed,
        logprobs=bool(chat.logprobs),
        top_logprobs=chat.top_logprobs or 0,
        stream=bool(chat.stream),
        include_usage=bool(chat.stream_options and chat.stream_options.include_usage),
        raw=body,
        reasoning_effort=chat.reasoning_effort,
    )


# ---------------------------------------------------------------- the schema


def between(lo: float, hi: float) -> AfterValidator:
    def check(value: float) -> float:
        if not lo <= value <= hi:
            raise fail(f"{{where}} must be between {lo:g} and {hi:g}, got {value}.")
        return value

    return AfterValidator(check)


def at_least(lo: int) -> AfterValidator:
    def check(value: int) -> int:
        if value < lo:
            raise fail(f"{{where}} must be at least {lo}, got {value}.")
        return value

    return AfterValidator(check)


def only(allowed: tuple, reason: str) -> AfterValidator:
    """Accepted only as one of ``allowed`` (or absent): anything else is refused, never ignored."""

    def check(value: Any) -> Any:
        if value is not None and value not in allowed:
            raise fail(f"{{where}} {reason}")
        return value

    return AfterValidator(check)


NonEmpty = Annotated[str, Field(min_length=1)]
Penalty = Annotated[float, between(-2.0, 2.0), only((0,), "is not supported: it must be 0 or absent.")]


class Schema(BaseModel):
    """Strict (no coercion) and closed: a field the model does not declare is an error naming it."""

    model_config = ConfigDict(strict=True, extra="forbid")
    what: ClassVar[str] = "an object"  # the object, in error messages

    @model_validator(mode="before")
    @classmethod
    def known_fields(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise fail(f"{{where}} must be an object, got {kind(data)}.")
        unknown = sorted(set(data) - set(cls.model_fields))
        if unknown:
            raise fail(cls.unknown_message(unknown), at=f".{unknown[0]}")
        return data

    @classmethod
    def unknown_message(cls, unknown: list[str]) -> str:
        return (
            f"Unrecognized field(s) in {{where}} ({cls.what}): {', '.join(unknown)}; "
            f"allowed: {', '.join(sorted(cls.model_fields))}."
        )


class FunctionDef(Schema):
    what = "a function"
    name: Annotated[str, Field(pattern=TOOL_NAME)]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(Schema):
    what = "a tool"
    type: Literal["function"]
    function: FunctionDef


class FunctionCall(Schema):
    what = "a function call"
    name: NonEmpty
    arguments: Any = None

    @field_validator("arguments")
    @classmethod
    def json_object_text(cls, arguments: Any) -> str:
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else None
        except (ValueError, RecursionError) as e:
            raise fail(f"{{where}} is not valid JSON: {e}.") from None
        if not isinstance(parsed, dict):
            raise fail("{where} must be JSON object text.")
        return arguments


class ToolCall(Schema):
    what = "a tool call"
    id: NonEmpty
    type: Literal["function"]
    function: FunctionCall
    index: int | None = None  # sent back by clients that assembled the call from a stream; dropped


def text_content(content: Any) -> str | None:
    """A string, or text parts joined with newlines; any other part (image, audio, file) is refused."""
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise fail(f"{{where}} must be a string or an array of text parts, got {kind(content)}.")
    texts = []
    for j, part in enumerate(content):
        part_type = part.get("type") if isinstance(part, dict) else None
        if part_type != "text":
            shown = f"a {part_type!r} part" if part_type else kind(part)
            raise fail(f"Only text content is supported; {{where}}[{j}] is {shown}.", at=f"[{j}].type")
        if not isinstance(part.get("text"), str):
            raise fail(f"{{where}}[{j}].text must be a string.", at=f"[{j}].text")
        texts.append(part["text"])
    return "\n".join(texts)


class Message(Schema):
    """Fields every role has; ``as_dict`` is the message the chat template renders."""

    role: str
    content: Annotated[Any, AfterValidator(text_content)] = None
    name: str | None = None

    @model_validator(mode="after")
    def has_content(self) -> Message:
        if self.content is None and not getattr(self, "tool_calls", None):
            needs = "content or tool_calls" if self.role == "assistant" else "content"
            raise fail(f"{{where}} ({self.role}) needs {needs}.", at=".content")
        return self

    def as_dict(self) -> dict:
        role = "system" if self.role == "developer" else self.role
        out: dict[str, Any] = {"role": role, "content": self.content or ""}
        for name in ("tool_calls", "tool_call_id", "name", "reasoning_content"):
            value = getattr(self, name, None)
            if value:
                out[name] = (
                    [c.model_dump(exclude={"index"}) for c in value] if name == "tool_calls" else value
                )
        return out


class SystemMessage(Message):
    what = "a system message"
    role: Literal["system", "developer"]


class UserMessage(Message):
    what = "a user message"
    role: Literal["user"]


class ToolMessage(Message):
    what = "a tool message"
    role: Literal["tool"]
    tool_call_id: Any = None

    @field_validator("tool_call_id", mode="after")
    @classmethod
    def call_id(cls, value: Any) -> str:
        if not isinstance(value, str) or not value:
            raise fail("{where} is required: a tool message needs a tool_call_id string.")
        return value

    model_config = ConfigDict(validate_default=True)


# The assistant's last four fields are what openai's ``ChatCompletionMessage.model_dump()`` adds:
# ``annotations`` is dropped, the other three must be empty.
UNSUPPORTED_OUTPUT = {
    "refusal": "refusal messages are not supported",
    "audio": "audio output is not supported",
    "function_call": "the legacy function_call field is not supported; use tool_calls",
}


class AssistantMessage(Message):
    what = "an assistant message"
    role: Literal["assistant"]
    tool_calls: list[ToolCall] | None = None
    reasoning_content: str | None = None
    refusal: Any = None
    annotations: Any = None
    audio: Any = None
    function_call: Any = None

    @model_validator(mode="after")
    def no_unsupported_output(self) -> AssistantMessage:
        for name, reason in UNSUPPORTED_OUTPUT.items():
            if getattr(self, name) is not None:
                raise fail(f"{{where}}.{name}: {reason}.", at=f".{name}")
        return self


def role_of(message: Any) -> str:
    role = message.get("role") if isinstance(message, dict) else None
    return "system" if role == "developer" else str(role)


AnyMessage = Annotated[
    Annotated[SystemMessage, Tag("system")]
    | Annotated[UserMessage, Tag("user")]
    | Annotated[AssistantMessage, Tag("assistant")]
    | Annotated[ToolMessage, Tag("tool")],
    Discriminator(role_of),
]


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")  # OpenAI adds options; none changes a turn
    include_usage: bool | None = None


class ChatBody(Schema):
    """The body of POST /v1/chat/completions. Parameters a sampled RL policy cannot honour are
    refused, never silently ignored; ``user``, ``metadata``, ``store``, ``parallel_tool_calls`` and
    ``service_tier`` are bookkeeping and accepted. ``reasoning_effort`` is checked against OpenAI's
    values here and against the model by the backend. The first failing field is the one reported,
    in the order declared here."""

    model_config = ConfigDict(validate_default=True)
    n: Annotated[int, only((1,), "must be 1 (one choice per request); send n separate requests.")] | None = (
        None
    )
    response_format: Annotated[
        Any, only(({"type": "text"},), 'is not supported; only {"type": "text"} is accepted.')
    ] = None
    logit_bias: Annotated[Any, only(({},), "is not supported.")] = None
    functions: Annotated[Any, only((), "is the legacy parameter, not supported; use tools.")] = None
    function_call: Annotated[Any, only((), "is the legacy parameter, not supported; use tool_choice.")] = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    model: Any = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, between(0, MAX_TOP_LOGPROBS)] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    messages: list[AnyMessage] | None = None  # None (absent) is refused by message_list
    tools: list[Tool] | None = None
    tool_choice: Any = None
    max_tokens: Annotated[int, at_least(1)] | None = None
    max_completion_tokens: Annotated[int, at_least(1)] | None = None
    stop: Any = None
    temperature: Annotated[float, between(0.0, 2.0)] | None = None
    top_p: Annotated[float, between(0.0, 1.0)] | None = None
    seed: int | None = None
    reasoning_effort: ReasoningEffort | None = None
    user: Any = None
    metadata: Any = None
    store: Any = None
    parallel_tool_calls: Any = None
    service_tier: Any = None

    @classmethod
    def unknown_message(cls, unknown: list[str]) -> str:
        plural = "s" if len(unknown) > 1 else ""
        return f"Unrecognized request argument{plural} supplied: {', '.join(unknown)}"

    @field_validator("model")
    @classmethod
    def model_name(cls, model: Any) -> str:
        if not isinstance(model, str) or not model:
            raise fail(f"You must provide a model parameter (a non-empty string), got {kind(model)}.")
        return model

    @field_validator("messages", mode="before")
    @classmethod
    def message_list(cls, messages: Any) -> Any:
        if not isinstance(messages, list) or not messages:
            raise fail(f"{{where}} must be a non-empty array of messages, got {kind(messages)}.")
        for i, message in enumerate(messages):
            if not isinstance(message, dict):
                raise fail(f"{{where}}[{i}] must be an object, got {kind(message)}.", at=f"[{i}]")
            if message.get("role") not in ROLES:
                role = message.get("role")
                raise fail(
                    f"Invalid role {role!r} in {{where}}[{i}]; allowed: {', '.join(ROLES)}.", at=f"[{i}].role"
                )
        if messages[-1]["role"] == "assistant":
            raise fail(
                "The last message is an assistant message; continuing an assistant turn is not supported. "
                "End with a user or tool message.",
                at=f"[{len(messages) - 1}].role",
            )
        return messages

    @field_validator("tools", mode="after")
    @classmethod
    def unique_names(cls, tools: list[Tool] | None) -> list[Tool] | None:
        seen = set()
        for i, tool in enumerate(tools or []):
            if tool.function.name in seen:
                raise fail(f"Duplicate tool name {tool.function.name!r}.", at=f"[{i}].function.name")
            seen.add(tool.function.name)
        return tools

    @field_validator("tool_choice")
    @classmethod
    def auto_or_none(cls, value: Any) -> str | None:
        if value is None or value in ("auto", "none"):
            return value
        if value == "required" or isinstance(value, dict):
            raise fail(
                f"tool_choice {json.dumps(value)} is not supported: the policy is sampled freely, "
                'so only "auto" and "none" are accepted.'
            )
        raise fail(f'tool_choice must be "auto" or "none", got {json.dumps(value)}.')

    @field_validator("stop")
    @classmethod
    def stop_sequences(cls, value: Any) -> list[str]:
        if value is None:
            return []
        stops = [value] if isinstance(value, str) else value
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise fail("stop must be a non-empty string or an array of non-empty strings.")
        if len(stops) > MAX_STOP:
            raise fail(f"stop takes at most {MAX_STOP} sequences, got {len(stops)}.")
        return list(stops)

    @model_validator(mode="after")
    def consistent(self) -> ChatBody:
        if self.top_logprobs and not self.logprobs:
            raise fail("top_logprobs needs logprobs set to true.", at=".top_logprobs")
        legacy, current = self.max_tokens, self.max_completion_tokens
        if legacy is not None and current is not None and legacy != current:
            raise fail(
                f"max_tokens ({legacy}) and max_completion_tokens ({current}) disagree; send only one.",
                at=".max_tokens",
            )
        return self
