"""The OpenAI Chat Completions protocol of ``agentrl serve``: response shapes and HTTP.

A ``ChatBackend`` owns episodes and generation. This module only speaks the protocol: it turns an
HTTP request into a validated ``ChatRequest`` (``parse_chat_request``, in ``openai_request``), calls
``backend.chat``, and writes the ``ChatResult`` back as a ``chat.completion`` object, or writes an
OpenAI-style error (``{"error": {"message", "type", "param", "code"}}``). Malformed requests get a
4xx naming the offending ``param``; anything the backend raises other than ``APIError`` becomes a
500 ``server_error``; the server itself keeps running either way.

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
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

from agentrl.serve.openai_errors import APIError, bad, kind
from agentrl.serve.openai_request import ChatBackend, ChatRequest, ChatResult, episode_key, parse_chat_request
from agentrl.timeouts import start_thread

logger = logging.getLogger(__name__)

FINISH_REASONS = ("stop", "length", "tool_calls")
MIN_LOGPROB = -9999.0  # what OpenAI reports for a token of probability ~0; JSON has no -Infinity
SERVED = "this server serves only chat completions (POST /v1/chat/completions)"

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
        self.thread = start_thread(
            self.core.serve_forever, f"agentrl-serve:{self.core.server_port}", args=(self.POLL_S,)
        )
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
