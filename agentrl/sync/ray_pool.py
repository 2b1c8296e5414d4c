"""A pool of Ray rollout workers as a weight receiver (``engines/base.py``: ``WeightReceiver``): the
bucketed update into every worker, under a lock that keeps episodes and generations off
half-updated weights, within ``timeouts.weight_sync_s``. Buckets travel through Ray's object store
(one safetensors blob per bucket) or, with ``rollout.sync.transport: broadcast``, by a collective
(``ray_broadcast.py``). ``RolloutPool`` (``rollout/ray_workers.py``) owns one and delegates to it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from agentrl.engines.base import Bucket
from agentrl.engines.vllm import safetensors_blob
from agentrl.sync.transports.broadcast import Answers, BroadcastGroup
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
        self._workers, self._answers, self._events = workers, answers, events
        self.version = 0
        self.lock = threading.Lock()  # held by a weight update (begin .. finish)
        self.behind: set[int] = set()
        """Replacement workers that could not copy the current weights: they run nothing until the
        next weight sync (which sends every weight the trainer changes) brings them up to date."""
        self._start = 0.0  # when the current weight update began
        self.broadcast = BroadcastGroup(timeout_s, cluster)
        """The weight-sync group with the workers, when ``transport`` is broadcast."""

    def begin(self) -> None:
        """Takes the lock until ``finish``: no shard or generation is submitted in between, so none
        runs on half-updated weights (an actor runs its calls in submission order)."""
        self.lock.acquire()
        self._start = time.monotonic()
        workers = self._workers()
        self._guarded(
            lambda: self._answers([w.begin_weight_update.remote() for w in workers], "begin_weight_update")
        )

    def load_bucket(self, bucket: Bucket) -> None:
        """With ``transport: broadcast``, ``BroadcastGroup.send``. Else ``ray.put`` the bucket once, as
        a safetensors blob, every worker copies it in place, and the ref is dropped: the sender and the
        object store hold about one bucket at a time. A blob rather than the tensors: measured, eight
        32 MiB buckets of tensors put and loaded this way grew the sender's heap by about 120 MiB,
        still growing at the eighth; blobs levelled off at about 65 MiB."""
        import ray

        workers = self._workers()
        bucket = [(n, self._wire(t)) for n, t in bucket]
        if self.transport == "cuda_ipc":
            self._guarded(lambda: self._ipc(workers, bucket))
            return
        if self.transport == "broadcast":
            self._guarded(
                lambda: self.broadcast.send(
                    workers, list(bucket), self.left, self._answers, self.setting(), self._events
                )
            )
            return

        def load() -> None:
            ref = ray.put(safetensors_blob(dict(bucket)))
            self._answers([w.load_weight_bucket.remote(ref) for w in workers], "load_weight_bucket")

        self._guarded(load)

    def _wire(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.dtype) if self.dtype is not None and t.is_floating_point() else t

    def _ipc(self, workers: list, bucket: list[tuple[str, torch.Tensor]]) -> None:
        """``transport: cuda_ipc``: the workers (on this process's GPU, ``placement.py``) open CUDA IPC
        handles to the bucket's tensors and copy from them; the tensors stay referenced here until every
        worker has answered. Run on an H200 (the GPU check, 2026-11-30: an HF engine's worker sharing the
        trainer's GPU, every sync verified)."""
        from agentrl.engines.vllm_worker import cuda_ipc_blob

        alive = [(n, t.contiguous()) for n, t in bucket]
        if not all(t.is_cuda for _, t in alive):
            raise ValueError(
                "rollout.sync.transport=cuda_ipc needs the trainer's weights on a GPU; these are on "
                f"{alive[0][1].device}: use rollout.sync.transport=object_store"
            )
        blob = cuda_ipc_blob(alive)
        self._answers([w.load_weight_bucket_ipc.remote(blob) for w in workers], "load_weight_bucket_ipc")
        del alive

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
