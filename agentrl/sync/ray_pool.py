"""A pool of Ray rollout workers as a weight receiver (``engines/base.py``: ``WeightReceiver``): the
bucketed update into every worker, under a lock that keeps episodes and generations off
half-updated weights, within ``timeouts.weight_sync_s``. Each bucket travels by the transport
``rollout.sync.transport`` names (``sync/transports/``; its trainer end is called here).
``RolloutPool`` (``rollout/ray_workers.py``) owns one and delegates to it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from agentrl.engines.base import Bucket
from agentrl.sync import registry
from agentrl.sync.transports.base import Answers, Link, Transport
from agentrl.timeouts import WaitTimeout


class PoolWeights:
    def __init__(
        self,
        transport: str,
        timeout_s: float,
        cluster: bool,
        workers: Callable[[], list],
        answers: Answers,
        events: list[str],
        dtype: torch.dtype | None = None,
    ) -> None:
        self.transport, self.timeout_s = transport, timeout_s
        self.dtype = dtype
        """The workers' engines' dtype: floating tensors travel in it (half the bytes for a bfloat16
        engine fed by a float32 trainer; the engine would cast them on arrival anyway)."""
        self._workers, self._answers = workers, answers
        self.version = 0
        self.lock = threading.Lock()  # held by a weight update (begin .. finish)
        self.behind: set[int] = set()
        """Replacement workers that could not copy the current weights: they run nothing until the
        next weight sync (which sends every weight the trainer changes) brings them up to date."""
        self._start = 0.0  # when the current weight update began
        self.link = Link(timeout_s, cluster, answers, self.left, self.setting, events)
        self._ends: dict[str, Transport] = {}  # the trainer's end of each transport used
        registry.transport_record(transport)  # an unknown name fails here, naming the choices

    def begin(self) -> None:
        """Takes the lock until ``finish``: no shard or generation is submitted in between, so none
        runs on half-updated weights (an actor runs its calls in submission order)."""
        self.lock.acquire()
        self._start = time.monotonic()
        workers = self._workers()
        self._guarded(
            lambda: self._answers([w.begin_weight_update.remote() for w in workers], "begin_weight_update")
        )

    def end(self, name: str | None = None) -> Transport:
        """The trainer's end of transport ``name`` (default: ``transport``), made at its first use."""
        name = name or self.transport
        if name not in self._ends:
            self._ends[name] = registry.make_transport(name)
        return self._ends[name]

    def load_bucket(self, bucket: Bucket) -> None:
        """One bucket, its floating tensors in the engines' dtype, into every worker by the transport."""
        workers = self._workers()
        wired = [(n, self._wire(t)) for n, t in bucket]
        self._guarded(lambda: self.end().send(self.link, workers, wired))

    def _wire(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.dtype) if self.dtype is not None and t.is_floating_point() else t

    def finish(self) -> int:
        try:
            version = self.version + 1
            self._answers(
                [w.finish_weight_update.remote(version) for w in self._workers()], "finish_weight_update"
            )
            self.version = version
            self.behind.clear()  # every worker, replacements too, took this sync
            return version
        finally:
            self.lock.release()

    def close(self) -> None:
        """Let go of what the transports' ends hold (the pool shuts down)."""
        for end in self._ends.values():
            end.close()

    def setting(self) -> str:
        return f"timeouts.weight_sync_s={self.timeout_s:g}s for the whole sync"

    def left(self, step: str) -> float:
        """Seconds left of the weight update's limit; ``WaitTimeout`` when none are."""
        waited = time.monotonic() - self._start
        if waited >= self.timeout_s:
            raise WaitTimeout(f"weight sync into the rollout workers: {step}", waited, self.setting())
        return self.timeout_s - waited

    def _guarded(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` inside an update: on an error the lock is released (the update is lost)."""
        try:
            return fn()
        except BaseException:
            self.lock.release()
            raise
