"""Asynchronous off-policy training (``trainer.mode: async``): rollouts keep running while the trainer
updates, and no episode trains more than ``rollout.max_staleness`` weight versions old.

::

    trainer   | take b0 | update 0 | push v1 | take b1 | update 1 | push v2 | take b2 | ...
    producer  | b0 (v0) ... | b1 (v0 → v1: partial) ........ | b2 (v1 → v2) .......... | ...
                 (K = 1: b1 is granted at the start and runs while step 0 updates)

**Batches.** A batch is what one sampling round of a sync step runs: ``prompts_per_step`` tasks ×
``group_size`` episodes, labelled (step, round) as the sync loop labels them, so it has the sync
loop's tasks, runner seed, episode seeds and episode ids. The trainer *grants* batches; a dispatcher
thread draws each granted batch's tasks from the task sampler in grant order and starts it in a
thread of its own (several batches run at once, sharing the engine); the trainer *takes* finished
batches in grant order (so every rank takes the same ones and a resume knows what was pending).

**Staleness.** The weight version v counts weight pushes; step t trains with the trainer's current
version. An episode's lag is v minus the version of its oldest policy token.

- ``on_stale: wait``: K + 1 round-0 batches are granted at the start (for steps 0..K), and the batch
  for step t + K + 1 when step t's weights are pushed (a step that needs another sampling round,
  with dynamic sampling, grants it at once). A batch is therefore started with weights at most K
  pushes behind the step that takes it: with K = 0 nothing runs during an update and the run is
  the sync loop's, step for step (tested).
- ``on_stale: drop``: a batch is granted as soon as the trainer takes one, so K + 1 batches are
  always queued or running and the engine never waits for weights; what ends up too stale is
  dropped.

In both, the trainer drops (and counts, ``offpolicy/stale_dropped``) every episode whose lag exceeds
K when it takes it: the bound is strict per episode whatever happened in between.

**Partial rollouts.** The trainer and the rollouts share the engine through an ``EngineGate``: an
engine call and a weight push never overlap, so each completion is sampled by one weight version
(stamped on its tokens), and an episode in flight when new weights arrive continues on them from
its next turn. Its tokens then carry two or more versions (``offpolicy/partial_frac``); the
truncated importance correction (``algorithm.is_correction: tis``) uses each token's own behaviour
log-prob. A pool of Ray workers needs no gate: an actor runs one call at a time, so a worker takes
new weights between its shards.

**Resume.** The checkpoint records the batches granted but not yet taken and the sampler's state
before the first of them; a resumed run grants them again in the same order, so their episodes
keep their ids: none is lost (those in flight at a kill are run again) and none is written twice.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.engines.base import Completion, Engine, SamplingParams
from agentrl.episode import Episode
from agentrl.parallel import ranks
from agentrl.rollout.runner import EpisodeRequest
from agentrl.timeouts import start_thread

Label = tuple[int, int]
"""A batch's (step, sampling round), as the sync loop numbers them."""


class PipelineTimeout(TimeoutError):
    """The trainer waited longer than ``timeouts.data_wait_s`` for a batch."""


class EngineGate:
    """The engine behind a lock: ``generate`` and a weight push (``hold``) never overlap.

    Forwards everything else to the engine. ``submit`` is hidden, so the async runner batches
    requests into ``generate`` calls (a request inside an engine's own scheduler could straddle a
    weight push)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._lock = threading.RLock()
        self._clock = threading.Lock()
        self.blocked_s = 0.0
        """Seconds ``generate`` calls waited for a weight push to finish (cumulative)."""

    @property
    def version(self) -> int:
        return self.engine.version

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[Completion]:
        t0 = time.perf_counter()
        with self._lock:
            waited = time.perf_counter() - t0
            with self._clock:
                self.blocked_s += waited
            return self.engine.generate(prompts, params)

    def load_weights(self, weights: Any) -> int:
        with self._lock:
            return self.engine.load_weights(weights)

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """No engine call runs inside this block (a weight sync of several calls)."""
        with self._lock:
            yield

    def __getattr__(self, name: str) -> Any:
        if name == "submit":
            raise AttributeError(name)
        return getattr(self.engine, name)


@dataclass
class _Batch:
    label: Label
    sampler_state: dict[str, int]
    """The task sampler's state before this batch drew its tasks."""
    tasks: list[Any] = field(default_factory=list)
    episodes: list[Episode] | None = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)
    started: float = 0.0


@dataclass
class TakeInfo:
    """What the trainer learns with a batch, for the step's metrics."""

    waited_s: float
    queued: int
    """Batches already finished and waiting when the trainer asked."""
    running: int
    """Batches still running then."""


class RolloutPipeline:
    """Grants, runs and hands over batches (see the module docstring).

    ``run_batch(label, tasks) -> episodes`` runs one batch's share on this rank (no collectives: it
    runs in a background thread); ``take`` gathers the ranks' shares on the calling (main) thread.
    """

    def __init__(
        self,
        sampler: Any,
        prompts_per_step: int,
        total_steps: int,
        max_staleness: int,
        on_stale: str,
        run_batch: Callable[[Label, list[Any]], list[Episode]],
        data_wait_s: float,
        start_step: int = 0,
        state: dict[str, Any] | None = None,
    ) -> None:
        self.sampler, self.per_step, self.total_steps = sampler, prompts_per_step, total_steps
        self.k, self.on_stale, self.run_batch, self.data_wait_s = (
            max_staleness,
            on_stale,
            run_batch,
            data_wait_s,
        )
        self._cv = threading.Condition()
        self._grants: deque[Label] = deque()  # granted, tasks not drawn yet
        self._batches: deque[_Batch] = deque()  # drawn, in grant order, not taken yet
        self._running = 0
        self._idle_since: float | None = time.perf_counter()
        self.engine_idle_s = 0.0
        """Seconds with no batch running while the trainer had not stopped (cumulative)."""
        self._closed = False
        if state is not None:  # a resume: the pending grants, in order, from the saved sampler state
            self.sampler.load(state["sampler"])
            self._grants.extend(tuple(g) for g in state["grants"])  # type: ignore[misc]
            self._next_step = int(state["next_step"])
        else:
            self._next_step = start_step
            with self._cv:
                for _ in range(self.k + 1):
                    self._grant_next_step()
        self._dispatcher = start_thread(self._dispatch, "agentrl-pipeline")

    # -- the trainer's side --------------------------------------------------------------------
    def take(self) -> tuple[list[Episode], Label, TakeInfo]:
        """The next batch in grant order, every rank's episodes (collective), waiting for it if
        needed; raises what the batch raised, or ``PipelineTimeout`` after ``data_wait_s``."""
        t0 = time.perf_counter()
        with self._cv:
            queued = sum(b.done.is_set() for b in self._batches)
            running = self._running
            if not self._batches and not self._grants:
                raise RuntimeError("the rollout pipeline has nothing granted: grant() a batch before take()")
            while not self._batches:  # granted, but the dispatcher has not drawn it yet
                self._cv.wait(timeout=0.1)
            batch = self._batches[0]
        if not batch.done.wait(self.data_wait_s):
            raise PipelineTimeout(
                f"the trainer waited {self.data_wait_s:g}s (timeouts.data_wait_s) for the rollouts of batch "
                f"step {batch.label[0]} round {batch.label[1]} (running for "
                f"{time.perf_counter() - batch.started:.0f}s, {running} batch(es) running): an engine or "
                "environment is stuck or far too slow"
            )
        with self._cv:
            self._batches.popleft()
            if self.on_stale == "drop":
                self._grant_next_step()
        if batch.error is not None:
            raise RuntimeError(f"the rollouts of batch {batch.label} failed") from batch.error
        assert batch.episodes is not None
        episodes = ranks.gather_episode_parts(batch.episodes)
        return episodes, batch.label, TakeInfo(time.perf_counter() - t0, queued, running)

    def grant_round(self, step: int, round_: int) -> None:
        """Dynamic sampling: step ``step`` needs sampling round ``round_``."""
        with self._cv:
            self._grants.append((step, round_))
            self._cv.notify_all()

    def step_done(self, step: int) -> None:
        """Step ``step``'s weights are pushed (``wait``: the next step's batch may start)."""
        if self.on_stale == "wait":
            with self._cv:
                self._grant_next_step()

    def state(self) -> dict[str, Any]:
        """What a checkpoint needs to grant the pending batches again (see the module docstring)."""
        with self._cv:
            pending = [b.label for b in self._batches] + list(self._grants)
            sampler = self._batches[0].sampler_state if self._batches else self.sampler.state()
            return {
                "sampler": dict(sampler),
                "grants": [list(g) for g in pending],
                "next_step": self._next_step,
            }

    def idle_s(self) -> float:
        with self._cv:
            extra = time.perf_counter() - self._idle_since if self._idle_since is not None else 0.0
            return self.engine_idle_s + extra

    def close(self, timeout: float = 600.0) -> None:
        """Stop granting and drawing; wait (up to ``timeout``) for the batches still running."""
        with self._cv:
            self._closed = True
            self._grants.clear()
            self._cv.notify_all()
            deadline = time.perf_counter() + timeout
            while self._running and time.perf_counter() < deadline:
                self._cv.wait(timeout=0.1)
        self._dispatcher.join(timeout=5)

    # -- the producer's side -------------------------------------------------------------------
    def _grant_next_step(self) -> None:  # holding _cv
        if self._next_step < self.total_steps:
            self._grants.append((self._next_step, 0))
            self._next_step += 1
            self._cv.notify_all()

    def _dispatch(self) -> None:
        while True:
            with self._cv:
                while not self._grants and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                label = self._grants.popleft()
                batch = _Batch(label, dict(self.sampler.state()))
                batch.tasks = self.sampler.next(self.per_step)
                batch.started = time.perf_counter()
                self._batches.append(batch)
                if self._running == 0 and self._idle_since is not None:
                    self.engine_idle_s += batch.started - self._idle_since
                    self._idle_since = None
                self._running += 1
                self._cv.notify_all()
            start_thread(self._run, f"agentrl-batch-{label}", args=(batch,))

    def _run(self, batch: _Batch) -> None:
        try:
            batch.episodes = self.run_batch(batch.label, batch.tasks)
        except BaseException as e:  # handed to the trainer by take()
            batch.error = e
        finally:
            with self._cv:
                self._running -= 1
                if self._running == 0:
                    self._idle_since = time.perf_counter()
                self._cv.notify_all()
            batch.done.set()


def batch_requests(label: Label, tasks: Sequence[Any], group_size: int) -> list[EpisodeRequest]:
    """The episode requests of a batch, seeded and named exactly as the sync loop does."""
    step, r = label
    return [
        EpisodeRequest(
            task,
            seed=i * group_size + j,
            group=f"s{step}r{r}t{i}",
            episode_id=f"s{step}-r{r}-t{i}-g{j}",
        )
        for i, task in enumerate(tasks)
        for j in range(group_size)
    ]
