"""A worker interpreter as a host process (inside bubblewrap, or bare for ``unisolated``), and the
session that runs cells on it. The in-sandbox side is ``sandboxes/worker.py``.

Timeouts: past ``wall_s`` the worker gets SIGINT (the cell ends with ``TimeoutError`` and the session
keeps its variables); if it does not answer within ``interrupt_grace_s`` (stuck in C code, or the
code swallowed ``KeyboardInterrupt``) the whole process tree is killed and the next cell starts a
fresh interpreter (``ExecResult.restarted``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import queue
import select
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from sandboxes.base import ExecError, ExecResult, Limits, SandboxError, SessionBase, cap_text
from sandboxes.cgroups import Cgroup, CgroupManager

WORKER_SOURCE = (Path(__file__).parent / "worker.py").read_text()
_MAX_FRAME = 64 << 20
OVERHEAD_PIDS = 8  # bwrap's two processes and the worker's drain threads count against pids.max


class Spawner:
    """Starts every sandbox process from one long-lived thread: bubblewrap's ``--die-with-parent``
    follows the *thread* that spawned it, so a sandbox started from a short-lived worker thread would
    die when that thread exits."""

    _instance: Spawner | None = None
    _guard = threading.Lock()

    def __init__(self) -> None:
        self._q: queue.Queue[tuple[Callable[[], Any], concurrent.futures.Future]] = queue.Queue()
        threading.Thread(target=self._loop, name="agentrl-sandbox-spawner", daemon=True).start()

    @classmethod
    def get(cls) -> Spawner:
        with cls._guard:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def _loop(self) -> None:
        while True:
            fn, fut = self._q.get()
            try:
                fut.set_result(fn())
            except BaseException as e:
                fut.set_exception(e)

    def call(self, fn: Callable[[], Any]) -> Any:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._q.put((fn, fut))
        return fut.result()


def pop_frame(buf: bytearray) -> dict[str, Any] | None:
    """Take one complete frame (4-byte length + JSON object) off the front of ``buf``, if there is one.
    Frames that are not JSON objects are dropped: the code can write junk on the protocol descriptor."""
    while len(buf) >= 4:
        n = int.from_bytes(buf[:4], "big")
        if n > _MAX_FRAME:
            raise SandboxError(f"protocol frame of {n} bytes from the sandbox")
        if len(buf) < 4 + n:
            return None
        body = bytes(buf[4 : 4 + n])
        del buf[: 4 + n]
        with contextlib.suppress(ValueError):
            obj = json.loads(body)
            if isinstance(obj, dict):
                return obj
    return None


def encode_frame(obj: dict[str, Any]) -> bytes:
    data = json.dumps(obj).encode()
    return len(data).to_bytes(4, "big") + data


def descendants(pid: int) -> list[int]:
    """All descendants of ``pid`` (host pids), parents before children."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop(0)
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    kids = [int(x) for x in f.read().split()]
                out.extend(kids)
                todo.extend(kids)
    return out


class Worker(Protocol):
    """What ``run_cell`` needs from a running worker (a host process here, a container in docker.py)."""

    def send(self, obj: dict[str, Any]) -> None: ...

    def read_frame(self, deadline: float) -> dict[str, Any] | None: ...

    def interrupt(self) -> None: ...

    def alive(self) -> bool: ...

    def oom_kills(self) -> int: ...

    def exit_status(self) -> int | None: ...

    def kill(self) -> None: ...


class WorkerProcess:
    """One running worker: the host process (bwrap or python), its pipes, cgroup and scratch dir."""

    def __init__(
        self,
        argv_prefix: list[str],
        python: str,
        limits: Limits,
        scratch: Path,
        cgroups: CgroupManager | None,
        env: dict[str, str] | None,
        paths: list[str],
        start_timeout_s: float = 10.0,
    ) -> None:
        self.limits = limits
        self.scratch = scratch
        self.cgroup: Cgroup | None = None
        self.proc: subprocess.Popen | None = None
        self.worker_pid: int | None = None
        self._buf = bytearray()
        scratch.mkdir(parents=True, exist_ok=False)
        self._spawn(argv_prefix, python, cgroups, env, paths)
        ready = self.read_frame(time.monotonic() + start_timeout_s)
        if not ready or ready.get("ev") != "ready":
            err = self._stderr_tail()
            self.kill()
            raise SandboxError(f"the sandbox did not start: {err or 'no ready message'}")
        assert self.proc is not None
        tree = [self.proc.pid, *descendants(self.proc.pid)]
        self.worker_pid = tree[-1]
        if self.cgroup is not None:
            try:
                for pid in tree:
                    self.cgroup.add(pid)
            except OSError as e:
                self.kill()
                raise SandboxError(f"could not move the sandbox into its cgroup: {e}") from e

    def _spawn(
        self,
        argv_prefix: list[str],
        python: str,
        cgroups: CgroupManager | None,
        env: dict[str, str] | None,
        paths: list[str],
    ) -> None:
        """Start the worker process (through the spawner thread) with its two protocol pipes."""
        limits = self.limits
        cmd_r, self._cmd_w = os.pipe()
        self._rep_r, rep_w = os.pipe()
        cfg = {
            "file_bytes": limits.file_bytes,
            "memory_bytes": limits.memory_bytes,
            "nproc": limits.processes + OVERHEAD_PIDS if cgroups is None else 0,
            "paths": paths,
        }
        argv = [
            *argv_prefix,
            python,
            "-I",
            "-S",
            "-c",
            WORKER_SOURCE,
            str(cmd_r),
            str(rep_w),
            json.dumps(cfg),
        ]
        try:
            if cgroups is not None:
                self.cgroup = cgroups.create(limits.memory_bytes, limits.processes + OVERHEAD_PIDS)
            self.proc = Spawner.get().call(
                lambda: subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    pass_fds=(cmd_r, rep_w),
                    env=env if env is not None else {},
                    cwd=str(self.scratch) if not argv_prefix else "/",
                    start_new_session=True,
                )
            )
        except Exception as e:
            self.kill()
            raise SandboxError(f"could not start the sandbox: {e}") from e
        finally:
            os.close(cmd_r)
            os.close(rep_w)

    def _stderr_tail(self) -> str:
        if self.proc is None or self.proc.stderr is None:
            return ""
        with contextlib.suppress(Exception):
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(timeout=2)
            return self.proc.stderr.read(4000).decode("utf-8", "replace").strip()
        return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def send(self, obj: dict[str, Any]) -> None:
        view = memoryview(encode_frame(obj))
        while view:
            view = view[os.write(self._cmd_w, view) :]

    def read_frame(self, deadline: float) -> dict[str, Any] | None:
        """The next frame, None on EOF; raises TimeoutError past ``deadline``."""
        while True:
            frame = pop_frame(self._buf)
            if frame is not None:
                return frame
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            r, _, _ = select.select([self._rep_r], [], [], remaining)
            if not r:
                raise TimeoutError
            chunk = os.read(self._rep_r, 1 << 16)
            if not chunk:
                return None
            self._buf += chunk

    def interrupt(self) -> None:
        if self.worker_pid is not None:
            with contextlib.suppress(OSError):
                os.kill(self.worker_pid, signal.SIGINT)

    def oom_kills(self) -> int:
        return self.cgroup.oom_kills() if self.cgroup is not None else 0

    def exit_status(self) -> int | None:
        if self.proc is None:
            return None
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self.proc.wait(timeout=0.5)
        return None

    def kill(self) -> None:
        """Kill the whole tree, remove the cgroup and the scratch dir. Idempotent."""
        if self.proc is not None:
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                self.proc.kill()
        if self.cgroup is not None:
            self.cgroup.destroy()
            self.cgroup = None
        if self.proc is not None:
            with contextlib.suppress(Exception):
                self.proc.wait(timeout=5)
            if self.proc.stderr is not None:
                self.proc.stderr.close()
        for fd in ("_cmd_w", "_rep_r"):
            v = getattr(self, fd, -1)
            if v >= 0:
                with contextlib.suppress(OSError):
                    os.close(v)
                setattr(self, fd, -1)
        shutil.rmtree(self.scratch, ignore_errors=True)


def run_cell(w: Worker, code: str, limits: Limits, grace_s: float) -> tuple[ExecResult, bool]:
    """Run one cell on ``w``; returns the result and whether ``w`` is still usable."""
    t0 = time.monotonic()
    out: dict[str, list[str]] = {"stdout": [], "stderr": []}
    sizes = {"stdout": 0, "stderr": 0}
    res = ExecResult()
    oom_before = w.oom_kills()
    try:
        w.send({"op": "run", "code": code, "cpu_s": limits.cpu_s, "output_bytes": limits.output_bytes})
    except TimeoutError:  # the sandbox stopped reading its input (Docker: a paused or wedged container)
        waited = time.monotonic() - t0  # the send's own limit; the kill below takes longer under load
        w.kill()
        res.restarted = True
        res.error = ExecError(
            "TimeoutError", f"the sandbox did not take the cell within {waited:.0f}s and was restarted"
        )
        return _finish(res, out, limits, t0), False
    except OSError:
        return _finish(_died(w, res, t0, oom_before), out, limits, t0), False
    deadline, interrupted = t0 + limits.wall_s, False
    while True:
        try:
            frame = w.read_frame(deadline)
        except TimeoutError:
            if not interrupted:
                interrupted, deadline = True, time.monotonic() + grace_s
                w.interrupt()
                continue
            w.kill()
            res.timed_out, res.restarted, res.exit_code = True, True, None
            res.error = ExecError(
                "TimeoutError", f"the cell ran longer than {limits.wall_s:g}s and was killed"
            )
            break
        if frame is None:
            return _finish(_died(w, res, t0, oom_before), out, limits, t0), False
        ev = frame.get("ev")
        if ev == "out" and frame.get("stream") in out:
            text = str(frame.get("text", ""))
            stream = frame["stream"]
            room = limits.output_bytes - sizes[stream]
            if room > 0:
                piece, cut = cap_text(text, room)
                out[stream].append(piece)
                sizes[stream] += len(piece.encode("utf-8", "replace"))
                res.truncated |= cut
            elif text:
                res.truncated = True
        elif ev == "done":
            _apply_done(res, frame, interrupted, limits)
            break
    return _finish(res, out, limits, t0), w.alive() and not res.restarted


def _apply_done(res: ExecResult, frame: dict[str, Any], interrupted: bool, limits: Limits) -> None:
    value = frame.get("value")
    res.value = str(value) if value is not None else None
    res.truncated |= bool(frame.get("truncated"))
    err = frame.get("error")
    if isinstance(err, dict):
        name, value_s = str(err.get("name", "Error")), str(err.get("value", ""))
        tb = str(err.get("traceback", ""))
        if interrupted and name == "KeyboardInterrupt":
            name, value_s = "TimeoutError", f"the cell ran longer than {limits.wall_s:g}s and was interrupted"
            tb = f"{tb}TimeoutError: {value_s}\n"
            res.timed_out = True
        elif name == "TimeoutError" and "CPU time limit" in value_s:
            res.timed_out = True
        res.error = ExecError(name, value_s, tb)
        res.exit_code = 1


def _died(w: Worker, res: ExecResult, t0: float, oom_before: int) -> ExecResult:
    """The interpreter exited mid-cell: the code called os._exit, was OOM-killed, or crashed Python."""
    oom = w.oom_kills() > oom_before
    status = w.exit_status()
    w.kill()
    res.restarted, res.exit_code = True, status
    if oom:
        res.error = ExecError(
            "MemoryError", f"the sandbox exceeded its memory limit and was killed (exit status {status})"
        )
    else:
        res.error = ExecError(
            "InterpreterExit", f"the interpreter exited during the cell (exit status {status})"
        )
    return res


def _finish(res: ExecResult, out: dict[str, list[str]], limits: Limits, t0: float) -> ExecResult:
    res.stdout, res.stderr = "".join(out["stdout"]), "".join(out["stderr"])
    res.duration_s = time.monotonic() - t0
    return res


class ProcessSession(SessionBase):
    """A stateful session on a worker process; restarts the worker lazily after it died."""

    def __init__(self, factory: Callable[[Limits], Worker], limits: Limits, grace_s: float) -> None:
        super().__init__(limits)
        self._factory = factory
        self._grace_s = grace_s
        self._worker: Worker | None = factory(limits)
        self._lost_state = False

    def _run(self, code: str, limits: Limits) -> ExecResult:
        if self._worker is None:
            self._worker = self._factory(self.limits)
        res, usable = run_cell(self._worker, code, limits, self._grace_s)
        if not usable:
            self._worker.kill()
            self._worker = None
        return res

    def reset(self) -> None:
        with self._lock:
            if self._worker is not None:
                self._worker.kill()
            self._worker = self._factory(self.limits)

    def close(self) -> None:
        self.closed = True
        w, self._worker = self._worker, None
        if w is not None:
            w.kill()
