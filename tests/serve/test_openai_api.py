"""The OpenAI protocol layer of ``agentrl serve``, driven by the real ``openai`` client and raw HTTP.

A fake backend records the ChatRequests it gets and answers with a canned tool call; what these tests
pin is the wire format (client objects parse), validation (status, param, type, message), and that
the server survives every bad request, disconnect and backend crash. The server tests run against
the package's server and against the starlette/uvicorn candidate it was measured against.
"""

from __future__ import annotations

import asyncio
import functools
import http.client
import importlib.util
import json
import logging
import socket
import struct
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from agentrl.serve.openai_api import OpenAIServer
from agentrl.serve.openai_errors import APIError
from agentrl.serve.openai_request import ChatRequest, ChatResult, parse_chat_request

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CALL = {
    "id": "call_0",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
USER = {"role": "user", "content": "weather in Paris?"}


class FakeBackend:
    """Echoes the episode key as content and calls get_weather; the model name picks a misbehaviour."""

    model_name = "policy-under-training"

    def __init__(self) -> None:
        self.requests: list[ChatRequest] = []
        self.barrier = threading.Barrier(8, timeout=10)
        self.finished: list[tuple[str, dict]] = []

    def chat(self, request: ChatRequest) -> ChatResult:
        self.requests.append(request)
        if request.model == "raise-api-error":
            raise APIError(429, "episode busy", type="rate_limit_error", code="busy")
        if request.model == "raise-runtime-error":
            raise RuntimeError("engine fell over")
        if request.model == "barrier":  # returns only once 8 requests are in chat() at the same time
            self.barrier.wait()
        if request.model == "slow":
            time.sleep(0.3)
        return ChatResult(
            content=None if request.model == "tools-only" else f"ké{request.key}",
            tool_calls=[CALL],
            finish_reason="tool_calls",
            completion_tokens=["ké", request.key, "<call>"],
            logprobs=[-0.25, -1.5, float("-inf")],
            prompt_tokens=7,
            extra={"episode": request.key, "weight_version": 3},
        )

    def episode(self, key: str) -> dict:
        return {"key": key, "turns": len([r for r in self.requests if r.key == key])}

    def finish(self, key: str, body: dict) -> dict:
        self.finished.append((key, body))
        return {"key": key, "finished": True}


@pytest.fixture(scope="module")
def backend() -> FakeBackend:
    return FakeBackend()


@functools.cache
def bench_module(name: str):
    path = Path(__file__).resolve().parents[2] / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def asgi_server(*args, **kwargs):
    """bench/asgi_server.py's starlette/uvicorn server, the candidate the endpoint's stdlib server was
    measured against (docs/performance.md): it must speak the same protocol for that to mean anything."""
    return bench_module("asgi_server").ASGIServer(*args, **kwargs)


@pytest.fixture(scope="module", params=[OpenAIServer, asgi_server], ids=["stdlib", "asgi"])
def server(backend, request):
    with request.param(backend, max_body_bytes=64 * 1024).start() as server:
        yield server


def client(server, key="ep-1", **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key=key, max_retries=0, timeout=10, **kw)


def test_completion_with_tool_calls_parses_into_client_objects(server, backend):
    response = client(server).chat.completions.create(
        model="any-name",
        messages=[{"role": "developer", "content": "be brief"}, USER],
        tools=TOOLS,
        max_completion_tokens=64,
        stop="\n\n",
        temperature=1.0,
        logprobs=True,
        user="ignored",
    )
    choice = response.choices[0]
    assert response.id.startswith("chatcmpl-") and response.model == "any-name"
    assert choice.message.content == "kéep-1" and choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls[0].function.name == "get_weather"
    assert choice.message.tool_calls[0].function.arguments == '{"city": "Paris"}'
    # 3 sampled tokens + 7 prompt tokens = 10
    assert (response.usage.prompt_tokens, response.usage.completion_tokens, response.usage.total_tokens) == (
        7,
        3,
        10,
    )
    first, _, last = choice.logprobs.content
    assert (first.token, first.logprob, first.bytes) == (
        "ké",
        -0.25,
        [107, 0xC3, 0xA9],
    )  # é is C3 A9 in UTF-8
    assert last.logprob == -9999.0  # -inf has no JSON spelling
    assert response.model_extra["agentrl"] == {"episode": "ep-1", "weight_version": 3}

    got = backend.requests[-1]
    assert got.key == "ep-1" and got.model == "any-name"
    assert got.messages == [{"role": "system", "content": "be brief"}, USER]
    assert got.tools == TOOLS and got.tool_choice is None
    assert (got.max_tokens, got.stop, got.temperature, got.top_p, got.logprobs, got.stream) == (
        64,
        ["\n\n"],
        1.0,
        None,
        True,
        False,
    )


def test_logprobs_absent_unless_asked(server):
    response = client(server).chat.completions.create(model="m", messages=[USER])
    assert response.choices[0].logprobs is None


def collect_stream(chunks) -> tuple[str, list, str, object, dict]:
    content, calls, finish, usage, extra = "", [], None, None, {}
    for chunk in chunks:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            content += choice.delta.content or ""
            calls += choice.delta.tool_calls or []
            finish = choice.finish_reason or finish
        extra = (chunk.model_extra or {}).get("agentrl", extra)
    return content, calls, finish, usage, extra


def test_streaming_yields_the_same_turn(server, backend):
    stream = client(server).chat.completions.create(
        model="m", messages=[USER], tools=TOOLS, stream=True, stream_options={"include_usage": True}
    )
    content, calls, finish, usage, extra = collect_stream(stream)
    assert content == "kéep-1" and finish == "tool_calls" and extra["episode"] == "ep-1"
    assert [(c.index, c.id, c.function.name, c.function.arguments) for c in calls] == [
        (0, "call_0", "get_weather", '{"city": "Paris"}')
    ]
    assert usage.completion_tokens == 3 and usage.total_tokens == 10
    assert backend.requests[-1].stream and backend.requests[-1].include_usage


def test_async_client_plain_and_streaming(server):
    async def run():
        async with openai.AsyncOpenAI(base_url=server.url, api_key="ep-async", max_retries=0) as aclient:
            plain = await aclient.chat.completions.create(model="m", messages=[USER])
            stream = await aclient.chat.completions.create(model="m", messages=[USER], stream=True)
            streamed = [chunk async for chunk in stream]
        return plain, streamed

    plain, streamed = asyncio.run(run())
    assert plain.choices[0].message.content == "kéep-async"
    content, calls, finish, usage, _ = collect_stream(streamed)
    assert (content, calls[0].function.name, finish, usage) == (
        "kéep-async",
        "get_weather",
        "tool_calls",
        None,
    )


def test_key_from_header_wins_over_api_key(server, backend):
    c = client(server, key="unused", default_headers={"X-Episode-Key": "ep-header"})
    assert c.chat.completions.create(model="m", messages=[USER]).choices[0].message.content == "kéep-header"
    assert backend.requests[-1].key == "ep-header"


def test_client_message_object_round_trips(server, backend):
    c = client(server)
    messages: list = [USER]
    reply = c.chat.completions.create(model="tools-only", messages=messages, tools=TOOLS)
    assert reply.choices[0].message.content is None
    messages += [reply.choices[0].message, {"role": "tool", "tool_call_id": "call_0", "content": "sunny"}]
    c.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    assert backend.requests[-1].messages == [
        USER,
        {"role": "assistant", "content": "", "tool_calls": [CALL]},  # refusal/annotations/audio nulls dropped
        {"role": "tool", "content": "sunny", "tool_call_id": "call_0"},
    ]


def test_models_list_and_health(server):
    assert [m.id for m in client(server).models.list()] == ["policy-under-training"]
    assert httpx.get(server.url.removesuffix("/v1") + "/health").json() == {"status": "ok"}
    assert server.url.startswith("http://127.0.0.1:")


def test_episode_routes(server, backend):
    base = server.url
    assert httpx.get(f"{base}/episodes/ep%2Fx").json() == {"key": "ep/x", "turns": 0}
    response = httpx.post(f"{base}/episodes/ep-9/finish", json={"reward": 1.0})
    assert response.status_code == 200 and backend.finished[-1] == ("ep-9", {"reward": 1.0})


def chat_body(**fields):
    return {"model": "m", "messages": [USER], **fields}


ASSISTANT_CALL = {"role": "assistant", "content": None, "tool_calls": [CALL]}
AUTH = {"Authorization": "Bearer ep-1"}
# (method, path, body: dict → JSON, bytes → as is, headers) → (status, param, type, words in the message)
BAD_REQUESTS = {
    "invalid json": ("POST", "/chat/completions", b'{"model": "m",', AUTH, 400, None, "invalid_request_error", "parse the JSON"),
    "not an object": ("POST", "/chat/completions", b"[1, 2]", AUTH, 400, None, "invalid_request_error", "JSON object, got array"),
    "missing messages": ("POST", "/chat/completions", {"model": "m"}, AUTH, 400, "messages", "invalid_request_error", "non-empty array"),
    "bad role": ("POST", "/chat/completions", chat_body(messages=[{"role": "robot", "content": "hi"}]), AUTH, 400, "messages[0].role", "invalid_request_error", "allowed: system, developer"),
    "image part": ("POST", "/chat/completions", chat_body(messages=[{"role": "user", "content": [{"type": "text", "text": "what is"}, {"type": "image_url", "image_url": {"url": "x"}}]}]), AUTH, 400, "messages[0].content[1].type", "invalid_request_error", "Only text content is supported"),
    "tool without id": ("POST", "/chat/completions", chat_body(messages=[USER, ASSISTANT_CALL, {"role": "tool", "content": "4"}]), AUTH, 400, "messages[2].tool_call_id", "invalid_request_error", "needs a tool_call_id"),
    "bad arguments": ("POST", "/chat/completions", chat_body(messages=[USER, {**ASSISTANT_CALL, "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "{city: Paris"}}]}, USER]), AUTH, 400, "messages[1].tool_calls[0].function.arguments", "invalid_request_error", "not valid JSON"),
    "n=2": ("POST", "/chat/completions", chat_body(n=2), AUTH, 400, "n", "invalid_request_error", "n must be 1"),
    "unknown field": ("POST", "/chat/completions", chat_body(frobnicate=True), AUTH, 400, "frobnicate", "invalid_request_error", "Unrecognized request argument supplied: frobnicate"),
    "ends with assistant": ("POST", "/chat/completions", chat_body(messages=[USER, {"role": "assistant", "content": "Sure"}]), AUTH, 400, "messages[1].role", "invalid_request_error", "continuing an assistant turn is not supported"),
    "missing key": ("POST", "/chat/completions", chat_body(), {}, 401, None, "invalid_request_error", "X-Episode-Key"),
    "oversize body": ("POST", "/chat/completions", chat_body(messages=[{"role": "user", "content": "x" * 100_000}]), AUTH, 413, None, "invalid_request_error", "at most 65536"),
    "unknown route": ("GET", "/nope", None, AUTH, 404, None, "invalid_request_error", "GET /v1/nope"),
    "legacy completions": ("POST", "/completions", {"prompt": "hi"}, AUTH, 404, None, "invalid_request_error", "only chat completions"),
    "GET chat": ("GET", "/chat/completions", None, AUTH, 405, None, "invalid_request_error", "use POST"),
    "backend APIError": ("POST", "/chat/completions", chat_body(model="raise-api-error"), AUTH, 429, None, "rate_limit_error", "episode busy"),
    "backend crash": ("POST", "/chat/completions", chat_body(model="raise-runtime-error"), AUTH, 500, None, "server_error", "RuntimeError: engine fell over"),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD_REQUESTS, ids=list(BAD_REQUESTS))
def test_bad_request_gets_openai_error_and_server_survives(server, case, caplog):
    method, path, body, headers, status, param, error_type, words = BAD_REQUESTS[case]
    with httpx.Client(base_url=server.url, timeout=10) as http:
        content = body if isinstance(body, bytes) else None
        response = http.request(
            method, path, content=content, json=None if content else body, headers=headers
        )
        assert response.status_code == status
        assert response.headers["content-type"] == "application/json"
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert (error["param"], error["type"]) == (param, error_type) and words in error["message"], error
        # the same client (a kept-alive connection, or a new one after a close) is still served
        ok = http.post("/chat/completions", json=chat_body(), headers=AUTH)
        assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == "kéep-1"
    if case == "backend crash":
        assert any(r.exc_info and r.exc_info[0] is RuntimeError for r in caplog.records)


@pytest.mark.parametrize(
    "fields, param, words",
    [
        ({"top_logprobs": 3}, "top_logprobs", "needs logprobs"),
        ({"temperature": 2.5}, "temperature", "between 0 and 2"),
        ({"top_p": "high"}, "top_p", "must be a number, got string"),
        ({"seed": 1.5}, "seed", "must be an integer"),
        ({"stream": "yes"}, "stream", "must be a boolean"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
        ({"max_tokens": 10, "max_completion_tokens": 20}, "max_tokens", "disagree"),
        ({"max_tokens": 0}, "max_tokens", "at least 1"),
        ({"tool_choice": "required"}, "tool_choice", "not supported"),
        ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice", "not supported"),
        ({"response_format": {"type": "json_object"}}, "response_format", "not supported"),
        ({"logit_bias": {"50256": -100}}, "logit_bias", "not supported"),
        ({"functions": [{"name": "f"}]}, "functions", "legacy"),
        ({"presence_penalty": 0.5}, "presence_penalty", "must be 0"),
        (
            {"tools": [{"type": "function", "function": {"name": "bad name"}}]},
            "tools[0].function.name",
            "must match",
        ),
        ({"tools": [{"type": "retrieval"}]}, "tools[0].type", 'must be "function", got "retrieval"'),
        ({"messages": []}, "messages", "non-empty"),
        ({"messages": [{"role": "user", "content": "hi", "mood": "good"}]}, "messages[0].mood", "mood"),
        ({"messages": [{"role": "user", "content": None}]}, "messages[0].content", "needs content"),
        (
            {"messages": [{"role": "assistant", "content": None}, USER]},
            "messages[0].content",
            "content or tool_calls",
        ),
        (
            {"messages": [{"role": "assistant", "content": "no", "refusal": "no"}, USER]},
            "messages[0].refusal",
            "refusal",
        ),
        (
            {"messages": [{"role": "tool", "tool_call_id": "c", "content": 4}]},
            "messages[0].content",
            "string or an array",
        ),
        ({"model": 3}, "model", "model parameter"),
        ({"temperature": True}, "temperature", "must be a number, got boolean"),
        ({"stream_options": {"include_usage": "yes"}}, "stream_options.include_usage", "must be a boolean"),
        ({"messages": [USER, "hi"]}, "messages[1]", "must be an object, got string"),
        ({"messages": [{"role": "user", "content": "hi", "name": 3}]}, "messages[0].name", "got integer"),
        (
            {
                "messages": [
                    {"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f", "x": 1}}]},
                    USER,
                ]
            },
            "messages[0].tool_calls[0].function.x",
            "in messages[0].tool_calls[0].function (a function call): x; allowed: arguments, name",
        ),
        (
            {
                "messages": [
                    {"role": "assistant", "tool_calls": [{"type": "function", "function": CALL["function"]}]},
                    USER,
                ]
            },
            "messages[0].tool_calls[0].id",
            "is required",
        ),
        ({"tools": [*TOOLS, *TOOLS]}, "tools[1].function.name", "Duplicate tool name"),
    ],
)
def test_validation_rules(fields, param, words):
    with pytest.raises(APIError) as caught:
        parse_chat_request(chat_body(**fields), {"authorization": "Bearer k"})
    assert (caught.value.status, caught.value.param) == (400, param) and words in caught.value.message


def test_accepted_and_normalized_fields():
    body = chat_body(
        messages=[
            {
                "role": "system",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                "name": "s",
            },
            USER,
            {
                "role": "assistant",
                "content": "ok",
                "reasoning_content": "think",
                "annotations": [],
                "tool_calls": [],
            },
            USER,
        ],
        **{"metadata": {"a": "b"}, "store": False, "parallel_tool_calls": True, "service_tier": "auto"},
        **{"n": 1, "response_format": {"type": "text"}, "frequency_penalty": 0, "tools": [], "seed": 5},
        **{
            "max_tokens": 8,
            "max_completion_tokens": 8,
            "top_logprobs": 2,
            "logprobs": True,
            "tool_choice": "none",
        },
    )
    request = parse_chat_request(body, {"X-Episode-Key": " ep-7 ", "Authorization": "Bearer other"})
    assert request.key == "ep-7" and request.raw is body and request.tools is None
    assert request.messages[0] == {"role": "system", "content": "a\nb", "name": "s"}
    assert request.messages[2] == {"role": "assistant", "content": "ok", "reasoning_content": "think"}
    assert (request.max_tokens, request.seed, request.top_logprobs, request.tool_choice) == (8, 5, 2, "none")


def test_openai_client_raises_bad_request_with_message(server):
    with pytest.raises(openai.BadRequestError) as caught:
        client(server).chat.completions.create(model="m", messages=[USER], n=2)
    assert (
        caught.value.status_code == 400
        and caught.value.param == "n"
        and "n must be 1" in caught.value.message
    )


def test_concurrent_keys_get_their_own_answers(server):
    """The fake backend's barrier releases only when 8 chat() calls run at once."""
    answers: dict[str, str] = {}

    def call(i: int) -> None:
        reply = client(server, key=f"ep-{i}").chat.completions.create(model="barrier", messages=[USER])
        answers[f"ep-{i}"] = reply.choices[0].message.content

    threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert answers == {f"ep-{i}": f"kéep-{i}" for i in range(8)}


def test_client_disconnects_do_not_kill_server(server, caplog, capsys):
    """Clients leave halfway through sending a body, while their (streamed) answer is made, and by
    resetting an idle keep-alive connection (as httpx does after a stream it did not read to the end)."""
    host, port = server.url.removeprefix("http://").removesuffix("/v1").split(":")
    body = json.dumps(chat_body(model="slow", stream=True)).encode()
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ep-1\r\nContent-Length: {len(body)}\r\n\r\n"
    for sent in (head.encode() + body[:10], head.encode() + body):
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(sent)
    with socket.create_connection((host, int(port))) as sock:  # resets its idle keep-alive connection
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.recv(1)  # leaves the rest of the answer unread
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close sends RST
    time.sleep(0.5)  # the slow backend answers into a closed socket
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("GET", "/v1/models")
    assert conn.getresponse().status == 200
    conn.close()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "Traceback" not in capsys.readouterr().err  # socketserver prints unhandled handler errors there


@pytest.mark.parametrize("Server", [OpenAIServer, asgi_server], ids=["stdlib", "asgi"])
def test_close_is_quick_and_frees_the_port(backend, Server):
    server = Server(backend).start()
    port = int(server.url.rsplit(":", 1)[1].removesuffix("/v1"))
    kept_alive = client(server)
    kept_alive.models.list()  # leaves an idle keep-alive connection and its handler thread
    started = time.monotonic()
    server.close()
    assert time.monotonic() - started < 2.0
    assert not server.thread.is_alive()
    with pytest.raises(openai.APIConnectionError):
        kept_alive.models.list()
    with Server(backend, port=port) as again:  # the port can be bound again
        assert again.url.endswith(f":{port}/v1")
