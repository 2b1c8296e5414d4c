"""The sandbox contract: limits, the result of running code, sessions, and a session pool.

Every backend (bubblewrap, Docker, E2B, unisolated) implements the same two entry points:

    result = sandbox.run(code, limits)        # stateless: a fresh interpreter per call
    with sandbox.session() as s:               # stateful: variables survive across cells
        s.run("x = 41")
        s.run("x + 1").value                   # -> "42"

Failures of the *code* (exceptions, timeouts, memory or output limits) are data in ``ExecResult``: they
go back to the model as an observation. Failures of the *sandbox itself* (it cannot start, the engine
is gone) raise ``SandboxError``, which the runner records at the ``sandbox`` boundary.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import os
import threading
import time
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from agentrl.errors import BoundaryError

MiB = 1 << 20


class SandboxError(BoundaryError):
    """The sandbox itself failed (could not start, lost its engine, protocol broken). Not raised for
    errors in the executed code, which are reported in ``ExecResult``. The runner records it at the
    ``sandbox`` boundary (``boundary`` attribute)."""

    boundary = "sandbox"


class IsolationUnavailable(SandboxError):
    """The requested isolation cannot be provided on this machine (no user namespaces, no engine)."""


@dataclass(frozen=True)
class Limits:
    """Resource limits for one cell (stateless run) or one session.

    Wall time is enforced by the host (the process tree is killed), the rest inside the sandbox:
    memory and process count through cgroups where writable (else rlimits), CPU time and file size
    through rlimits, output bytes by the reader."""

    wall_s: float = 10.0
    """Wall-clock seconds per cell; past it the cell is interrupted, then killed."""
    cpu_s: float = 10.0
    """CPU seconds per cell (RLIMIT_CPU, soft: the cell gets a TimeoutError, the session survives)."""
    memory_bytes: int = 512 * MiB
    """Memory for the whole sandbox (all its processes)."""
    processes: int = 64
    """Processes/threads the code may have at once (pids cgroup)."""
    output_bytes: int = 64 * 1024
    """Bytes of stdout (and separately stderr) kept per cell; the rest is dropped, ``truncated`` set."""
    file_bytes: int = 16 * MiB
    """Largest file the code may write (RLIMIT_FSIZE; writes past it fail with EFBIG)."""

    def replace(self, **changes: Any) -> Limits:
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class SandboxSpec:
    """Where an environment runs code: a backend, its options, and how sessions are pooled. A run's
    ``sandbox`` config section becomes one of these, passed to every environment as ``sandbox=``.

    ``sandboxes.shared_pool(spec)`` gives the process-wide ``SessionPool`` for a spec, so the sandbox
    (warm workers, the Docker client, cgroup setup) is made once per process, not per episode."""

    backend: str = "bwrap"
    """``bwrap``, ``docker``, ``e2b`` or ``unisolated`` (refused unless ``allow_unisolated``)."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments of ``make_sandbox`` (``limits`` as a dict, ``image``, ``template``...)."""
    warm_sessions: int = 0
    """Sessions started ahead of time, so an episode's ``reset`` does not wait for one."""
    max_sessions: int = 64
    """Sessions open at once in this process (one per running episode)."""
    acquire_timeout_s: float = 600.0
    """How long an episode waits for a free session before failing at the ``sandbox`` boundary."""

    def key(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True, default=str)


@dataclass(frozen=True)
class ExecError:
    """An exception raised by the executed code (or a limit turned into one, e.g. TimeoutError)."""

    name: str
    value: str
    traceback: str = ""


@dataclass
class ExecResult:
    """What running one piece of code produced."""

    stdout: str = ""
    stderr: str = ""
    value: str | None = None
    """``repr`` of the last expression's value, when the backend supports it and it is not None."""
    error: ExecError | None = None
    exit_code: int | None = 0
    """0 when the code finished without an exception, 1 when it raised, None when it was killed."""
    timed_out: bool = False
    """A wall-clock or CPU limit stopped the code."""
    truncated: bool = False
    """Output (or the value's repr) was cut at ``Limits.output_bytes``."""
    duration_s: float = 0.0
    restarted: bool = False
    """The interpreter had to be killed and restarted: variables from earlier cells are gone."""

    @property
    def ok(self) -> bool:
        return self.error is None and not self.timed_out

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@runtime_checkable
class Session(Protocol):
    """A stateful interpreter: ``run`` keeps variables across calls. Context manager; ``close`` is
    idempotent and always safe."""

    def run(self, code: str, limits: Limits | None = None) -> ExecResult: ...

    def reset(self) -> None:
        """Forget all state (a fresh interpreter)."""

    def close(self) -> None: ...

    def __enter__(self) -> Session: ...

    def __exit__(self, *exc: object) -> None: ...


@runtime_checkable
class Sandbox(Protocol):
    """A backend. ``run`` is stateless (fresh interpreter each call); ``session`` is stateful."""

    name: str
    limits: Limits

    def run(self, code: str, limits: Limits | None = None) -> ExecResult: ...

    def session(self, limits: Limits | None = None) -> Session: ...

    def close(self) -> None:
        """Kill every session and process this sandbox started."""

    def __enter__(self) -> Sandbox: ...

    def __exit__(self, *exc: object) -> None: ...


class SessionBase:
    """Shared plumbing for sessions: context manager, idempotent close, a lock so one cell runs at a
    time per session, and registration with the owning sandbox for reaping."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.closed = False
        self._lock = threading.Lock()

    def __enter__(self) -> SessionBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, code: str, limits: Limits | None = None) -> ExecResult:
        if self.closed:
            raise SandboxError("this session is closed")
        with self._lock:
            return self._run(code, limits or self.limits)

    def _run(self, code: str, limits: Limits) -> ExecResult:
        raise NotImplementedError

    def reset(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class SandboxBase:
    """Shared plumbing for backends: stateless ``run`` through a one-cell session, tracking of live
    sessions so ``close`` (and interpreter exit) reaps them."""

    name = "base"

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self._sessions: weakref.WeakSet[SessionBase] = weakref.WeakSet()
        self._closed = False
        _LIVE.add(self)

    def __enter__(self) -> SandboxBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, code: str, limits: Limits | None = None) -> ExecResult:
        with self.session(limits) as s:
            return s.run(code)

    def session(self, limits: Limits | None = None) -> SessionBase:
        if self._closed:
            raise SandboxError(f"the {self.name} sandbox is closed")
        s = self._new_session(limits or self.limits)
        self._sessions.add(s)
        return s

    def _new_session(self, limits: Limits) -> SessionBase:
        raise NotImplementedError

    def live_sessions(self) -> int:
        return sum(1 for s in list(self._sessions) if not s.closed)

    def close(self) -> None:
        self._closed = True
        for s in list(self._sessions):
            with contextlib.suppress(Exception):
                s.close()


_LIVE: weakref.WeakSet[SandboxBase] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    """Reap every sandbox still open when the interpreter exits (containers would outlive us)."""
    for sb in list(_LIVE):
        with contextlib.suppress(Exception):
            sb.close()


class SessionPool:
    """Hands out fresh sessions to concurrent episodes, at most ``max_sessions`` at once, and reaps
    them. ``spares`` sessions are created ahead of time in a background thread so ``acquire`` does not
    pay the start-up cost (a container start, an interpreter spawn). A released session is closed,
    never reused: no state leaks from one episode to the next.

        pool = SessionPool(sandbox, max_sessions=64, spares=4)
        with pool.acquire() as s:
            s.run("1 + 1")
    """

    def __init__(self, sandbox: Sandbox, max_sessions: int = 64, spares: int = 0) -> None:
        self.sandbox = sandbox
        self.max_sessions = max_sessions
        self.spares = spares
        self._slots = threading.BoundedSemaphore(max_sessions)
        self._cv = threading.Condition()
        self._ready: list[Session] = []
        self._out: set[int] = set()
        self._outstanding: dict[int, Session] = {}
        self._closed = False
        self._filler: threading.Thread | None = None
        if spares > 0:
            self._filler = threading.Thread(target=self._fill, name="agentrl-pool-filler", daemon=True)
            self._filler.start()

    def _fill(self) -> None:
        while True:
            with self._cv:
                while not self._closed and len(self._ready) >= self.spares:
                    self._cv.wait()
                if self._closed:
                    return
            try:
                s = self.sandbox.session()
            except Exception:
                time.sleep(0.5)  # the backend is failing; acquire() will surface the error itself
                continue
            with self._cv:
                if self._closed:
                    s.close()
                    return
                self._ready.append(s)
                self._cv.notify_all()

    def acquire(self, timeout: float | None = None) -> Session:
        """A fresh session; blocks while ``max_sessions`` are out. Close it (or use ``with``)."""
        if self._closed:
            raise SandboxError("the session pool is closed")
        if not self._slots.acquire(timeout=timeout if timeout is not None else -1):
            raise SandboxError(f"no session free within {timeout}s ({self.max_sessions} in use)")
        try:
            with self._cv:
                s = self._ready.pop() if self._ready else None
                self._cv.notify_all()
            if s is None:
                s = self.sandbox.session()
        except BaseException:
            self._slots.release()
            raise
        pooled = _PooledSession(s, self)
        with self._cv:
            self._outstanding[id(pooled)] = pooled
        return pooled

    def _release(self, pooled: _PooledSession) -> None:
        with self._cv:
            if self._outstanding.pop(id(pooled), None) is None:
                return
        self._slots.release()

    @property
    def closed(self) -> bool:
        return self._closed

    def in_use(self) -> int:
        with self._cv:
            return len(self._outstanding)

    def close(self) -> None:
        """Close spares and every session still handed out."""
        with self._cv:
            self._closed = True
            ready, self._ready = self._ready, []
            outstanding = list(self._outstanding.values())
            self._cv.notify_all()
        for s in ready + outstanding:
            with contextlib.suppress(Exception):
                s.close()
        if self._filler is not None:
            self._filler.join(timeout=5)

    def __enter__(self) -> SessionPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _PooledSession:
    """A session borrowed from a pool: closing it closes the session and frees the pool slot."""

    def __init__(self, inner: Session, pool: SessionPool) -> None:
        self._inner = inner
        self._pool = pool

    @property
    def closed(self) -> bool:
        return bool(getattr(self._inner, "closed", False))

    def run(self, code: str, limits: Limits | None = None) -> ExecResult:
        return self._inner.run(code, limits)

    def reset(self) -> None:
        self._inner.reset()

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            self._pool._release(self)

    def __enter__(self) -> _PooledSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def cap_text(text: str, max_bytes: int) -> tuple[str, bool]:
    """``text`` cut to at most ``max_bytes`` UTF-8 bytes (on a character boundary), and whether it was cut."""
    raw = text.encode("utf-8", "replace")
    if len(raw) <= max_bytes:
        return text, False
    return raw[:max_bytes].decode("utf-8", "ignore"), True


def owner_tag() -> str:
    """``host:pid:starttime`` of this process: lets start-up reaping tell a crashed owner's leftovers
    (pid gone, or reused by a process with another start time) from a live owner's."""
    return f"{os.uname().nodename}:{os.getpid()}:{process_start_time(os.getpid())}"


def process_start_time(pid: int) -> int:
    """Start time of ``pid`` in clock ticks since boot (field 22 of /proc/PID/stat), -1 if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return -1
    return int(stat.rsplit(b")", 1)[1].split()[19])


def owner_alive(tag: str) -> bool:
    """Whether the process named by an ``owner_tag`` on this host still runs (other hosts: assume so)."""
    try:
        host, pid, start = tag.rsplit(":", 2)
    except ValueError:
        return False
    if host != os.uname().nodename:
        return True
    return process_start_time(int(pid)) == int(start)


def format_result(r: ExecResult) -> str:
    """The text a model sees for one cell: stdout, stderr, the value, the error, limit notes."""
    parts: list[str] = []
    if r.stdout:
        parts.append(r.stdout.rstrip("\n"))
    if r.stderr:
        parts.append("[stderr]\n" + r.stderr.rstrip("\n"))
    if r.value is not None:
        parts.append(r.value)
    if r.error is not None:
        parts.append((r.error.traceback or f"{r.error.name}: {r.error.value}").rstrip("\n"))
    if r.truncated:
        parts.append("[output truncated]")
    if r.restarted:
        parts.append("[the interpreter was restarted: variables from earlier cells are gone]")
    if not parts:
        return "[no output]"
    return "\n".join(parts)


@contextlib.contextmanager
def timer() -> Iterator[list[float]]:
    """``with timer() as t: ...`` then ``t[0]`` is the elapsed seconds."""
    out = [0.0]
    t0 = time.perf_counter()
    try:
        yield out
    finally:
        out[0] = time.perf_counter() - t0
