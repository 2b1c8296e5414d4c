"""The endpoint's protocol on starlette + uvicorn: the candidate that lost to the stdlib server.

Issue 32 asked whether the endpoint's HTTP layer (``agentrl.serve.openai_api``: stdlib
``ThreadingHTTPServer`` with its fixes for Nagle, the listen backlog and reverse DNS) should move to
starlette on uvicorn, which ``mcp`` already installs. This is that server, complete: the same routes,
bodies, errors and limits (tests/serve/test_openai_api.py runs its protocol tests against both), the
transport (HTTP/1.1 parsing with h11, keep-alive, backlog, Nagle, client disconnects) uvicorn's.
``backend.chat`` blocks while the engine generates, so it runs in an anyio worker thread, at most
``threads`` at once: that bound is how many turns can share an engine batch, so it is 1024, not
starlette's default of 40.

It stays here, not in the package, because the measurement went against it (docs/performance.md, "The
endpoint's HTTP server"): ``bench/proxy.py --server asgi`` and ``bench/endpoint_load.py`` rerun it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import threading
import time
import uuid
from typing import Any
from urllib.parse import unquote

import anyio
import uvicorn
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from agentrl.serve.openai_api import (
    check_result,
    completion_body,
    is_loopback,
    not_found,
    parse_json,
    stream_chunks,
)
from agentrl.serve.openai_errors import APIError, bad, kind
from agentrl.serve.openai_request import ChatBackend, episode_key, parse_chat_request

logger = logging.getLogger(__name__)


class ChatApp:
    """The ASGI application: ``await app(scope, receive, send)`` per HTTP request."""

    def __init__(self, backend: ChatBackend, max_body_bytes: int, threads: int = 1024) -> None:
        self.backend = backend
        self.max_body_bytes = max_body_bytes
        self.limiter = anyio.CapacityLimiter(threads)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":  # lifespan is off; websockets are not served
            return
        request = Request(scope, receive)
        try:
            response = await self.dispatch(request)
        except ClientDisconnect:
            logger.debug("client went away during %s %s", request.method, request.url.path)
            return
        except APIError as e:
            response = error_response(e)
        except Exception as e:
            logger.exception("%s %s failed", request.method, request.url.path)
            response = error_response(APIError(500, f"{type(e).__name__}: {e}", type="server_error"))
        await response(scope, receive, send)

    async def dispatch(self, request: Request) -> Response:
        raw = request.scope.get("raw_path") or request.scope["path"].encode()  # %2F stays inside a key
        method, path = request.method, raw.decode("latin-1").split("?", 1)[0].rstrip("/") or "/"
        body = await self.read_body(request)
        if path == "/v1/chat/completions":
            allowed("POST", method, path)
            return await self.chat(request, body)
        if path == "/v1/models":
            allowed("GET", method, path)
            model = {"id": self.backend.model_name, "object": "model", "created": 0, "owned_by": "agentrl"}
            return JSONResponse({"object": "list", "data": [model]})
        if path == "/health":
            allowed("GET", method, path)
            return JSONResponse({"status": "ok"})
        if match := re.fullmatch(r"/v1/episodes/([^/]+)(/finish)?", path):
            key = unquote(match[1])
            if match[2]:
                allowed("POST", method, path)
                payload = parse_json(body) if body.strip() else {}
                if not isinstance(payload, dict):
                    raise bad(None, f"The request body must be a JSON object, got {kind(payload)}.")
                return JSONResponse(await self.call("finish", key, payload))
            allowed("GET", method, path)
            return JSONResponse(await self.call("episode", key))
        raise not_found(method, path)

    async def chat(self, http: Request, body: bytes) -> Response:
        headers = dict(http.headers.items())
        episode_key(headers)  # a missing key is a 401 before any complaint about the body
        request = parse_chat_request(parse_json(body), headers)
        result = await anyio.to_thread.run_sync(self.backend.chat, request, limiter=self.limiter)
        check_result(request, result)
        completion_id, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        if not request.stream:
            return JSONResponse(completion_body(request, result, completion_id, created))
        events = [
            f"data: {json.dumps(c)}\n\n" for c in stream_chunks(request, result, completion_id, created)
        ]
        return Response(
            "".join([*events, "data: [DONE]\n\n"]),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )

    async def call(self, name: str, *args: Any) -> Any:
        method = getattr(self.backend, name, None)
        if method is None:
            raise APIError(404, f"This backend has no episode routes (no {name}()).", code="unknown_url")
        return await anyio.to_thread.run_sync(method, *args, limiter=self.limiter)

    async def read_body(self, request: Request) -> bytes:
        """The body, read whole even when refused (closing with unread data would reset the
        connection before the client reads the 413); past 256 MiB the connection just closes."""
        limit = self.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and not declared.isdigit():
            raise bad(None, "Invalid Content-Length header.")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size <= limit:
                chunks.append(chunk)
            elif size > 256 * 2**20:
                break
        if size > limit:
            raise APIError(
                413,
                f"The request body is {size} bytes; this server accepts at most {limit}.",
                code="request_too_large",
            )
        return b"".join(chunks)


def allowed(method: str, got: str, path: str) -> None:
    if got != method:
        raise APIError(405, f"{got} is not allowed on {path}; use {method}.", code="method_not_allowed")


def error_response(error: APIError) -> JSONResponse:
    allow = {"Allow": error.message.rsplit("use ", 1)[-1].rstrip(".")} if error.status == 405 else {}
    return JSONResponse(error.body(), status_code=error.status, headers=allow)


class ASGIServer:
    """``OpenAIServer``'s interface on uvicorn: ``ASGIServer(backend).start()``, ``url``, ``close()``."""

    JOIN_S = 2.0

    def __init__(
        self, backend: ChatBackend, host: str = "127.0.0.1", port: int = 0, max_body_bytes: int = 16 * 2**20
    ) -> None:
        if max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be positive, got {max_body_bytes}")
        self.socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind((host, port))
        config = uvicorn.Config(
            ChatApp(backend, max_body_bytes),
            lifespan="off",
            log_config=None,  # leave the application's logging alone
            access_log=False,
            backlog=1024,  # every agent of a batch may connect at once
            timeout_keep_alive=300,  # an agent's next turn may come after a long tool call
            timeout_graceful_shutdown=1,
        )
        self.server = uvicorn.Server(config)
        self.thread: threading.Thread | None = None
        self.closed = False
        if not is_loopback(host):
            logger.warning("serving on %s: anyone who can reach %s can drive the policy", host, self.url)

    @property
    def url(self) -> str:
        host, port = self.socket.getsockname()[:2]
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/v1"

    def start(self) -> ASGIServer:
        if self.thread is not None or self.closed:
            raise RuntimeError("this server was already started")
        self.thread = threading.Thread(target=self.run, daemon=True, name=f"agentrl-serve:{self.url}")
        self.thread.start()
        while not self.server.started and self.thread.is_alive():
            time.sleep(0.005)
        if not self.server.started:
            raise RuntimeError(f"the server on {self.url} did not start")
        return self

    def run(self) -> None:
        asyncio.run(self.server.serve(sockets=[self.socket]))

    def close(self) -> None:
        """Stop accepting, end idle connections, give running turns a second, join the thread."""
        if self.closed:
            return
        self.closed = True
        self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(self.JOIN_S)
        self.socket.close()

    def __enter__(self) -> ASGIServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
