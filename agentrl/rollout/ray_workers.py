"""Ray rollout workers: environments, sandboxes and a generation engine in each of N Ray actors.

``rollout.workers: N`` makes ``build.build_engine`` return a ``RolloutPool`` instead of an in-process
engine. The pool starts N ``RolloutWorker`` actors (on a local loopback Ray, or on the cluster at
``rollout.ray_address``); each loads the policy, builds its own engine (``rollout.engine``: HF or vLLM)
and runs episodes with the same runner an in-process run uses. The trainer sees the same interface:
a weight sync (``weight_sync.py``) puts each bucket in Ray's object store once, every worker copies it
in place, and the ref is dropped (the sender and the store hold one bucket at a time); the pool holds
a lock from the first bucket to the last, and no shard or generation is submitted meanwhile, so none
runs on half-updated weights (``rollout.sync.transport: broadcast`` sends the buckets by a collective
broadcast instead: ``weight_group.py``, ``RolloutPool._broadcast_bucket``); ``fingerprint`` asks every
worker; ``version`` is the weight version; ``build.build_runner`` returns a ``RayEpisodeRunner`` that
splits a step's episodes across the workers.

Faults: a worker that dies (its process crashed, its node was lost) fails the call running on it with
a ``RayActorError``. Its episodes are resubmitted to a live worker, up to ``max_retries`` times (the
same seeds, so a retried episode is the one that would have run); episodes that still cannot run are
returned as failed episodes with ``Failure("worker", ...)`` naming the worker and the error, and the
step goes on. Dead workers are replaced before the next run; a replacement copies the current weights
from a live worker, bucket by bucket through the object store (an HF engine's; a vLLM worker cannot
hand its weights out, and neither can a pool whose every worker died: both raise).

Timeouts (``timeouts.ray_call_s``, the pool's ``call_timeout_s``): a worker that does not answer a call
in this long (a shard of episodes, a generation, a start, a ping) is killed with ``ray.kill`` and
treated as dead: its shard is retried elsewhere or its episodes fail naming the worker, the call and
the wait; a stuck ``generate`` raises ``WaitTimeout``; a pool whose workers do not start raises.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from agentrl.config import Config
from agentrl.engines.base import Bucket, Completion, Fingerprint, SamplingParams, Weights, weight_items
from agentrl.engines.hf import HFEngine
from agentrl.engines.vllm import safetensors_blob
from agentrl.episode import Episode
from agentrl.errors import Failure
from agentrl.rollout import components
from agentrl.rollout.runner import EpisodeRequest
from agentrl.timeouts import WaitTimeout, wait_for

LOOPBACK = "127.0.0.1"


def init_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Join the cluster at ``address`` (``auto``, ``ray://host:port``) or start a local Ray bound to
    loopback only. A no-op when Ray is already initialised (e.g. by the user's driver script)."""
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    if address:
        ray.init(address=address, log_to_driver=True)
    else:
        ray.init(
            num_cpus=num_cpus or os.cpu_count(),
            include_dashboard=False,
            _node_ip_address=LOOPBACK,
            log_to_driver=True,
        )


def worker_config(cfg: Config) -> Config:
    """The config a worker runs with: the same run, rollouts in-process (no nested workers), and no
    token-weighting settings (rollouts never read them, and a method registered in a module the
    worker cannot import would make the whole config fail to unpickle there)."""
    return dataclasses.replace(
        cfg,
        rollout=dataclasses.replace(cfg.rollout, workers=0),
        algorithm=dataclasses.replace(cfg.algorithm, settings={}),
    )


class RolloutWorker:
    """One Ray actor's state: policy weights in an engine, an environment factory, a tokenizer.
    Plain class so it can also be used (and tested) without Ray."""

    def __init__(self, cfg: Config, model_path: str) -> None:
        self.cfg = worker_config(cfg)
        model, self.tokenizer = components.load_model(self.cfg, model_path)
        self.engine = components.local_engine(self.cfg, model, self.tokenizer, model_path)
        del model  # the engine holds its own copy
        self._group: Any = None
        """This worker's member of the weight-sync group (``rollout.sync.transport: broadcast``)."""
        self._group_device, self._group_timeout_s = torch.device("cpu"), 0.0

    def pid(self) -> int:
        return os.getpid()

    def version(self) -> int:
        return int(self.engine.version)

    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> int:
        """Copy the weights in place and take the trainer's version number, so every worker stamps
        its tokens with the same version."""
        self.engine.load_weights(state_dict)
        while self.engine.version < version:  # engines count their own loads; align with the pool
            self.engine.load_weights({})
        return int(self.engine.version)

    def begin_weight_update(self) -> None:
        self.engine.begin_weight_update()  # type: ignore[attr-defined]

    def load_weight_bucket(self, blob: bytes) -> int:
        """One bucket (a safetensors blob Ray has fetched from the object store) copied in place;
        returns how many tensors."""
        from safetensors.torch import load

        bucket = load(blob)
        self.engine.load_weight_bucket(bucket.items())  # type: ignore[attr-defined]
        return len(bucket)

    def join_weight_group(
        self, host: str, port: int, rank: int, size: int, device_type: str, timeout_s: float
    ) -> int:
        """Join the trainer's weight-sync group (``weight_group.py``) as ``rank``, leaving the one
        this worker was in; the tensors arrive on the CPU (gloo) or this process's GPU (NCCL)."""
        from agentrl.sync import weight_group

        self.leave_weight_group()
        device = (
            torch.device("cuda", torch.cuda.current_device())
            if device_type == "cuda"
            else torch.device("cpu")
        )
        store = weight_group.client_store(host, port, rank, timeout_s)
        self._group = weight_group.make_group(store, rank, size, device, timeout_s)
        self._group_device, self._group_timeout_s = device, timeout_s
        return rank

    def leave_weight_group(self) -> None:
        from agentrl.sync import weight_group

        if self._group is not None:
            weight_group.leave(self._group)
            self._group = None

    def receive_weight_bucket(self, spec: list[tuple[str, tuple[int, ...], str]]) -> int:
        """One bucket broadcast by the trainer (laid out as ``spec``) copied in place; returns how
        many tensors. The trainer starts this call before it broadcasts."""
        from agentrl.sync import weight_group

        if self._group is None:
            raise RuntimeError("this worker is in no weight-sync group: the trainer did not join it")
        bucket = weight_group.receive_bucket(self._group, spec, self._group_device, self._group_timeout_s)
        self.engine.load_weight_bucket(bucket)  # type: ignore[attr-defined]
        return len(bucket)

    def finish_weight_update(self, version: int) -> int:
        """The update is complete: take the pool's version (as ``load_weights`` does)."""
        self.engine.finish_weight_update()  # type: ignore[attr-defined]
        while self.engine.version < version:
            self.engine.load_weights({})
        return int(self.engine.version)

    def weight_sizes(self) -> list[tuple[str, int]]:
        """(name, bytes) of the engine's weights, for a replacement worker to copy them in buckets.
        Only an HF engine can hand its weights out (a vLLM engine keeps kernel layouts)."""
        return [(n, t.numel() * t.element_size()) for n, t in self._own_weights().items()]

    def weight_bucket(self, names: Sequence[str]) -> bytes:
        own = self._own_weights()
        return safetensors_blob({n: own[n] for n in names})

    def _own_weights(self) -> dict[str, torch.Tensor]:
        if not isinstance(self.engine, HFEngine):
            raise NotImplementedError(
                f"a {type(self.engine).__name__} cannot hand its weights to a replacement worker "
                "(only the HF engine can): with rollout.engine=vllm a replaced worker cannot be brought "
                "up to date before the next weight sync"
            )
        return self.engine.model.state_dict()

    def fingerprint(self, names: Sequence[str], probe_ids: Sequence[int]) -> list[Fingerprint]:
        return [
            dataclasses.replace(fp, source=f"pid {os.getpid()}: {fp.source}")
            for fp in self.engine.fingerprint(names, probe_ids)  # type: ignore[attr-defined]
        ]

    def run(self, requests: Sequence[EpisodeRequest], seed: int | None, temperature: float | None) -> list:
        runner = components.local_runner(self.cfg, self.engine, self.tokenizer, seed, temperature)
        try:
            return runner.run(requests)
        finally:
            runner.close()

    def generate(self, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams]) -> list:
        return self.engine.generate(prompts, params)


class RolloutPool:
    """N ``RolloutWorker`` actors behind the Engine protocol (``version``, ``load_weights``,
    ``generate``) plus ``run_episodes`` for whole episodes."""

    def __init__(
        self, cfg: Config, model_path: str, workers: int, address: str | None = None, max_retries: int = 1
    ) -> None:
        import ray

        init_ray(address, num_cpus=None if address else max(os.cpu_count() or 1, workers))
        self.cfg, self.model_path, self.max_retries = cfg, model_path, max_retries
        self.call_timeout_s = cfg.timeouts.ray_call_s
        """How long any call to a worker may go unanswered before the worker counts as dead."""
        self._actor_cls = ray.remote(num_cpus=1, max_restarts=0)(RolloutWorker)
        self.workers = [self._spawn() for _ in range(workers)]
        late, _ = self._ping(list(range(workers)))  # wait until all have loaded the policy
        if late:
            self.shutdown()
            raise WaitTimeout(
                f"rollout workers {late} loading the policy {model_path}",
                self.call_timeout_s,
                self._setting(),
                note="; stopped the pool",
            )
        ray.get([w.pid.remote() for w in self.workers])  # raises a worker's start error, if one failed
        self._version = 0
        self._weights_lock = threading.Lock()  # held by a weight update (begin_weight_update)
        self._behind: set[int] = set()
        """Replacement workers that could not copy the current weights: they run nothing until the
        next weight sync (which sends every weight the trainer changes) brings them up to date."""
        self.events: list[str] = []
        """Worker deaths, retries and replacements, for logs and tests."""
        self.transport = cfg.rollout.sync.transport
        self.sync_timeout_s = cfg.timeouts.weight_sync_s
        self._sync_start = 0.0  # when the current weight update began
        self._group: Any = None
        """This process's member (rank 0) of the weight-sync group, when ``transport`` is broadcast."""
        self._group_members: list[Any] = []  # the workers it was built with: ranks 1..N
        self._group_device = torch.device("cpu")

    @classmethod
    def from_config(cls, cfg: Config, path: str) -> RolloutPool:
        return cls(cfg, path, cfg.rollout.workers, cfg.rollout.ray_address)

    def _spawn(self) -> Any:
        return self._actor_cls.remote(worker_config(self.cfg), self.model_path)

    def _setting(self) -> str:
        return f"timeouts.ray_call_s={self.call_timeout_s:g}s"

    def _ping(self, indices: list[int]) -> tuple[list[int], list[int]]:
        """Of workers ``indices``: those that do not answer a ping within ``call_timeout_s``, and the
        dead ones (they answer at once, with an error)."""
        import ray
        from ray.exceptions import RayActorError

        pings = [self.workers[i].pid.remote() for i in indices]
        done, _ = ray.wait(pings, num_returns=len(pings), timeout=self.call_timeout_s)
        answered, dead = set(done), []
        for i, p in zip(indices, pings):
            try:
                if p in answered:
                    ray.get(p)
            except RayActorError:
                dead.append(i)
        return [i for i, p in zip(indices, pings) if p not in answered], dead

    @property
    def version(self) -> int:
        return self._version

    def load_weights(self, weights: Weights) -> int:
        """All of ``weights`` as one bucket (the trainer's sync sends several: ``weight_sync.py``)."""
        self.begin_weight_update()
        self.load_weight_bucket(weight_items(weights))
        return self.finish_weight_update()

    # -- the bucketed sync (engines/base.py: WeightReceiver) --------------------------------------
    def begin_weight_update(self) -> None:
        """Takes the pool's weights lock until ``finish_weight_update``: no shard or generation is
        submitted in between, so none runs on half-updated weights (an actor runs its calls in
        submission order)."""
        self._weights_lock.acquire()
        self._sync_start = time.monotonic()
        self._guarded(
            lambda: self._answers(
                [w.begin_weight_update.remote() for w in self.workers], "begin_weight_update"
            )
        )

    def load_weight_bucket(self, bucket: Bucket) -> None:
        """With ``transport: broadcast``, ``_broadcast_bucket``. Else ``ray.put`` the bucket once, as a
        safetensors blob, every worker copies it in place, and the ref is dropped: the sender and the
        object store hold about one bucket at a time. A blob rather than the tensors: measured, eight
        32 MiB buckets of tensors put and loaded this way grew the sender's heap by about 120 MiB,
        still growing at the eighth; blobs levelled off at about 65 MiB."""
        import ray

        if self.transport == "broadcast":
            self._guarded(lambda: self._broadcast_bucket(list(bucket)))
            return

        def load() -> None:
            ref = ray.put(safetensors_blob(dict(bucket)))
            self._answers([w.load_weight_bucket.remote(ref) for w in self.workers], "load_weight_bucket")

        self._guarded(load)

    def finish_weight_update(self) -> int:
        try:
            version = self._version + 1
            self._answers(
                [w.finish_weight_update.remote(version) for w in self.workers], "finish_weight_update"
            )
            self._version = version
            self._behind.clear()  # every worker, replacements too, took this sync
            return version
        finally:
            self._weights_lock.release()

    def _broadcast_bucket(self, bucket: list[tuple[str, torch.Tensor]]) -> None:
        """The bucket's layout goes to every worker with the Ray call that starts its receive, then
        this process broadcasts the tensors (``weight_group.send_bucket``). The workers are idle when
        the calls arrive (``begin_weight_update`` waited for everything submitted before it, and
        nothing is submitted under the lock), so each is in the collective while this process sends;
        all within what is left of ``timeouts.weight_sync_s``. The group is built at the first
        bucket, and again once the worker set changed (a replaced worker) or a broadcast failed."""
        from agentrl.sync import weight_group

        if not bucket:
            return
        device = bucket[0][1].device
        same = len(self._group_members) == len(self.workers) and all(
            a is b for a, b in zip(self._group_members, self.workers)
        )
        if self._group is None or not same or device != self._group_device:
            self._join_group(device)
        calls = [w.receive_weight_bucket.remote(weight_group.layout(bucket)) for w in self.workers]
        try:
            weight_group.send_bucket(self._group, bucket, device, self._sync_left("broadcasting a bucket"))
        except Exception as e:
            self._leave_group()  # in an unknown state: built anew at the next bucket
            raise RuntimeError(
                f"broadcasting a weight bucket to the rollout workers failed: {type(e).__name__}: "
                f"{str(e).splitlines()[0][:300] if str(e) else ''}; the weight-sync group is rebuilt at the "
                "next sync"
            ) from e
        left = self._sync_left("receiving a bucket")
        self._answers(calls, "receive_weight_bucket", left, self._sync_setting())

    def _join_group(self, device: torch.device) -> None:
        """Build the weight-sync group: this process is rank 0 and hosts the store (on loopback, or
        on this node's IP when the pool joined a cluster), worker i joins as rank i + 1 by a Ray
        call, this process in a thread. The join may take half of ``timeouts.weight_sync_s`` (the
        buckets have the rest), so a worker that does not join is named before the sync's own limit
        passes; it is killed (replaced before the next run) and the sync raises ``WaitTimeout``."""
        import ray

        from agentrl.sync import weight_group

        self._leave_group()
        size, limit = len(self.workers) + 1, self.sync_timeout_s / 2
        host = ray.util.get_node_ip_address() if self.cfg.rollout.ray_address else LOOPBACK
        t0 = time.monotonic()
        store = weight_group.host_store(host, size, self.sync_timeout_s)
        calls = [
            w.join_weight_group.remote(host, store.port, i + 1, size, device.type, self.sync_timeout_s)
            for i, w in enumerate(self.workers)
        ]
        mine: concurrent.futures.Future = concurrent.futures.Future()

        def join() -> None:  # through a connection of its own: a store's client waits one call at a time
            try:
                client = weight_group.client_store(host, store.port, 0, self.sync_timeout_s)
                mine.set_result(weight_group.make_group(client, 0, size, device, self.sync_timeout_s))
            except BaseException as e:  # handed to the waiting sync
                mine.set_exception(e)

        threading.Thread(target=join, name="agentrl-weight-group", daemon=True).start()
        setting = f"half of timeouts.weight_sync_s={self.sync_timeout_s:g}s"
        done, _ = ray.wait(calls, num_returns=len(calls), timeout=limit)
        if len(done) < len(calls):
            late = [i for i, c in enumerate(calls) if c not in set(done)]
            # the workers that never began to join hold the others up; blame those when there are some
            started = weight_group.joined(store, [i + 1 for i in late])
            stuck = [i for i, ok in zip(late, started) if not ok] or late
            for i in stuck:
                ray.kill(self.workers[i], no_restart=True)
            self.events.append(f"killed rollout workers {stuck}: did not join the weight-sync group")
            raise WaitTimeout(
                f"rollout workers {stuck} joining the weight-sync group (rollout.sync.transport=broadcast)",
                time.monotonic() - t0,
                setting,
                note="; killed them (replaced before the next run_episodes)",
            )
        for i, c in enumerate(calls):
            try:
                ray.get(c)
            except Exception as e:
                raise RuntimeError(
                    f"rollout worker {i} could not join the weight-sync group: {type(e).__name__}: "
                    f"{str(e).splitlines()[0][:300] if str(e) else ''}"
                ) from e
        left = limit - (time.monotonic() - t0)
        what = "the trainer joining the weight-sync group"
        self._group = wait_for(mine, left, what, setting, "; the join is abandoned")
        self._group_members, self._group_device = list(self.workers), device

    def _leave_group(self) -> None:
        from agentrl.sync import weight_group

        if self._group is not None:
            weight_group.leave(self._group)
        self._group, self._group_members = None, []

    def _sync_setting(self) -> str:
        return f"timeouts.weight_sync_s={self.sync_timeout_s:g}s for the whole sync"

    def _sync_left(self, step: str) -> float:
        """Seconds left of the weight update's limit; ``WaitTimeout`` when none are."""
        waited = time.monotonic() - self._sync_start
        if waited >= self.sync_timeout_s:
            raise WaitTimeout(f"weight sync into the rollout workers: {step}", waited, self._sync_setting())
        return self.sync_timeout_s - waited

    def _guarded(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` inside an update: on an error the lock is released (the update is lost)."""
        try:
            return fn()
        except BaseException:
            self._weights_lock.release()
            raise

    def fingerprint(self, names: Sequence[str], probe_ids: Sequence[int]) -> list[Fingerprint]:
        """Every worker's fingerprint (each must match the trainer's; they name the worker)."""
        calls = [w.fingerprint.remote(list(names), list(probe_ids)) for w in self.workers]
        return [
            dataclasses.replace(fp, source=f"rollout worker {i} ({fp.source})")
            for i, part in enumerate(self._answers(calls, "fingerprint"))
            for fp in part
        ]

    def _answers(
        self, calls: list, call: str, limit_s: float | None = None, setting: str | None = None
    ) -> list:
        """The workers' answers to ``calls`` (one per worker, in order). A worker that does not answer
        within ``limit_s`` (default ``call_timeout_s``) is killed (replaced before the next run) and
        the call raises ``WaitTimeout`` naming it; a worker that died raises ``RuntimeError`` naming it."""
        import ray
        from ray.exceptions import RayActorError

        t0 = time.monotonic()
        limit_s = self.call_timeout_s if limit_s is None else limit_s
        done, _ = ray.wait(calls, num_returns=len(calls), timeout=limit_s)
        if len(done) < len(calls):
            stuck = [i for i, c in enumerate(calls) if c not in set(done)]
            for i in stuck:
                self.events.append(self._kill_stuck(i, call, time.monotonic() - t0, setting))
            raise WaitTimeout(
                f"rollout workers {stuck}: {call}",
                time.monotonic() - t0,
                setting or self._setting(),
                note="; killed them (replaced before the next run_episodes)",
            )
        out = []
        for i, c in enumerate(calls):
            try:
                out.append(ray.get(c))
            except RayActorError as e:
                raise RuntimeError(
                    f"rollout worker {i} died during {call}: {str(e).splitlines()[0][:300]}"
                ) from e
        return out

    def shutdown(self) -> None:
        import ray

        self._leave_group()
        for w in self.workers:
            ray.kill(w)
        self.workers = []

    # -- episodes ----------------------------------------------------------------------------
    def run_episodes(
        self, requests: Sequence[EpisodeRequest], seed: int | None = None, temperature: float | None = None
    ) -> list[Episode]:
        """Episodes for ``requests``, in order. Contiguous shards go to the workers (so a group's
        episodes mostly share a worker's batches); a dead worker's shard is retried elsewhere, and so
        is the shard of a worker that has not answered within ``call_timeout_s`` (its clock starts when
        it takes the shard, not while the shard waits behind another): that worker is killed."""
        import ray
        from ray.exceptions import RayActorError

        self._replace_dead()
        use = [k for k in range(len(self.workers)) if k not in self._behind]
        if not use:  # every worker was replaced and none could copy the current weights
            err = (
                f"no rollout worker has the current weights (version {self._version}): all were replaced "
                "since the last weight sync; the next sync brings them up to date"
            )
            return [failed_episode(r, err, 0) for r in requests]
        n, total = len(use), len(requests)
        shards = [list(range(k * total // n, (k + 1) * total // n)) for k in range(n)]
        results: dict[int, Episode] = {}
        attempts = [0] * n
        pending: dict[Any, tuple[int, int]] = {}  # call -> (worker, shard), in submission order
        busy_since: dict[int, float] = {}  # worker -> when it began the call it is running
        live = list(use)

        def submit(shard: int, worker: int) -> None:
            with self._weights_lock:  # never between the buckets of a weight update
                call = self.workers[worker].run.remote(
                    [requests[i] for i in shards[shard]], seed, temperature
                )
            pending[call] = (worker, shard)
            busy_since.setdefault(worker, time.monotonic())

        def lost(shard: int, worker: int, err: str) -> None:
            """The shard's worker is gone: retry the shard on a live worker, or fail its episodes."""
            self.events.append(err)
            if worker in live:
                live.remove(worker)
            if live and attempts[shard] < self.max_retries:
                target = min(live, key=lambda w: sum(1 for wk, _ in pending.values() if wk == w))
                self.events.append(f"retrying {len(shards[shard])} episodes on worker {target}")
                attempts[shard] += 1
                submit(shard, target)
            else:
                for i in shards[shard]:
                    results[i] = failed_episode(requests[i], err, attempts[shard])

        for k in range(n):
            if shards[k]:
                submit(k, use[k])
        while pending:
            oldest = min({w for w, _ in pending.values()}, key=busy_since.__getitem__)
            left = busy_since[oldest] + self.call_timeout_s - time.monotonic()
            done, _ = ray.wait(list(pending), num_returns=1, timeout=max(left, 0.0))
            if not done:  # the longest-running call is past its limit
                err = self._kill_stuck(oldest, "run", time.monotonic() - busy_since.pop(oldest))
                for call, (w, k) in list(pending.items()):
                    if w == oldest:
                        del pending[call]
                        lost(k, w, err)
                continue
            worker, k = pending.pop(done[0])
            busy_since.pop(worker, None)
            if any(w == worker for w, _ in pending.values()):
                busy_since[worker] = time.monotonic()  # it now runs the next shard queued on it
            try:
                for i, ep in zip(shards[k], ray.get(done[0])):
                    ep.metrics["worker_retries"] = attempts[k]
                    results[i] = ep
            except RayActorError as e:
                lost(
                    k,
                    worker,
                    f"rollout worker {worker} died: {type(e).__name__}: {str(e).splitlines()[0][:300]}",
                )
        return [results[i] for i in range(len(requests))]

    def _kill_stuck(self, worker: int, call: str, waited_s: float, setting: str | None = None) -> str:
        """Kill a worker that did not answer ``call`` in time; the message its episodes record."""
        import ray

        ray.kill(self.workers[worker], no_restart=True)
        return (
            f"rollout worker {worker} did not answer {call} within {setting or self._setting()} (waited "
            f"{waited_s:.1f}s); killed it"
        )

    def _replace_dead(self) -> None:
        """Swap dead actors, and live ones that do not answer a ping within ``call_timeout_s``
        (killed first), for fresh ones carrying the current weights."""
        import ray

        stuck, dead = self._ping(list(range(len(self.workers))))
        for i in stuck + dead:
            ray.kill(self.workers[i], no_restart=True)
            self.workers[i] = self._spawn()
            if self._ping([i])[0]:
                raise WaitTimeout(
                    f"replacement rollout worker {i} loading the policy", self.call_timeout_s, self._setting()
                )
            self.events.append(f"replaced {'unresponsive' if i in stuck else 'dead'} worker {i}")
            if self._version > 0:
                live = [
                    k for k in range(len(self.workers)) if k not in stuck + dead and k not in self._behind
                ]
                try:
                    self._copy_weights(i, live)
                except Exception as e:  # a vLLM source, or no live worker: wait for the next sync
                    self._behind.add(i)
                    self.events.append(
                        f"replacement worker {i} runs nothing until the next weight sync (it has the initial "
                        f"weights, not version {self._version}): {type(e).__name__}: {str(e).splitlines()[0][:200]}"
                    )

    def _copy_weights(self, to: int, live: list[int]) -> None:
        """Bring replacement worker ``to`` to the current weights: copied from a live worker's
        engine, one bucket of ``rollout.sync.bucket_mb`` at a time through the object store."""
        from agentrl.sync.weight_sync import MiB

        if not live:
            raise RuntimeError(
                f"every rollout worker died: replacement worker {to} has the initial weights, not "
                f"version {self._version}, and no live worker can hand them over; restart from a checkpoint"
            )
        src, dst = self.workers[live[0]], self.workers[to]
        (sizes,) = self._answers([src.weight_sizes.remote()], "weight_sizes")
        self._answers([dst.begin_weight_update.remote()], "begin_weight_update")
        limit, bucket, size = self.cfg.rollout.sync.bucket_mb * MiB, list[str](), 0
        for name, n in [*sizes, ("", math.inf)]:  # the sentinel flushes the last bucket
            if bucket and size + n > limit:
                with self._weights_lock:  # not while an update is half done
                    self._answers(
                        [dst.load_weight_bucket.remote(src.weight_bucket.remote(bucket))],
                        f"copying weights from worker {live[0]}",
                    )
                bucket, size = [], 0
            bucket.append(name)
            size += n
        self._answers([dst.finish_weight_update.remote(self._version)], "finish_weight_update")

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[Completion]:
        """Engine protocol: prompts split evenly across the workers' engines. Workers that do not
        answer within ``call_timeout_s`` are killed (replaced before the next ``run_episodes``) and the
        call raises ``WaitTimeout`` naming them."""
        import ray

        plist = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        current = [k for k in range(len(self.workers)) if k not in self._behind]
        if not current:
            raise RuntimeError(f"no rollout worker has the current weights (version {self._version}) yet")
        n = len(current)
        bounds = [i * len(prompts) // n for i in range(n + 1)]
        used = [current[i] for i in range(n) if bounds[i + 1] > bounds[i]]
        spans = {current[i]: (bounds[i], bounds[i + 1]) for i in range(n)}
        with self._weights_lock:  # never between the buckets of a weight update
            calls = [
                self.workers[i].generate.remote(
                    prompts[spans[i][0] : spans[i][1]], plist[spans[i][0] : spans[i][1]]
                )
                for i in used
            ]
        t0 = time.monotonic()
        done, _ = ray.wait(calls, num_returns=len(calls), timeout=self.call_timeout_s)
        if len(done) < len(calls):
            answered = set(done)
            stuck = [i for i, c in zip(used, calls) if c not in answered]
            for i in stuck:
                ray.kill(self.workers[i], no_restart=True)
            self.events.append(f"killed rollout workers {stuck}: generate unanswered")
            raise WaitTimeout(
                f"rollout workers {stuck}: generate for {len(prompts)} prompts",
                time.monotonic() - t0,
                self._setting(),
                note="; killed them (replaced before the next run_episodes)",
            )
        return [c for part in ray.get(calls) for c in part]


def failed_episode(req: EpisodeRequest, message: str, retries: int) -> Episode:
    """The record of an episode that no worker could run."""
    ep = req.new_episode()
    ep.failure = Failure("worker", message)
    ep.stop_reason = "error"
    ep.metrics.update(worker_retries=retries, task={"id": req.task.id, "prompt": req.task.prompt})
    return ep


class RayEpisodeRunner:
    """The runner ``build.build_runner`` returns for a ``RolloutPool``: same ``run``/``close``."""

    def __init__(self, pool: RolloutPool, seed: int | None = None, temperature: float | None = None) -> None:
        self.pool, self.seed, self.temperature = pool, seed, temperature

    def run(self, requests: Sequence[EpisodeRequest]) -> list[Episode]:
        return self.pool.run_episodes(requests, self.seed, self.temperature)

    def close(self) -> None:
        """Workers outlive a runner (they hold the weights); ``RolloutPool.shutdown`` ends them."""
