"""Asynchronous multi-turn rollouts: an episode waiting on a tool never stalls the others.

``EpisodeRunner`` advances all episodes in lock step: a round's generation waits for every episode's
environment step, so one slow tool (a sandbox run, a web call) holds the whole batch. Here each
episode runs in its own thread and issues its next generation request as soon as its observation is
ready; a ``RequestBatcher`` gathers whatever requests are pending and generates them together
(continuous batching for engines that take a list of prompts, like ``HFEngine``). Engines with their
own scheduler expose ``submit(prompt, params) -> Future`` and are used directly.

The episode semantics (segments, roles, budgets, stop reasons, failures, rewards, per-turn seeds) are
``EpisodeRunner``'s: this module reuses its per-episode steps and only replaces the loop. With a seeded
``SamplingParams`` the two runners produce the same episodes.

Bounds: at most ``max_concurrent_episodes`` episodes are in flight; each in-flight episode owns one
environment (and so at most one sandbox session, created in ``reset`` and closed when the episode
ends), so the same number bounds the open sandbox sessions. A generation request with no answer in
``request_timeout_s`` fails its episode at the ``model`` boundary (``EpisodeRunner``'s rule).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from agentrl.engines.base import Completion, Engine, SamplingParams
from agentrl.env import Environment
from agentrl.episode import Episode
from agentrl.rollout.runner import EpisodeRequest, EpisodeRunner, LiveEpisode, RunnerSettings
from agentrl.timeouts import DaemonThreadPool, WaitTimeout, start_thread, wait_for

_STOP = object()


class RequestBatcher:
    """Continuous batching in front of a list-taking engine.

    Callers ``submit`` one prompt and get a future. A background thread takes the first pending
    request, then keeps gathering until ``ready()`` requests are pending (everyone who could ask has
    asked), ``max_batch`` is reached, or ``max_wait_s`` has passed, and runs the gathered requests in
    one ``engine.generate`` call. Requests that arrive during a call form the next batch.
    """

    def __init__(
        self,
        engine: Engine,
        max_batch: int = 256,
        max_wait_s: float = 0.005,
        ready: Callable[[], int] | None = None,
        max_gather_s: float | None = None,
        lazy: bool = False,
        timeout_s: float | None = None,
    ) -> None:
        self.engine, self.max_batch, self.max_wait_s = engine, max_batch, max_wait_s
        self.max_gather_s = max_gather_s
        """With it, every arrival extends the wait by ``max_wait_s``, up to ``max_gather_s`` from the
        first request: for callers whose requests trickle in (agents behind the endpoint, each spending
        a few milliseconds of Python between turns), so one slow arrival does not split the batch.
        ``lazy``: no thread until a request arrives that no ``drive`` call is serving."""
        self.timeout_s = timeout_s
        """With it, an engine that can bound its own calls (``HFEngine.bounded``) stops a call past
        ``timeout_s`` and that call's requests fail with the ``WaitTimeout``: so no single call holds
        a thread that drives (``timeouts.engine_request_s``)."""
        self.ready = ready or (lambda: max_batch)
        self.batch_sizes: list[int] = []
        """Size of every engine call, for tests and benchmarks."""
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._driven = False
        self._stopped: Exception | None = None
        self._start_lock = threading.Lock()
        if not lazy:
            self._start_thread()

    def _start_thread(self) -> None:
        with self._start_lock:
            if self._thread is None and not self._driven:  # never two loops calling the engine
                self._thread = start_thread(self._loop, "agentrl-batcher")

    def drive(
        self, until: Callable[[], bool], start: Callable[[], None] | None = None, poll_s: float = 0.002
    ) -> None:
        """Run the batching loop in the calling thread until ``until()`` (checked between batches).

        For in-process torch engines: generation then runs in the thread that trains (or loaded
        the model), not in a second thread whose OpenMP team would compete with that thread's for
        the same cores. Requests submitted while no thread drives start the batcher's own thread.
        ``start`` is called once this thread serves (start the work that will submit there)."""
        with self._start_lock:
            if self._thread is not None:  # already served by the thread: just wait
                own = False
            else:
                self._driven = own = True
        batch: list[tuple] = []  # taken off the queue and not yet answered
        interrupted = False
        try:
            if start is not None:
                start()
            while own and not until():
                try:
                    batch.append(self._queue.get(timeout=poll_s))
                except queue.Empty:
                    continue
                if batch[0] is _STOP:
                    return
                self._gather(batch)
                self._generate(batch)
                batch = []
            while not own and not until():
                time.sleep(poll_s)
        except BaseException as e:  # Ctrl-C: nobody is left to generate what was asked for
            interrupted = True
            if own:
                error = RuntimeError(f"generation stopped: the run was interrupted ({type(e).__name__})")
                for item in batch:
                    if item is not _STOP and not item[2].done():
                        item[2].set_exception(error)
                self.stop(error)
            raise
        finally:
            if own:
                with self._start_lock:
                    self._driven = False
                if not interrupted and not self._queue.empty():  # stragglers (an agent outliving
                    self._start_thread()  # its episode): the batcher's own thread serves them

    def submit(self, prompt: Sequence[int], params: SamplingParams) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        if self._stopped is not None:  # the run was interrupted: nothing more is generated for it
            fut.set_exception(self._stopped)
            return fut
        self._queue.put((list(prompt), params, fut))
        if self._thread is None and not self._driven:
            self._start_thread()
        return fut

    def stop(self, error: Exception) -> None:
        """The run is stopping (Ctrl-C): fail every queued request with ``error`` (their callers must
        not wait out their timeouts), and every request submitted from now on, until ``resume``."""
        self._stopped = error
        items = []
        while True:
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                break
        for item in items:
            if item is not _STOP and not item[2].done():
                item[2].set_exception(error)
        if _STOP in items:  # keep the thread's stop signal for the thread
            self._queue.put(_STOP)

    def resume(self) -> None:
        """Accept requests again after ``stop`` (a runner that serves another run)."""
        self._stopped = None

    def close(self, wait: bool = True) -> None:
        """Stop the thread after the current engine call; ``wait=False`` does not wait for that call
        (the runner's choice when a call was abandoned as stuck: waiting would hang with it)."""
        self._queue.put(_STOP)
        if wait and self._thread is not None:
            self._thread.join(timeout=30)

    def _gather(self, batch: list[tuple]) -> bool:
        """Add pending requests to ``batch`` (which holds the first); True if the stop signal came."""
        stop = False
        start = time.perf_counter()
        deadline = start + self.max_wait_s
        while len(batch) < self.max_batch:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                left = deadline - time.perf_counter()
                if len(batch) >= self.ready() or left <= 0:
                    break
                try:
                    item = self._queue.get(timeout=min(left, 0.0005))
                except queue.Empty:
                    continue
            if item is _STOP:
                stop = True
                break
            batch.append(item)
            if self.max_gather_s is not None:
                deadline = min(time.perf_counter() + self.max_wait_s, start + self.max_gather_s)
        return stop

    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is _STOP:
                return
            batch = [first]
            stop = self._gather(batch)
            self._generate(batch)
            if stop:
                return

    def _generate(self, batch: list[tuple]) -> None:
        try:
            self.batch_sizes.append(len(batch))
            bounded = getattr(self.engine, "bounded", None)
            limit: contextlib.AbstractContextManager = contextlib.nullcontext()
            if self.timeout_s is not None and bounded is not None:
                what = f"engine {type(self.engine).__name__}: generate for {len(batch)} requests"
                limit = bounded(self.timeout_s, what, f"timeouts.engine_request_s={self.timeout_s:g}s")
            with limit:
                outs = self.engine.generate([b[0] for b in batch], [b[1] for b in batch])
            for (_, _, fut), out in zip(batch, outs):
                fut.set_result(out)
        except BaseException as e:  # the episodes record it as a model failure
            error = (
                e
                if isinstance(e, Exception)
                else RuntimeError(f"generation interrupted ({type(e).__name__})")
            )
            for _, _, fut in batch:
                if not fut.done():
                    fut.set_exception(error)
            if error is not e:  # Ctrl-C in the thread that drives: it stops the run
                raise


class AsyncEpisodeRunner(EpisodeRunner):
    """``EpisodeRunner`` with one thread per in-flight episode and continuous batching.

    Drop-in: same constructor (plus the batcher's wait) and ``run``; at most
    ``settings.max_concurrent_episodes`` episodes in flight.
    """

    env_threads = 1  # each episode's thread makes its own environment calls

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        env_factory: Callable[[], Environment],
        settings: RunnerSettings | None = None,
        *,
        max_wait_s: float = 0.005,
    ) -> None:
        super().__init__(engine, tokenizer, env_factory, settings)
        self._abandoned = False  # a request of this run timed out: the engine may still be stuck in it
        self.max_concurrent_episodes = self.settings.max_concurrent_episodes
        self.max_wait_s = max_wait_s
        self.batch_sizes: list[int] = []
        """Engine call sizes of the last ``run`` (empty for engines with their own scheduler)."""
        self._stopping = False  # the run was interrupted: episodes stop after their current step
        self._lock = threading.Lock()
        self._live = 0  # episodes between start and finish
        self._busy = 0  # of those, the ones in an environment step (not about to generate)

    def run(self, requests: Sequence[EpisodeRequest]) -> list[Episode]:
        submit = getattr(self.engine, "submit", None)
        batcher = None
        # An in-process engine (HFEngine) generates in this thread (RequestBatcher.drive), bounded by
        # the request timeout, not in a batcher thread whose OpenMP team would compete with this
        # thread's for the cores.
        drive = submit is None and hasattr(self.engine, "bounded")
        if submit is None:
            batcher = RequestBatcher(
                self.engine,
                self.max_concurrent_episodes,
                self.max_wait_s,
                ready=self._ready,
                lazy=drive,
                timeout_s=self.request_timeout_s if drive else None,
            )
            submit = batcher.submit
        n_threads = max(1, min(self.max_concurrent_episodes, len(requests)))
        self._abandoned = self._stopping = False
        try:
            with DaemonThreadPool(n_threads, "agentrl-ep") as pool:  # episodes run user code
                futures: list[concurrent.futures.Future] = []

                def start() -> None:
                    futures.extend(pool.submit(self._run_episode, r, submit) for r in requests)

                try:
                    if drive:
                        assert batcher is not None
                        batcher.drive(until=lambda: all(f.done() for f in futures), start=start)
                    else:
                        start()
                    return [f.result() for f in futures]
                except BaseException:  # Ctrl-C: stop now, not when every episode has ended
                    self._stopping = True  # episodes end after their current step, unscored
                    pool.shutdown(wait=False, cancel_futures=True)  # and none starts
                    if batcher is not None:
                        batcher.stop(RuntimeError("the run was interrupted"))
                    raise
        finally:
            self._bounded_calls.close()  # the episode threads' helpers (environment calls)
            if batcher is not None:
                batcher.close(wait=not self._abandoned)
                self.batch_sizes = batcher.batch_sizes

    def _ready(self) -> int:
        """How many episodes could be waiting for generation right now."""
        with self._lock:
            return max(1, self._live - self._busy)

    def _count(self, live: int = 0, busy: int = 0) -> None:
        with self._lock:
            self._live += live
            self._busy += busy

    def _run_episode(self, req: EpisodeRequest, submit: Callable) -> Episode:
        self._count(live=1, busy=1)
        try:
            lv = self._start(req)
            self._count(busy=-1)
            while not lv.done:
                if self._stopping:
                    self._fail(lv, "model", RuntimeError("the run was interrupted"))
                    break
                comp = self._generate_one(lv, submit)
                if comp is None:
                    break
                self._append_policy(lv, comp)
                if lv.done:
                    break
                if not self._steps(lv):  # a summary (rollout.context): the next turn, no step
                    continue
                if self._stopping:  # a reply that was generating when the run stopped: no step
                    self._fail(lv, "model", RuntimeError("the run was interrupted"))
                    break
                self._count(busy=1)
                try:
                    result = self._safe_step(lv)
                    if result is not None:
                        self._after_step(lv, result)
                finally:
                    self._count(busy=-1)
            self._count(busy=1)
            return self._finish(lv)
        finally:
            self._count(live=-1, busy=-1)

    def _generate_one(self, lv: LiveEpisode, submit: Callable) -> Completion | None:
        what = f"engine {type(self.engine).__name__}: generate for episode {lv.episode.id} (turn {lv.turn})"
        try:
            fut = submit(lv.episode.context_ids(), self._sampling_for(lv))
            return wait_for(
                fut,
                self.request_timeout_s,
                what,
                f"timeouts.engine_request_s={self.request_timeout_s:g}s",
                note="; the request is abandoned (the engine may still run it)",
            )
        except Exception as e:
            self._abandoned |= isinstance(e, WaitTimeout)
            self._fail(lv, "model", e)
            return None
