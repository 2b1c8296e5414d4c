"""The colocated engine's sleep/wake cycle (``rollout.colocate.sleep``; docs/scaling.md).

An engine on the trainer's GPUs holds its weights and a KV cache for the whole run, memory the
trainer's update needs. With sleep mode (vLLM on a GPU) every step runs these phases in this order,
never two at once:

    generate ─► sleep ─► update ─► wake weights ─► sync ─► wake KV cache ─► generate ─► ...

- generate: the rollouts; the engine is awake (``VLLMEngine`` refuses requests while asleep).
- sleep: the engine discards its KV cache; ``sleep_level`` 1 moves its weights to host memory,
  level 2 discards them too.
- update: the learner's optimizer steps, in the freed memory.
- wake weights: the engine takes its weight memory back (level 1: restored from host memory;
  level 2: allocated, contents undefined until the sync).
- sync: the trainer pushes the new weights (all of them: level 2 has nothing else).
- wake KV cache: the engine takes its cache memory back; generation may start again.

Waking the weights before the cache keeps the sync's peak at the weights plus its own buffers.
Before each wake the blocks torch's caching allocator holds but does not use are handed back to the
driver (``release_cached_memory``): vLLM's wake maps physical memory directly (``cuMemCreate``), so
the memory the update grew torch's cache into is free for it only once torch lets go of it (TRL's
colocate mode empties the cache before every wake for the same reason).

Bounds. The engine's phases (sleep and the two wakes) each run under ``timeouts.sleep_wake_s`` and
raise ``WaitTimeout`` naming the phase and the wait; the stuck call is abandoned (``agentrl.timeouts``).
The trainer's phases (update, sync) run in the caller's thread, bounded by their own settings
(``timeouts.collective_s`` for the update's collectives, ``timeouts.weight_sync_s`` for the sync): an
update may rightly take longer than any sleep or wake, and CUDA streams and NCCL groups belong to the
thread that made them. A phase called out of order raises; so does one started while another runs. A
phase that fails leaves the engine's memory in an unknown state: the cycle is then broken and every
later phase raises, naming the phase that failed.
"""

from __future__ import annotations

import gc
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

import torch

from agentrl.timeouts import call_with_timeout

T = TypeVar("T")

CYCLE = ("generate", "sleep", "update", "wake_weights", "sync", "wake_kv_cache")
"""The phases, in order; after ``wake_kv_cache`` comes ``generate`` again."""


class SleepingEngine(Protocol):
    """What the cycle needs of an engine, named as vLLM names it (``VLLMEngine``)."""

    def sleep(self, level: int) -> None: ...

    def wake_up(self, tags: Sequence[str] | None = None) -> Any: ...


class SleepWakeCycle:
    """The phases of one engine (module docstring). Starts in ``generate``: a new engine is awake."""

    def __init__(self, engine: SleepingEngine, level: int = 1, timeout_s: float = 300.0) -> None:
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, not {level!r}")
        self.engine, self.level, self.timeout_s = engine, level, timeout_s
        self.phase = "generate"
        """The phase running now, or the last one that finished."""
        self.history: list[tuple[str, float, float]] = []
        """(phase, start, end) on ``time.monotonic()`` of the last 60 finished phases (``generate`` is
        the runner's, not recorded here)."""
        self._running = False
        self._broken: str | None = None
        self._guard = threading.Lock()

    def around_update(
        self, update: Callable[[], dict[str, float]], sync: Callable[[], dict[str, float]]
    ) -> dict[str, float]:
        """One cycle from ``generate`` back to it: the engine sleeps, ``update()`` runs, the weights
        wake, ``sync()`` pushes them, the KV cache wakes. Returns both calls' metrics and the time of
        each engine phase."""
        self.sleep()
        metrics = self.update(update)
        self.wake_weights()
        metrics.update(self.sync(sync))
        self.wake_kv_cache()
        for phase, start, end in self.history[-5:]:  # this cycle's five phases
            if phase not in ("update", "sync"):  # the trainer times those itself
                metrics[f"time/engine_{phase}_s"] = end - start
        return metrics

    def sleep(self) -> None:
        self._phase("sleep", lambda: self.engine.sleep(self.level), bounded=True)

    def update(self, fn: Callable[[], T]) -> T:
        return self._phase("update", fn, bounded=False)

    def wake_weights(self) -> None:
        self._phase("wake_weights", lambda: self._wake("weights"), bounded=True)

    def sync(self, fn: Callable[[], T]) -> T:
        return self._phase("sync", fn, bounded=False)

    def wake_kv_cache(self) -> None:
        self._phase("wake_kv_cache", lambda: self._wake("kv_cache"), bounded=True)

    def _wake(self, tag: str) -> Any:
        release_cached_memory()
        return self.engine.wake_up([tag])

    def _phase(self, name: str, fn: Callable[[], T], bounded: bool) -> T:
        self._enter(name)
        t0 = time.monotonic()
        try:
            if bounded:
                what = f"colocated engine {type(self.engine).__name__}: phase '{name}'"
                if name == "sleep":
                    what += f" (level {self.level})"
                out = call_with_timeout(
                    fn, self.timeout_s, what, f"timeouts.sleep_wake_s={self.timeout_s:g}s"
                )
            else:
                out = fn()
        except BaseException as e:
            self._broken = (
                f"phase '{name}' failed after {time.monotonic() - t0:.1f}s: {type(e).__name__}: {e}"
            )
            raise
        finally:
            with self._guard:
                self._running = False
        self.history = [*self.history[-59:], (name, t0, time.monotonic())]
        if name == "wake_kv_cache":
            self.phase = "generate"
        return out

    def _enter(self, name: str) -> None:
        with self._guard:
            if self._broken:
                raise RuntimeError(
                    f"sleep/wake cycle: '{name}' refused, the cycle is broken ({self._broken}); the "
                    "engine's memory state is unknown: restart the run"
                )
            if self._running:
                raise RuntimeError(f"sleep/wake cycle: '{name}' started while '{self.phase}' is running")
            expected = CYCLE[(CYCLE.index(self.phase) + 1) % len(CYCLE)]
            if name != expected:
                raise RuntimeError(
                    f"sleep/wake cycle: '{name}' called out of order: after '{self.phase}' comes "
                    f"'{expected}' (order: {' -> '.join(CYCLE)})"
                )
            self.phase, self._running = name, True


def release_cached_memory() -> None:
    """Hand the CUDA memory torch's caching allocator keeps but no tensor uses back to the driver
    (garbage first: a tensor kept alive only by a reference cycle still holds its block)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        gc.collect()
        torch.cuda.empty_cache()


_CYCLES: weakref.WeakKeyDictionary[Any, SleepWakeCycle] = weakref.WeakKeyDictionary()


def cycle_for(engine: Any, level: int, timeout_s: float) -> SleepWakeCycle:
    """The one cycle of ``engine`` (made on first use with sleep ``level``, ``rollout.colocate.sleep_level``,
    and ``timeout_s``, ``timeouts.sleep_wake_s``): its phase carries over from step to step."""
    if engine not in _CYCLES:
        if not (callable(getattr(engine, "sleep", None)) and callable(getattr(engine, "wake_up", None))):
            raise TypeError(
                f"rollout.colocate.sleep: the engine {type(engine).__name__} has no sleep mode (sleep/wake_up); "
                "it needs rollout.engine=vllm on a GPU, in the trainer's process (rollout.workers=0)"
            )
        _CYCLES[engine] = SleepWakeCycle(engine, level, timeout_s)
    return _CYCLES[engine]
