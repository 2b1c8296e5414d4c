"""Ray rollout workers: environments, sandboxes and a generation engine in each of N Ray actors.

``rollout.workers: N`` makes ``build.build_engine`` return a ``RolloutPool`` instead of an in-process
engine. The pool starts N ``RolloutWorker`` actors (on a local loopback Ray, or on the cluster at
``rollout.ray_address``); each loads the policy, builds its own engine (``rollout.engine``: HF or vLLM)
and runs episodes with the same runner an in-process run uses. The trainer sees the same interface:
a weight sync (``weight_sync.py``) sends each bucket to every worker by the transport
``rollout.sync.transport`` names (``sync/transports/``: by default Ray's object store, one bucket at a
time); the pool holds a lock from the first bucket to the last, and no shard or generation is
submitted meanwhile, so none runs on half-updated weights; ``fingerprint`` asks every worker;
``version`` is the weight version; ``build.build_runner`` returns a ``RayEpisodeRunner`` that splits a
step's episodes across the workers.

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

import dataclasses
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.engines.base import Bucket, Completion, Fingerprint, SamplingParams, Weights, weight_items
from agentrl.engines.factory import weight_dtype
from agentrl.episode import Episode
from agentrl.errors import Failure
from agentrl.parallel.placement import Placement, start_waves
from agentrl.rollout.ray_placement import Reservation, init_ray
from agentrl.rollout.ray_worker import RolloutWorker
from agentrl.rollout.runner import EpisodeRequest, SamplingOverride
from agentrl.rollout.worker_spec import WorkerSpec
from agentrl.sync.ray_pool import PoolWeights
from agentrl.sync.registry import OBJECT_STORE
from agentrl.timeouts import WaitTimeout


@dataclass(frozen=True)
class PoolSettings:
    """What a pool reads of the config (``assembly``'s ``rollout_pool`` fills it)."""

    workers: int
    """from ``rollout.workers``"""
    ray_address: str | None
    """from ``rollout.ray_address``"""
    worker_placement: str
    """from ``rollout.worker_placement``"""
    transport: str
    """from ``rollout.sync.transport``"""
    bucket_mb: float
    """from ``rollout.sync.bucket_mb``"""
    weight_sync_s: float
    """from ``timeouts.weight_sync_s``"""
    ray_call_s: float
    """from ``timeouts.ray_call_s``"""
    max_retries: int = 1
    """How often a batch's episodes are resubmitted after their worker died."""

    @property
    def start_limit_s(self) -> float:
        """The longest a pool may take to start: Ray's reservation of the workers' bundles, then the
        workers loading their engines, each bounded by ``timeouts.ray_call_s``."""
        return 2 * self.ray_call_s


class RolloutPool:
    """N ``RolloutWorker`` actors behind the Engine protocol (``version``, ``load_weights``,
    ``generate``) plus ``run_episodes`` for whole episodes. Each worker is built from ``spec``;
    ``where``: the run's placement (the workers' GPUs)."""

    def __init__(self, spec: WorkerSpec, settings: PoolSettings, where: Placement) -> None:
        import ray

        workers, address = settings.workers, settings.ray_address
        init_ray(
            address, num_cpus=None if address else max(os.cpu_count() or 1, workers), gpus=where.ray_gpus
        )
        self.settings, self.model_path, self.max_retries = settings, spec.model_path, settings.max_retries
        self.spec = spec
        """What every worker, a replacement too, is built from."""
        self.call_timeout_s = settings.ray_call_s
        """How long any call to a worker may go unanswered before the worker counts as dead."""
        self._actor_cls = ray.remote(max_restarts=0)(RolloutWorker)
        # one bundle per worker, with its GPUs (rollout.worker_gpus; ray_placement.py)
        self.reservation = Reservation(
            workers, where.rollouts.worker_gpus, settings.worker_placement, self.call_timeout_s, bool(address)
        )
        self.events: list[str] = []
        """Worker deaths, retries and replacements, for logs and tests."""
        # built before the workers start (it only records settings), so that ``shutdown`` works on a
        # pool whose workers never finished starting
        self.weights = PoolWeights(
            settings.transport,
            settings.weight_sync_s,
            cluster=bool(address),
            workers=lambda: self.workers,
            answers=self._answers,
            events=self.events,
            dtype=weight_dtype(spec.engine),
        )
        self.workers: list[Any] = []
        self._start(start_waves(where), spec.model_path)

    def _start(self, waves: list[list[int]], model_path: str) -> None:
        """Start the workers wave by wave (``placement.start_waves``: workers that share a GPU one after
        another, so that each engine measures that GPU's memory alone), all within ``call_timeout_s``."""
        import ray

        self.workers = [None] * sum(len(w) for w in waves)  # filled wave by wave
        deadline = time.monotonic() + self.call_timeout_s
        for wave in waves:
            for i in wave:
                self.workers[i] = self._spawn(i)
            late, _ = ping(self.workers, wave, max(deadline - time.monotonic(), 0.0))  # until they load
            if late:
                self.shutdown()
                raise WaitTimeout(
                    f"rollout workers {late} loading the policy {model_path}",
                    self.call_timeout_s,
                    self._setting(),
                    note="; stopped the pool",
                )
            ray.get([self.workers[i].pid.remote() for i in wave])  # raises a worker's start error

    def _spawn(self, bundle: int) -> Any:
        """Worker ``bundle``'s actor, on its bundle (and so its GPUs) of the placement group."""
        options = self.reservation.options(bundle)
        return self._actor_cls.options(**options).remote(self.spec)

    def placements(self) -> list[dict[str, Any]]:
        """Each worker's GPUs and engine device (``RolloutWorker.placement``)."""
        return self._answers([w.placement.remote() for w in self.workers], "placement")

    def _setting(self) -> str:
        return f"timeouts.ray_call_s={self.call_timeout_s:g}s"

    @property
    def version(self) -> int:
        return self.weights.version

    def load_weights(self, weights: Weights) -> int:
        """All of ``weights`` as one bucket (the trainer's sync sends several: ``weight_sync.py``)."""
        self.begin_weight_update()
        self.load_weight_bucket(weight_items(weights))
        return self.finish_weight_update()

    # -- the bucketed sync (engines/base.py: WeightReceiver; sync/ray_pool.py) ----------------------
    def begin_weight_update(self) -> None:
        self.weights.begin()

    def load_weight_bucket(self, bucket: Bucket) -> None:
        self.weights.load_bucket(bucket)

    def finish_weight_update(self) -> int:
        return self.weights.finish()

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
        """Let go of the weight transports' groups and kill the workers (also on a pool whose workers
        never finished starting: the constructor's own timeout is then the error raised)."""
        import ray

        self.weights.close()
        for w in self.workers:
            if w is not None:  # a worker of a wave that never started
                ray.kill(w)
        self.workers = []
        self.reservation.release()

    # -- episodes ----------------------------------------------------------------------------
    def run_episodes(
        self,
        requests: Sequence[EpisodeRequest],
        seed: int | None = None,
        override: SamplingOverride | None = None,
    ) -> list[Episode]:
        """Episodes for ``requests``, in order. Contiguous shards go to the workers (so a group's
        episodes mostly share a worker's batches); a dead worker's shard is retried elsewhere, and so
        is the shard of a worker that has not answered within ``call_timeout_s`` (its clock starts when
        it takes the shard, not while the shard waits behind another): that worker is killed."""
        self._replace_dead()
        use = [k for k in range(len(self.workers)) if k not in self.weights.behind]
        if not use:  # every worker was replaced and none could copy the current weights
            err = (
                f"no rollout worker has the current weights (version {self.weights.version}): all were replaced "
                "since the last weight sync; the next sync brings them up to date"
            )
            return [failed_episode(r, err, 0) for r in requests]
        return ShardedRun(self, requests, use, seed, override).results()

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

        stuck, dead = ping(self.workers, list(range(len(self.workers))), self.call_timeout_s)
        for i in stuck + dead:
            ray.kill(self.workers[i], no_restart=True)
            self.workers[i] = self._spawn(i)  # its bundle, so its GPUs, again
            if ping(self.workers, [i], self.call_timeout_s)[0]:
                raise WaitTimeout(
                    f"replacement rollout worker {i} loading the policy",
                    self.call_timeout_s,
                    self._setting(),
                )
            self.events.append(f"replaced {'unresponsive' if i in stuck else 'dead'} worker {i}")
            if self.weights.version > 0:
                live = [
                    k
                    for k in range(len(self.workers))
                    if k not in stuck + dead and k not in self.weights.behind
                ]
                try:
                    self._copy_weights(i, live)
                except Exception as e:  # a vLLM source, or no live worker: wait for the next sync
                    self.weights.behind.add(i)
                    self.events.append(
                        f"replacement worker {i} runs nothing until the next weight sync (it has the initial "
                        f"weights, not version {self.weights.version}): {type(e).__name__}: {str(e).splitlines()[0][:200]}"
                    )

    def _copy_weights(self, to: int, live: list[int]) -> None:
        """Bring replacement worker ``to`` to the current weights: copied from a live worker's
        engine, one bucket of ``rollout.sync.bucket_mb`` at a time through the object store."""
        from agentrl.sync.weight_sync import MiB

        if not live:
            raise RuntimeError(
                f"every rollout worker died: replacement worker {to} has the initial weights, not "
                f"version {self.weights.version}, and no live worker can hand them over; restart from a checkpoint"
            )
        src, dst = self.workers[live[0]], self.workers[to]
        (sizes,) = self._answers([src.weight_sizes.remote()], "weight_sizes")
        self._answers([dst.begin_weight_update.remote()], "begin_weight_update")
        limit, bucket, size = self.settings.bucket_mb * MiB, list[str](), 0
        for name, n in [*sizes, ("", math.inf)]:  # the sentinel flushes the last bucket
            if bucket and size + n > limit:
                with self.weights.lock:  # not while an update is half done
                    self._answers(
                        [dst.receive_weights.remote(OBJECT_STORE, src.weight_bucket.remote(bucket))],
                        f"copying weights from worker {live[0]}",
                    )
                bucket, size = [], 0
            bucket.append(name)
            size += n
        self._answers([dst.finish_weight_update.remote(self.weights.version)], "finish_weight_update")

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[Completion]:
        """Engine protocol: prompts split evenly across the workers' engines. Workers that do not
        answer within ``call_timeout_s`` are killed (replaced before the next ``run_episodes``) and the
        call raises ``WaitTimeout`` naming them."""
        import ray

        plist = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        current = [k for k in range(len(self.workers)) if k not in self.weights.behind]
        if not current:
            raise RuntimeError(
                f"no rollout worker has the current weights (version {self.weights.version}) yet"
            )
        n = len(current)
        bounds = [i * len(prompts) // n for i in range(n + 1)]
        used = [current[i] for i in range(n) if bounds[i + 1] > bounds[i]]
        spans = {current[i]: (bounds[i], bounds[i + 1]) for i in range(n)}
        with self.weights.lock:  # never between the buckets of a weight update
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


class ShardedRun:
    """One ``RolloutPool.run_episodes`` call: its shards, which worker runs each, retries, results."""

    def __init__(
        self,
        pool: RolloutPool,
        requests: Sequence[EpisodeRequest],
        use: list[int],
        seed: int | None,
        override: SamplingOverride | None,
    ) -> None:
        self.pool, self.requests, self.seed, self.override = pool, requests, seed, override
        n, total = len(use), len(requests)
        self.shards = [list(range(k * total // n, (k + 1) * total // n)) for k in range(n)]
        self.done: dict[int, Episode] = {}
        self.attempts = [0] * n
        self.pending: dict[Any, tuple[int, int]] = {}  # call -> (worker, shard), in submission order
        self.busy_since: dict[int, float] = {}  # worker -> when it began the call it is running
        self.live = list(use)
        for k in range(n):
            if self.shards[k]:
                self.submit(k, use[k])

    def submit(self, shard: int, worker: int) -> None:
        with self.pool.weights.lock:  # never between the buckets of a weight update
            call = self.pool.workers[worker].run.remote(
                [self.requests[i] for i in self.shards[shard]], self.seed, self.override
            )
        self.pending[call] = (worker, shard)
        self.busy_since.setdefault(worker, time.monotonic())

    def lost(self, shard: int, worker: int, err: str) -> None:
        """The shard's worker is gone: retry the shard on a live worker, or fail its episodes."""
        self.pool.events.append(err)
        if worker in self.live:
            self.live.remove(worker)
        if self.live and self.attempts[shard] < self.pool.max_retries:
            target = min(self.live, key=lambda w: sum(1 for wk, _ in self.pending.values() if wk == w))
            self.pool.events.append(f"retrying {len(self.shards[shard])} episodes on worker {target}")
            self.attempts[shard] += 1
            self.submit(shard, target)
        else:
            for i in self.shards[shard]:
                self.done[i] = failed_episode(self.requests[i], err, self.attempts[shard])

    def results(self) -> list[Episode]:
        """Wait for every shard (the longest-running call first against its limit)."""
        import ray
        from ray.exceptions import RayActorError

        pending, busy_since = self.pending, self.busy_since
        while pending:
            oldest = min({w for w, _ in pending.values()}, key=busy_since.__getitem__)
            left = busy_since[oldest] + self.pool.call_timeout_s - time.monotonic()
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(left, 0.0))
            if not ready:  # the longest-running call is past its limit
                err = self.pool._kill_stuck(oldest, "run", time.monotonic() - busy_since.pop(oldest))
                for call, (w, k) in list(pending.items()):
                    if w == oldest:
                        del pending[call]
                        self.lost(k, w, err)
                continue
            worker, k = pending.pop(ready[0])
            busy_since.pop(worker, None)
            if any(w == worker for w, _ in pending.values()):
                busy_since[worker] = time.monotonic()  # it now runs the next shard queued on it
            try:
                for i, ep in zip(self.shards[k], ray.get(ready[0])):
                    ep.metrics["worker_retries"] = self.attempts[k]
                    self.done[i] = ep
            except RayActorError as e:
                err = f"rollout worker {worker} died: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
                self.lost(k, worker, err)
        return [self.done[i] for i in range(len(self.requests))]


def ping(workers: list[Any], indices: list[int], timeout_s: float) -> tuple[list[int], list[int]]:
    """Of ``workers[i]`` for i in ``indices``: those that do not answer a ping within ``timeout_s``,
    and the dead ones (they answer at once, with an error)."""
    import ray
    from ray.exceptions import RayActorError

    pings = [workers[i].pid.remote() for i in indices]
    done, _ = ray.wait(pings, num_returns=len(pings), timeout=timeout_s)
    answered, dead = set(done), []
    for i, p in zip(indices, pings):
        try:
            if p in answered:
                ray.get(p)
        except RayActorError:
            dead.append(i)
    return [i for i, p in zip(indices, pings) if p not in answered], dead


def failed_episode(req: EpisodeRequest, message: str, retries: int) -> Episode:
    """The record of an episode that no worker could run."""
    ep = req.new_episode()
    ep.failure = Failure("worker", message)
    ep.stop_reason = "error"
    ep.metrics.update(worker_retries=retries, task={"id": req.task.id, "prompt": req.task.prompt})
    return ep


class RayEpisodeRunner:
    """The runner ``build.build_runner`` returns for a ``RolloutPool``: same ``run``/``close``."""

    def __init__(
        self, pool: RolloutPool, seed: int | None = None, override: SamplingOverride | None = None
    ) -> None:
        self.pool, self.seed, self.override = pool, seed, override

    def run(self, requests: Sequence[EpisodeRequest]) -> list[Episode]:
        return self.pool.run_episodes(requests, self.seed, self.override)

    def close(self) -> None:
        """Workers outlive a runner (they hold the weights); ``RolloutPool.shutdown`` ends them."""
