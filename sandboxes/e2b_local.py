"""A local server speaking the E2B code-interpreter protocol, backed by one of our sandboxes.

With ``debug=True`` (or ``E2B_DEBUG=true``) the E2B SDK makes no cloud call and sends code to the
sandbox's code-execution endpoint; pointing ``sandbox_url`` at this server lets the real SDK code
path run offline (tests, or E2B-shaped code on a laptop). Endpoints, as the SDK uses them:

    POST /execute {"code", "context_id", "language", "env_vars"} -> NDJSON events
         {"type": "stdout"|"stderr", "text", "timestamp"}, {"type": "result", "text", "is_main_result"},
         {"type": "error", "name", "value", "traceback"}, {"type": "number_of_executions", ...}
    POST /contexts {"language", "cwd"} -> {"id", "language", "cwd"};  GET /contexts
    DELETE /contexts/{id};  POST /contexts/{id}/restart;  GET /health

Each context is one session of the backing sandbox. Binds 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sandboxes.base import Sandbox, Session


class LocalCodeInterpreterServer:
    """``with LocalCodeInterpreterServer(sandbox) as srv: Sandbox.create(debug=True, sandbox_url=srv.url)``."""

    def __init__(self, sandbox: Sandbox, port: int = 0) -> None:
        self.sandbox = sandbox
        self.contexts: dict[str, tuple[dict[str, str], Session]] = {}
        self.counts: dict[str, int] = {}
        self.lock = threading.Lock()
        server = self

        class Handler(_Handler):
            srv = server

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, name="agentrl-e2b-local", daemon=True
        )
        self._thread.start()

    def context(self, context_id: str | None) -> tuple[str, Session] | None:
        cid = context_id or "default"
        with self.lock:
            if cid not in self.contexts:
                if context_id is not None:
                    return None
                self.contexts[cid] = (
                    {"id": cid, "language": "python", "cwd": "/scratch"},
                    self.sandbox.session(),
                )
            return cid, self.contexts[cid][1]

    def create_context(self) -> dict[str, str]:
        cid = uuid.uuid4().hex
        meta = {"id": cid, "language": "python", "cwd": "/scratch"}
        session = self.sandbox.session()
        with self.lock:
            self.contexts[cid] = (meta, session)
        return meta

    def remove_context(self, cid: str) -> bool:
        with self.lock:
            item = self.contexts.pop(cid, None)
        if item is None:
            return False
        item[1].close()
        return True

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        with self.lock:
            items, self.contexts = list(self.contexts.values()), {}
        for _, s in items:
            with contextlib.suppress(Exception):
                s.close()

    def __enter__(self) -> LocalCodeInterpreterServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Handler(BaseHTTPRequestHandler):
    srv: LocalCodeInterpreterServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _body(self) -> dict[str, Any]:
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        return json.loads(raw) if raw else {}

    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(200, b'"ok"')
        elif self.path == "/contexts":
            with self.srv.lock:
                metas = [m for m, _ in self.srv.contexts.values()]
            self._send(200, json.dumps(metas).encode())
        else:
            self._send(404, b"not found", "text/plain")

    def do_POST(self) -> None:
        body = self._body()
        if self.path == "/execute":
            self._execute(body)
        elif self.path == "/contexts":
            self._send(200, json.dumps(self.srv.create_context()).encode())
        elif self.path.startswith("/contexts/") and self.path.endswith("/restart"):
            found = self.srv.context(self.path.split("/")[2])
            if found is None:
                self._send(404, b"context not found", "text/plain")
                return
            found[1].reset()
            with self.srv.lock:
                self.srv.counts[found[0]] = 0
            self._send(200, b"{}")
        else:
            self._send(404, b"not found", "text/plain")

    def do_DELETE(self) -> None:
        if self.path.startswith("/contexts/") and self.srv.remove_context(self.path.split("/")[2]):
            self._send(200, b"{}")
        else:
            self._send(404, b"context not found", "text/plain")

    def _execute(self, body: dict[str, Any]) -> None:
        found = self.srv.context(body.get("context_id"))
        if found is None:
            self._send(404, b"context not found", "text/plain")
            return
        cid, session = found
        if (body.get("language") or "python") != "python":
            self._send(400, b"only python is supported by the local server", "text/plain")
            return
        r = session.run(str(body.get("code", "")))
        with self.srv.lock:
            # as a Jupyter kernel: a cell that killed the interpreter gets no execution count, and the
            # restarted interpreter counts from 1 again
            self.srv.counts[cid] = 0 if r.restarted else self.srv.counts.get(cid, 0) + 1
            count = self.srv.counts[cid]
        ts = time.time_ns()
        events: list[dict[str, Any]] = (
            [] if r.restarted else [{"type": "number_of_executions", "execution_count": count}]
        )
        if r.stdout:
            events.append({"type": "stdout", "text": r.stdout, "timestamp": ts})
        if r.stderr:
            events.append({"type": "stderr", "text": r.stderr, "timestamp": ts})
        if r.value is not None:
            events.append({"type": "result", "text": r.value, "is_main_result": True})
        if r.error is not None:
            events.append(
                {
                    "type": "error",
                    "name": r.error.name,
                    "value": r.error.value,
                    "traceback": r.error.traceback,
                }
            )
        self._send(200, b"".join(json.dumps(e).encode() + b"\n" for e in events), "application/x-ndjson")
