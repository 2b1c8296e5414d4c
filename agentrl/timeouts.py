"""Waiting with a limit: nothing in a run waits forever (docs/scaling.md, "Timeouts").

Python cannot stop a thread. A call that may hang (an engine request, a sleep or wake of the
colocated engine) therefore runs in a daemon thread, and its caller waits for it at most
``timeout_s``; past that the caller gets a ``WaitTimeout`` naming what it waited for, how long it
waited and the setting that bounds the wait. The stuck call is *abandoned*, not stopped: its thread
keeps running until the call returns (if ever; it does not keep the process alive at exit), and
whatever the call holds (an engine's lock, GPU memory) stays held meanwhile.

The thread helpers live here too, all on daemon threads: ``DaemonThreadPool`` (tools, environment
steps), ``BoundedCalls`` (one reusable thread per caller), ``DaemonThreads`` (one thread per call) and
``LoopThread`` (a cancellable coroutine on its own event loop). Every thread agentrl starts comes from
``start_thread``, which puts it on this process's CUDA device: the current device is per thread, a new
thread starts on device 0, and Triton launches, ``torch.cuda.synchronize()`` and CUDA-graph streams
follow the thread's device, not their tensors' (``tests/core/test_thread_devices.py``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import torch

T = TypeVar("T")

_process_device: int | None = None
"""The CUDA device of this process's threads, once ``bind_cuda_device`` has named it."""


def bind_cuda_device(index: int) -> None:
    """Make ``index`` the CUDA device of every thread ``start_thread`` starts in this process
    (``ranks.init_from_env``: the rank's ``LOCAL_RANK`` GPU)."""
    global _process_device
    _process_device = index


def thread_cuda_device() -> int | None:
    """The CUDA device a new thread takes: the process's (``bind_cuda_device``), else, once CUDA has
    started, the creating thread's current one; None without CUDA."""
    if _process_device is not None:
        return _process_device
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.current_device()
    return None


def start_thread(
    target: Callable[..., Any], name: str, args: tuple = (), start: bool = True
) -> threading.Thread:
    """A daemon thread running ``target(*args)`` on ``thread_cuda_device()`` (started unless
    ``start`` is False): the one way agentrl starts a thread (``tests/test_layout.py``)."""
    device = thread_cuda_device()

    def run() -> None:
        if device is not None:
            torch.cuda.set_device(device)
        target(*args)

    thread = threading.Thread(target=run, name=name, daemon=True)
    if start:
        thread.start()
    return thread


class WaitTimeout(TimeoutError):
    """A wait ran past its limit. ``what`` names the call, ``waited_s`` is the time waited,
    ``setting`` the config key that bounds it (when there is one)."""

    def __init__(self, what: str, waited_s: float, setting: str | None = None, note: str = "") -> None:
        self.what, self.waited_s, self.setting = what, waited_s, setting
        limit = f" (limit: {setting})" if setting else ""
        super().__init__(f"{what}: no answer after waiting {waited_s:.1f}s{limit}{note}")


def wait_for(
    future: concurrent.futures.Future,
    timeout_s: float,
    what: str,
    setting: str | None = None,
    note: str = "",
) -> Any:
    """``future``'s result, or ``WaitTimeout`` once ``timeout_s`` has passed without one. An
    exception the call itself raised (even a ``TimeoutError``) is re-raised as it is."""
    t0 = time.monotonic()
    done, _ = concurrent.futures.wait([future], timeout=timeout_s)
    if not done:
        raise WaitTimeout(what, time.monotonic() - t0, setting, note)
    return future.result()


def call_with_timeout(fn: Callable[[], T], timeout_s: float, what: str, setting: str | None = None) -> T:
    """``fn()`` run in a daemon thread (``start_thread``), waited for at most ``timeout_s``
    (``WaitTimeout`` past it; the stuck call is abandoned, see the module docstring)."""
    fut: concurrent.futures.Future = concurrent.futures.Future()

    def run() -> None:
        try:
            fut.set_result(fn())
        except BaseException as e:  # handed to the waiting caller
            fut.set_exception(e)

    start_thread(run, "agentrl-bounded-call")
    return wait_for(fut, timeout_s, what, setting, note="; the call is abandoned (its thread keeps running)")


class DaemonThreadPool(concurrent.futures.Executor):
    """``concurrent.futures.ThreadPoolExecutor`` with daemon worker threads, for calls into user code
    (tools, environment reset/step, rewards, whole episodes). CPython joins every
    ``ThreadPoolExecutor``'s threads when the interpreter exits, so one tool that never returns held
    the process forever after training had ended; a daemon thread stuck in such a call ends with
    the process instead. Threads start on demand, up to ``max_workers``, and idle ones are reused."""

    def __init__(self, max_workers: int, name: str) -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        self._max, self._name = max_workers, name
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._shut = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[T]:
        with self._lock:
            if self._shut:
                raise RuntimeError("cannot schedule new futures after shutdown")
            fut: concurrent.futures.Future[T] = concurrent.futures.Future()
            self._work.put((fut, fn, args, kwargs))
            if not self._idle.acquire(blocking=False) and len(self._threads) < self._max:
                self._threads.append(start_thread(self._serve, f"{self._name}_{len(self._threads)}"))
            return fut

    def _serve(self) -> None:
        while (item := self._work.get()) is not None:
            fut, fn, args, kwargs = item
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(*args, **kwargs))
                except BaseException as e:  # handed to whoever waits on the future
                    fut.set_exception(e)
            del item, fut, fn, args, kwargs
            self._idle.release()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shut = True
            if cancel_futures:
                pending = []
                while True:
                    try:
                        item = self._work.get_nowait()
                    except queue.Empty:
                        break
                    if item is not None:
                        pending.append(item[0])
                for fut in pending:
                    fut.cancel()
            threads = list(self._threads)
            for _ in threads:
                self._work.put(None)
        if wait:
            for t in threads:
                t.join()


class _CallThread:
    """One long-lived daemon thread that runs the calls put to it, one at a time."""

    def __init__(self) -> None:
        self.calls: queue.SimpleQueue = queue.SimpleQueue()
        self.abandoned = False
        start_thread(self._serve, "agentrl-bounded-call")

    def _serve(self) -> None:
        while (item := self.calls.get()) is not None:
            fn, fut = item
            try:
                fut.set_result(fn())
            except BaseException as e:  # handed to the waiting caller
                fut.set_exception(e)
            del item, fn, fut


class BoundedCalls:
    """``call_with_timeout`` for calls made again and again (an engine request every turn, an
    environment step every turn): each calling thread (or each key: an episode) gets one long-lived
    helper thread that runs its calls, instead of a fresh thread per call. A call that times out is abandoned with its helper
    thread; the caller's next call gets a new one. ``close`` ends the helper threads (after their
    calls). Torch compute is better kept out of helper threads on a small CPU machine: once two
    threads have run torch ops, their OpenMP thread teams compete for the cores
    (docs/performance.md#the-training-pipeline-sync-vs-async-benchpipelinepy), which
    is why the runners bound an in-process engine with ``HFEngine.bounded`` in their own thread."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()
        self._threads: list[_CallThread] = []
        self._keyed: dict[int, _CallThread] = {}

    def call(
        self,
        fn: Callable[[], T],
        timeout_s: float,
        what: str,
        setting: str | None = None,
        key: int | None = None,
    ) -> T:
        """``fn()`` on the calling thread's helper, or with ``key`` on that key's own helper (one
        episode's calls on one thread, whichever thread makes them; ``release(key)`` ends it)."""
        with self._lock:
            worker = self._keyed.get(key) if key is not None else getattr(self._local, "worker", None)
            if worker is None or worker.abandoned:
                worker = _CallThread()
                self._threads.append(worker)
                if key is not None:
                    self._keyed[key] = worker
                else:
                    self._local.worker = worker
        fut: concurrent.futures.Future = concurrent.futures.Future()
        worker.calls.put((fn, fut))
        try:
            return wait_for(
                fut, timeout_s, what, setting, note="; the call is abandoned (its thread keeps running)"
            )
        except WaitTimeout:
            worker.abandoned = True
            worker.calls.put(None)  # the stuck thread ends once its call returns, if ever
            raise

    def release(self, key: int) -> None:
        """End ``key``'s helper thread (after its calls)."""
        with self._lock:
            worker = self._keyed.pop(key, None)
            if worker is not None:
                self._threads.remove(worker)
        if worker is not None and not worker.abandoned:
            worker.abandoned = True
            worker.calls.put(None)

    def close(self) -> None:
        with self._lock:
            threads, self._threads = self._threads, []
            self._keyed.clear()
        for worker in threads:
            if not worker.abandoned:
                worker.abandoned = True
                worker.calls.put(None)


class DaemonThreads(concurrent.futures.Executor):
    """One daemon thread per call (plain-function agents): a stuck call is abandoned, and never holds
    the process at exit (CPython joins a ``ThreadPoolExecutor``'s threads there)."""

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()

        def work() -> None:
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(*args, **kwargs))
                except BaseException as e:
                    fut.set_exception(e)

        start_thread(work, "agentrl-agent")
        return fut


class LoopThread:
    """A coroutine on an event loop of its own, on a daemon thread, with a task the driving thread can
    cancel (``asyncio.run`` gives no handle to do that from another thread): the agents' loop of
    ``rollout.agent_loop``."""

    def __init__(self, coro: Any, name: str = "agentrl-agents") -> None:
        self.loop = asyncio.new_event_loop()
        self.task = self.loop.create_task(coro)
        self.done: concurrent.futures.Future = concurrent.futures.Future()
        """The agents' outcomes, set when the task ends."""
        self.started = False
        self._thread = start_thread(self._run, name, start=False)

    def start(self) -> None:
        self.started = True
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.done.set_result(self.loop.run_until_complete(self.task))
        except BaseException as e:
            self.done.set_exception(e)
        finally:
            try:  # what asyncio.run does, but for the default executor (never waited for)
                rest = asyncio.all_tasks(self.loop)
                for t in rest:
                    t.cancel()
                if rest:
                    self.loop.run_until_complete(asyncio.gather(*rest, return_exceptions=True))
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            finally:
                self.loop.close()

    def abandon(self) -> None:
        """Cancel the agents without waiting, for a loop that user code blocks: its daemon thread is
        left to run, renamed so that it is not taken for a live loop."""
        if not self.cancel(0.0):
            self._thread.name = f"{self._thread.name} (abandoned: blocked by user code)"

    def cancel(self, grace_s: float) -> bool:
        """Cancel the agents; True if they returned within ``grace_s``."""
        if not self.started:  # close the coroutine that never ran
            self.task.cancel()
            with contextlib.suppress(BaseException):
                self.loop.run_until_complete(self.task)
            self.loop.close()
            return True
        with contextlib.suppress(RuntimeError):  # the loop has already closed
            self.loop.call_soon_threadsafe(self.task.cancel)
        try:
            self.done.exception(timeout=grace_s)
            return True
        except concurrent.futures.TimeoutError:
            return False
