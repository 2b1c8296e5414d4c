"""E2B backend (``e2b-code-interpreter`` SDK): each session is a code context in an E2B sandbox.

By default every session gets its own cloud sandbox (killed on close); with ``share_sandbox=True``
sessions are separate contexts in one sandbox (cheaper, weaker isolation between episodes). Memory
and process limits are the template's (E2B has no per-run knobs); wall time is the SDK's ``timeout``,
and output is capped here. After a timeout, whether the SDK gave up waiting or the server reported a
``TimeoutError``, the context is restarted and ``ExecResult.restarted`` is set (variables are lost):
the kernel may still be running the cell, or may have lost its state, and the protocol cannot say.

A kernel that dies inside a cell (``os._exit``, the memory limit's OOM kill) is restarted by the
server with empty state, and the protocol reports only an error. So each context holds a sentinel
variable with a per-session token, planted when the context is made: after any cell that ends in an
error, or whose execution count is not the next one (a restarted kernel counts from 1 again), the
session checks the sentinel; when it is gone, the cell's result says ``restarted`` and the sentinel
is planted again. ``restarted`` is then true exactly when the variables are gone, as on bwrap.

Offline: ``debug=True`` plus ``sandbox_url`` pointing at ``sandboxes.e2b_local.LocalCodeInterpreterServer``
runs the real SDK against our own sandbox. The cloud needs ``E2B_API_KEY``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
from typing import Any

from sandboxes.base import (
    ExecError,
    ExecResult,
    IsolationUnavailable,
    Limits,
    SandboxBase,
    SandboxError,
    SessionBase,
    cap_text,
    owner_tag,
)

log = logging.getLogger(__name__)

SENTINEL = "__agentrl_session__"
"""The variable each context holds so a session can tell a restarted (empty) kernel from a live one."""


class E2BSession(SessionBase):
    def __init__(self, sb: E2BSandbox, limits: Limits) -> None:
        super().__init__(limits)
        self._sb = sb
        self._owned = not sb.share_sandbox
        self._token = uuid.uuid4().hex
        self._count: int | None = None  # the kernel's execution count after our last cell
        try:
            self.sbx = sb._new_cloud_sandbox() if self._owned else sb._shared()
            self.ctx = self.sbx.create_code_context()
            self._plant_sentinel()
        except Exception as e:
            self.close()
            raise SandboxError(f"could not create an E2B sandbox/context: {type(e).__name__}: {e}") from e

    def _exec(self, code: str, timeout: float | None = None) -> Any:
        ex = self.sbx.run_code(
            code, context=self.ctx, timeout=timeout, request_timeout=self._sb.request_timeout_s
        )
        self._count = ex.execution_count
        return ex

    def _plant_sentinel(self) -> None:
        self._exec(f"{SENTINEL} = {self._token!r}")

    def _state_survived(self) -> bool:
        """Whether the context still holds this session's sentinel (its variables survived)."""
        try:
            ex = self._exec(f"globals().get({SENTINEL!r})")
        except Exception:
            return False
        return ex.error is None and ex.text == repr(self._token)

    def _run(self, code: str, limits: Limits) -> ExecResult:
        from e2b import TimeoutException

        t0 = time.monotonic()
        expected = None if self._count is None else self._count + 1
        try:
            ex = self._exec(code, timeout=limits.wall_s + self._sb.timeout_margin_s)
        except TimeoutException:  # the SDK gave up waiting: the kernel may still be running the cell
            self._restart()
            err = ExecError("TimeoutError", f"the cell ran longer than {limits.wall_s:g}s")
            return ExecResult(
                error=err, exit_code=None, timed_out=True, restarted=True, duration_s=limits.wall_s
            )
        except Exception as e:
            raise SandboxError(f"E2B run_code failed: {type(e).__name__}: {e}") from e
        res = to_result(ex, limits)
        res.duration_s = time.monotonic() - t0
        if res.timed_out:
            # The server timed the cell out itself. The protocol does not say whether the kernel's
            # state survived (an interrupt may or may not have landed), so the context is restarted
            # and the result says so: ``restarted`` is then always true after a timeout, never a guess.
            self._restart()
            res.restarted = True
        elif (res.error is not None or ex.execution_count != expected) and not self._state_survived():
            # the kernel died in (or before) this cell and came back empty: say so, and re-arm
            res.restarted = True
            self._restart()
        return res

    def _restart(self) -> None:
        """A fresh context state with the sentinel planted (best effort: a failure here shows up as a
        ``SandboxError`` on the next cell)."""
        with contextlib.suppress(Exception):
            self.sbx.restart_code_context(self.ctx)
            self._plant_sentinel()

    def reset(self) -> None:
        with self._lock:
            try:
                self.sbx.restart_code_context(self.ctx)
                self._plant_sentinel()
            except Exception as e:
                raise SandboxError(f"E2B could not restart the context: {e}") from e

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        sbx, ctx = getattr(self, "sbx", None), getattr(self, "ctx", None)
        if sbx is not None and ctx is not None:
            with contextlib.suppress(Exception):
                sbx.remove_code_context(ctx)
        if sbx is not None and self._owned:
            with contextlib.suppress(Exception):
                sbx.kill()


def to_result(ex: Any, limits: Limits) -> ExecResult:
    """Map an SDK ``Execution`` to ``ExecResult`` (output capped at ``limits.output_bytes``)."""
    stdout, cut1 = cap_text("".join(ex.logs.stdout), limits.output_bytes)
    stderr, cut2 = cap_text("".join(ex.logs.stderr), limits.output_bytes)
    value, cut3 = (None, False)
    if ex.text is not None:
        value, cut3 = cap_text(ex.text, limits.output_bytes)
    # E2B reports no truncation: output that fills the cap is taken as cut (our local server caps there)
    full = any(len(t.encode()) >= limits.output_bytes for t in (stdout, stderr))
    res = ExecResult(stdout=stdout, stderr=stderr, value=value, truncated=cut1 or cut2 or cut3 or full)
    if ex.error is not None:
        res.error = ExecError(ex.error.name, ex.error.value, ex.error.traceback)
        res.exit_code = 1
        res.timed_out = ex.error.name == "TimeoutError"
    return res


class E2BSandbox(SandboxBase):
    """Options: ``template``, ``api_key`` (else ``E2B_API_KEY``), ``domain``, ``debug`` (no cloud; talk
    to ``sandbox_url``), ``sandbox_url``, ``share_sandbox``, ``sandbox_timeout_s`` (lifetime of a cloud
    sandbox), ``request_timeout_s``, ``timeout_margin_s`` (added to ``wall_s`` for the SDK timeout so a
    server-side timeout answers first)."""

    name = "e2b"

    def __init__(
        self,
        limits: Limits | None = None,
        *,
        template: str | None = None,
        api_key: str | None = None,
        domain: str | None = None,
        debug: bool | None = None,
        sandbox_url: str | None = None,
        share_sandbox: bool = False,
        sandbox_timeout_s: int = 600,
        request_timeout_s: float = 30.0,
        timeout_margin_s: float = 3.0,
    ) -> None:
        try:
            import e2b_code_interpreter  # noqa: F401
        except ImportError as e:
            raise IsolationUnavailable("the e2b-code-interpreter package is not installed") from e
        debug = debug if debug is not None else os.environ.get("E2B_DEBUG", "").lower() == "true"
        if not debug and not (api_key or os.environ.get("E2B_API_KEY")):
            raise IsolationUnavailable("E2B needs an API key (E2B_API_KEY) or debug=True with a local server")
        super().__init__(limits)
        self.opts: dict[str, Any] = {"debug": debug}
        for k, v in (("api_key", api_key), ("domain", domain), ("sandbox_url", sandbox_url)):
            if v is not None:
                self.opts[k] = v
        self.template = template
        self.share_sandbox = share_sandbox
        self.sandbox_timeout_s = sandbox_timeout_s
        self.request_timeout_s = request_timeout_s
        self.timeout_margin_s = timeout_margin_s
        self._shared_sbx: Any = None
        self._shared_lock = threading.Lock()

    def _new_cloud_sandbox(self) -> Any:
        from e2b_code_interpreter import Sandbox

        kw: dict[str, Any] = {"timeout": self.sandbox_timeout_s, "metadata": {"agentrl_owner": owner_tag()}}
        if self.template:
            kw["template"] = self.template
        return Sandbox.create(**kw, **self.opts)

    def _shared(self) -> Any:
        with self._shared_lock:
            if self._shared_sbx is None:
                self._shared_sbx = self._new_cloud_sandbox()
            return self._shared_sbx

    def _new_session(self, limits: Limits) -> SessionBase:
        return E2BSession(self, limits)

    def close(self) -> None:
        super().close()
        with self._shared_lock:
            sbx, self._shared_sbx = self._shared_sbx, None
        if sbx is not None:
            with contextlib.suppress(Exception):
                sbx.kill()
