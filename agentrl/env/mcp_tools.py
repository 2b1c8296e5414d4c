"""MCP tool servers for environments (``Environment.mcp_servers``; docs/environments.md).

A server's tool schemas join the ``@tool`` ones in the prompt; a call goes to the server with its
``timeout_s``. A tool error, a timeout or an error the server answers with is ``Error: ...`` feedback;
a server that dies or drops its connection fails the episode at the ``tool`` boundary
(``MCPServerError``) and the next call restarts it. One pool per (environment class, server launch
settings) per process starts the server lazily and shares it between episodes; its daemon thread runs
the asyncio loop that owns the (async) ``mcp`` client, for the runner's threads. ``close_all()``
(also at exit) stops every server, process group included, and any process still carrying the
pool's tag in its environment.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import ipaddress
import json
import os
import signal
import threading
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from agentrl.errors import ToolError
from agentrl.timeouts import start_thread

TAG_VAR = "AGENTRL_MCP_TAG"
"""Set in a stdio server's environment: its children inherit it, so ``close_all`` finds them all."""
_STOP_WAIT_S = 10.0  # the mcp package's own shutdown takes at most ~5 s (stdin EOF, SIGTERM, SIGKILL)
_CALL_GRACE_S = 5.0  # past the call's timeout, for the client's own timeout and its cancel to land
_LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
CLIENT_NEEDS = {"mcp": "2.3", "mcp-types": "2.3"}
"""The client packages agentrl's MCP code is written against (``Client``, ``mcp_types``), and their
lowest versions; pyproject.toml requires the same."""
RECIPE = (
    "an MCP server from PyPI belongs in its own environment, pointed at by command=: "
    "python -m venv .venv-srv && .venv-srv/bin/pip install SERVER, then command=['.venv-srv/bin/SERVER'] "
    "(or command=['uvx', 'SERVER']); docs/environments.md, 'An MCP server from PyPI'"
)


def client_problem() -> str | None:
    """Why this environment's ``mcp`` client cannot serve agentrl's MCP tools (missing, or older than
    ``CLIENT_NEEDS``: ``pip install`` of a server built on mcp 1.x downgrades it), or None."""
    import importlib.metadata
    import re

    def release(version: str) -> tuple[int, ...]:  # "2.3.0rc1" -> (2, 3, 0): enough for a lower bound
        return tuple(int(x) for x in re.findall(r"\d+", version.split("+")[0])[:3])

    for package, lowest in CLIENT_NEEDS.items():
        try:
            found = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return f"MCP tools need the `{package}` package (>={lowest}), which is not installed: pip install '{package}>={lowest}'"
        if release(found) < release(lowest):
            return (
                f"MCP tools need {package}>={lowest}, and {package} {found} is installed here (installing an MCP "
                f"server into this environment, e.g. pip install mcp-server-calculator, downgrades it): run pip "
                f"install '{package}>={lowest}'; {RECIPE}"
            )
    return None


class MCPServerError(ToolError):
    """An MCP server could not start, or died or dropped its connection during a call. Recorded at
    the ``tool`` boundary; the next call restarts the server."""


@dataclass(frozen=True)
class MCPServer:
    """One MCP server an environment uses: exactly one of ``command`` (stdio) or ``url`` (HTTP)."""

    name: str
    """A short name for messages and logs (tool names come from the server)."""
    command: Sequence[str] | None = None
    """argv of a stdio server, e.g. ``[sys.executable, "server.py"]``; started once per pool."""
    url: str | None = None
    """A streamable-HTTP endpoint on this machine (``http://127.0.0.1:PORT/mcp``, ``localhost``,
    ``[::1]``): training machines have no outbound network. You start and stop that server."""
    env: Mapping[str, str] | None = None
    """Variables for a stdio server, over the ``mcp`` package's safe default (HOME, PATH, ...)."""
    cwd: str | None = None
    """Working directory of a stdio server (default: this process's)."""
    timeout_s: float = 10.0
    """Per call; past it the model reads ``Error: tool 'x' timed out after Ns``."""
    startup_timeout_s: float = 20.0
    """For the process to start, answer the handshake and list its tools."""

    def __post_init__(self) -> None:
        if (self.command is None) == (self.url is None):
            raise ValueError(f"MCP server {self.name!r}: give exactly one of command=[argv...] or url=...")
        if self.command is not None:
            if isinstance(self.command, str) or not self.command:
                raise ValueError(
                    f"MCP server {self.name!r}: command must be a non-empty argv list, e.g. "
                    f"[sys.executable, 'server.py'], not {self.command!r}"
                )
            object.__setattr__(self, "command", tuple(str(a) for a in self.command))
        if self.url is not None:
            check_local_url(self.url, self.name)
        if self.cwd is not None:
            object.__setattr__(self, "cwd", os.fspath(self.cwd))
        if not (self.timeout_s > 0 and self.startup_timeout_s > 0):
            raise ValueError(f"MCP server {self.name!r}: timeouts must be positive")

    def launch_key(self) -> str:
        """What identifies the server process (not the per-call timeout)."""
        env = dict(self.env) if self.env is not None else None
        parts = [self.name, self.command, self.url, env, self.cwd, self.startup_timeout_s]
        return json.dumps(parts, sort_keys=True, default=list)

    def where(self) -> str:
        return " ".join(self.command) if self.command is not None else str(self.url)


def check_local_url(url: str, name: str = "?") -> None:
    """``ValueError`` unless ``url`` is an http(s) URL on this machine."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    try:
        local = host in _LOCAL_HOSTS or ipaddress.ip_address(host).is_loopback
    except ValueError:
        local = False
    if parts.scheme not in ("http", "https") or not local:
        raise ValueError(
            f"MCP server {name!r}: url {url!r} is not a local http(s) URL. Only servers on this machine "
            "are allowed (http://127.0.0.1:PORT/..., http://localhost:PORT/..., http://[::1]:PORT/...): "
            "training machines have no outbound network. Run the server locally, or give command=[...] "
            "to start it over stdio."
        )


@dataclass
class _Connection:
    """One live server session, owned by a task on the pool's loop."""

    stop: asyncio.Event = field(default_factory=asyncio.Event)
    client: Any = None
    """The ``mcp.Client``, once it has listed the tools."""
    task: concurrent.futures.Future | None = None
    owner: asyncio.Task | None = None
    """The task that entered the client (only it may leave it)."""
    pid: int | None = None
    lost: bool = False
    halted: bool = False

    def healthy(self) -> bool:
        """Serving, and (stdio) its process still runs: a server killed while idle is noticed here,
        so the next call restarts it instead of failing."""
        serving = not self.lost and self.task is not None and not self.task.done()
        return serving and (self.pid is None or _alive(self.pid))


class MCPPool:
    """One server shared by every episode of one environment class in this process."""

    def __init__(self, spec: MCPServer) -> None:
        self.spec = spec
        self.tag = uuid.uuid4().hex
        self.pids: list[int] = []
        """Every stdio server process this pool started (restarts included)."""
        self.owner_pid = os.getpid()
        self.closed = False
        self._tools: list[dict[str, Any]] | None = None
        self._conn: _Connection | None = None
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = start_thread(self._loop.run_forever, f"agentrl-mcp-{spec.name}")

    # -- the sync face (runner threads) -----------------------------------------------------------
    def schemas(self) -> list[dict[str, Any]]:
        """The server's tools as OpenAI-style function schemas (listed once, at the first start)."""
        if self._tools is None:
            self._connection()
        assert self._tools is not None
        return self._tools

    def call(self, tool: str, arguments: dict[str, Any], timeout_s: float) -> str:
        """What the model reads for one call; ``MCPServerError`` if the server is gone."""
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        conn = self._connection()
        fut = asyncio.run_coroutine_threadsafe(
            conn.client.call_tool(tool, arguments, read_timeout_seconds=timeout_s), self._loop
        )
        try:
            result = fut.result(timeout=timeout_s + _CALL_GRACE_S)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            return f"Error: tool {tool!r} timed out after {timeout_s:g}s"
        except MCPError as e:
            if e.code == REQUEST_TIMEOUT:  # the session stays usable; the server got a cancel
                return f"Error: tool {tool!r} timed out after {timeout_s:g}s"
            if e.code != CONNECTION_CLOSED:  # the server is alive and refused the call
                return f"Error: {e.message}"
            conn.lost = True
            raise MCPServerError(self._lost(tool, e)) from e
        except Exception as e:  # the transport broke
            conn.lost = True
            raise MCPServerError(self._lost(tool, e)) from e
        text = result_text(result)
        return f"Error: {text}" if result.is_error else text

    def close(self) -> None:
        """Stop the server (bounded wait, then kill) and the loop thread. Idempotent."""
        with self._lock:
            self.closed = True
            if self._conn is not None:
                self._stop(self._conn)
                self._conn = None
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=_STOP_WAIT_S)
        if not self._thread.is_alive():
            self._loop.close()

    # -- starting and stopping --------------------------------------------------------------------
    def _connection(self) -> _Connection:
        with self._lock:
            if self.closed:
                raise MCPServerError(f"MCP server {self.spec.name!r}: its pool was closed")
            conn = self._conn
            if conn is not None and conn.healthy():
                return conn
            if conn is not None:  # died (a crash, a kill): a fresh process for this call
                self._stop(conn)
                self._conn = None
            self._conn = self._start()
            return self._conn

    def _start(self) -> _Connection:
        problem = client_problem()
        if problem:
            raise MCPServerError(f"MCP server {self.spec.name!r}: {problem}")
        import mcp  # noqa: F401  (here, not on the loop: the import takes a second)

        conn = _Connection()
        ready: concurrent.futures.Future = concurrent.futures.Future()
        conn.task = asyncio.run_coroutine_threadsafe(self._serve(conn, ready), self._loop)
        what = f"MCP server {self.spec.name!r} ({self.spec.where()})"
        try:
            tools = ready.result(timeout=self.spec.startup_timeout_s)
        except concurrent.futures.TimeoutError:
            self._stop(conn)
            raise MCPServerError(
                f"{what} did not start and list its tools within startup_timeout_s="
                f"{self.spec.startup_timeout_s:g}s"
            ) from None
        except Exception as e:
            self._stop(conn)
            raise MCPServerError(f"{what} could not start: {_describe(e)}") from e
        if self.spec.command is not None:
            ours = [str(os.getpid())]
            kids = [p for p in tagged_pids(self.tag) if _stat(p)[1:2] == ours and p not in self.pids]
            conn.pid = kids[0] if kids else None
            self.pids.extend(kids)
        if self._tools is None:
            self._tools = [_schema(t) for t in tools]
        return conn

    async def _serve(self, conn: _Connection, ready: concurrent.futures.Future) -> None:
        """Open the session, list the tools, then hold the session open until asked to stop. The
        ``mcp`` contexts must be entered and left by one task: this one."""
        from mcp import Client, StdioServerParameters

        spec = self.spec
        target: Any = spec.url
        if spec.command is not None:
            target = StdioServerParameters(
                command=spec.command[0],
                args=list(spec.command[1:]),
                env={**(spec.env or {}), TAG_VAR: self.tag},
                cwd=spec.cwd,
            )
        if conn.halted:
            return
        conn.owner = asyncio.current_task()
        try:
            async with Client(target) as client:
                tools, cursor = [], None
                for _ in range(100):  # pages
                    page = await client.list_tools(cursor=cursor)
                    tools += page.tools
                    if not (cursor := page.next_cursor):
                        break
                conn.client = client
                ready.set_result(tools)
                await conn.stop.wait()
        except Exception as e:
            if not ready.done():
                ready.set_exception(e)
        finally:
            conn.lost = True

    def _stop(self, conn: _Connection) -> None:
        """Ask the owning task to leave the session (the ``mcp`` package closes stdin, then kills
        the process group); past ``_STOP_WAIT_S`` cancel it; then kill whatever still has our tag."""
        task = conn.task
        if task is not None and not task.done():
            self._loop.call_soon_threadsafe(self._halt, conn, False)
            with contextlib.suppress(BaseException):
                task.result(timeout=_STOP_WAIT_S)
            if not task.done():
                self._loop.call_soon_threadsafe(self._halt, conn, True)
                with contextlib.suppress(BaseException):
                    task.result(timeout=_STOP_WAIT_S / 2)
        if self.spec.command is not None:
            for pid in tagged_pids(self.tag):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)

    @staticmethod
    def _halt(conn: _Connection, force: bool) -> None:
        """On the loop: a serving session is left through its stop event, one still starting (or
        stuck) is cancelled; a task that has not begun yet returns at once."""
        conn.halted = True
        if conn.client is not None and not force:
            conn.stop.set()
        elif conn.owner is not None:
            conn.owner.cancel()

    def _lost(self, tool: str, e: BaseException) -> str:
        return (
            f"MCP server {self.spec.name!r} ({self.spec.where()}) was lost during a call to {tool!r}: "
            f"{_describe(e)}. It is restarted for the next call."
        )


# -- what the model reads -----------------------------------------------------------------------------
def _schema(tool: Any) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description or tool.title or "",
            "parameters": tool.input_schema or {"type": "object", "properties": {}},
        },
    }


def result_text(result: Any) -> str:
    """A ``CallToolResult`` as text: text parts joined by newlines, other parts described in
    brackets; a result with only structured content as JSON."""
    parts = []
    for c in result.content:
        kind = getattr(c, "type", "?")
        if kind == "text":
            parts.append(c.text)
        elif kind == "resource" and getattr(c.resource, "text", None) is not None:
            parts.append(c.resource.text)
        elif kind == "resource":
            parts.append(f"[resource: {c.resource.uri} ({c.resource.mime_type or 'binary'})]")
        elif kind == "resource_link":
            parts.append(f"[resource link: {c.uri}]")
        else:  # image, audio
            parts.append(f"[{kind}: {getattr(c, 'mime_type', None) or 'unknown type'}]")
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False)
    return "\n".join(parts) if parts else "[no output]"


def _describe(e: BaseException) -> str:
    while getattr(e, "exceptions", None):  # a task group's ExceptionGroup: its first cause
        e = e.exceptions[0]  # type: ignore[attr-defined]
    return f"{type(e).__name__}: {e}"


# -- processes ------------------------------------------------------------------------------------------
def tagged_pids(tag: str) -> list[int]:
    """Processes of this user whose environment carries ``AGENTRL_MCP_TAG=tag`` (Linux /proc)."""
    needle = f"\0{TAG_VAR}={tag}\0".encode()
    out = []
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/environ", "rb") as f:
                        if needle in b"\0" + f.read():
                            out.append(int(entry))
                except OSError:
                    continue
    return out


def _stat(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].decode().split()
    except OSError:
        return []


def _alive(pid: int) -> bool:
    fields = _stat(pid)
    return bool(fields) and fields[0] not in ("Z", "X")


# -- pools and environments -----------------------------------------------------------------------------
_POOLS: dict[tuple[str, str], MCPPool] = {}
_POOLS_LOCK = threading.Lock()


def pool_for(owner: str, spec: MCPServer) -> MCPPool:
    """The process-wide pool of ``spec`` for ``owner`` (an environment class's qualified name: each
    class has servers of its own), made on first use."""
    key = (owner, spec.launch_key())
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None or pool.closed or pool.owner_pid != os.getpid():  # a forked child: its own
            pool = _POOLS[key] = MCPPool(spec)
        return pool


def pools() -> list[MCPPool]:
    with _POOLS_LOCK:
        return list(_POOLS.values())


@atexit.register
def close_all() -> None:
    """Stop every MCP server this process started (the next use starts fresh ones). Call it at the
    end of a run; it also runs at interpreter exit."""
    with _POOLS_LOCK:
        mine = [p for p in _POOLS.values() if p.owner_pid == os.getpid()]
        _POOLS.clear()
    for pool in mine:
        pool.close()


def mcp_tools(
    owner: str, servers: Sequence[MCPServer | Mapping[str, Any]], local: Collection[str]
) -> dict[str, tuple[MCPPool, MCPServer, dict[str, Any]]]:
    """Tool name -> (pool, server, schema) for the ``servers`` of environment class ``owner``
    (``MCPServer``s, or dicts from a config's ``env.options``), starting them if needed. A tool name
    served twice, or also one of the ``local`` (``@tool``/``extra_tools``) names, is a ``ValueError``."""
    specs = [s if isinstance(s, MCPServer) else MCPServer(**s) for s in servers]
    where = owner.rsplit(".", 1)[-1]
    if len({s.name for s in specs}) != len(specs):
        raise ValueError(f"{where}.mcp_servers: server names must be unique: {specs}")
    out: dict[str, tuple[MCPPool, MCPServer, dict[str, Any]]] = {}
    for spec in specs:
        pool = pool_for(owner, spec)
        for schema in pool.schemas():
            name = schema["function"]["name"]
            if name in local:
                raise ValueError(
                    f"tool name clash in {where}: {name!r} is both a @tool/extra_tools "
                    f"function and a tool of MCP server {spec.name!r}"
                )
            if name in out:
                raise ValueError(
                    f"tool name clash in {where}: {name!r} is served by both MCP servers "
                    f"{out[name][1].name!r} and {spec.name!r}"
                )
            out[name] = (pool, spec, schema)
    return out


def call_mcp_tool(
    owner: str,
    servers: Sequence[MCPServer | Mapping[str, Any]],
    local: Collection[str],
    name: str,
    arguments: dict[str, Any],
) -> str | None:
    """Run tool ``name`` on the server of ``owner``'s ``servers`` that serves it: its reply as text
    (a tool error is text too); None if none of them serves it."""
    found = mcp_tools(owner, servers, local).get(name)
    if found is None:
        return None
    pool, spec, _ = found
    return pool.call(name, arguments, spec.timeout_s)
