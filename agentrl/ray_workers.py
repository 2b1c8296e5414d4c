"""Ray rollout workers: environments, sandboxes and a generation engine in each of N Ray actors.

``rollout.workers: N`` makes ``build.build_engine`` return a ``RolloutPool`` instead of an in-process
engine. The pool starts N ``RolloutWorker`` actors (on a local loopback Ray, or on the cluster at
``rollout.ray_address``); each loads the policy, builds its own engine (``rollout.engine``: HF or vLLM)
and runs episodes with the same runner an in-process run uses. The trainer sees the same interface:
``load_weights`` puts the new state dict in Ray's object store once and every worker copies it in
place; ``version`` is the weight version; ``build.build_runner`` returns a ``RayEpisodeRunner`` that
splits a step's episodes across the workers.

Faults: a worker that dies (its process crashed, its node was lost) fails the call running on it with
a ``RayActorError``. Its episodes are resubmitted to a live worker, up to ``max_retries`` times (the
same seeds, so a retried episode is the one that would have run); episodes that still cannot run are
returned as failed episodes with ``Failure("worker", ...)`` naming the worker and the error, and the
step goes on. Dead workers are replaced (with the current weights) before the next run.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from agentrl import components
from agentrl.config import Config
from agentrl.engines.base import Completion, SamplingParams, Weights, weight_items
from agentrl.episode import Episode
from agentrl.errors import Failure
from agentrl.runner import EpisodeRequest

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
        self._actor_cls = ray.remote(num_cpus=1, max_restarts=0)(RolloutWorker)
        self.workers = [self._spawn() for _ in range(workers)]
        ray.get([w.pid.remote() for w in self.workers])  # wait until all have loaded the policy
        self._version = 0
        self._weights_ref: Any = None
        self.events: list[str] = []
        """Worker deaths, retries and replacements, for logs and tests."""

    @classmethod
    def from_config(cls, cfg: Config, path: str) -> RolloutPool:
        return cls(cfg, path, cfg.rollout.workers, cfg.rollout.ray_address)

    def _spawn(self) -> Any:
        return self._actor_cls.remote(worker_config(self.cfg), self.model_path)

    @property
    def version(self) -> int:
        return self._version

    def load_weights(self, weights: Weights) -> int:
        """Put the weights in the object store once; every worker copies them in place."""
        import ray

        cpu = {k: v.detach().to("cpu", copy=True) for k, v in weight_items(weights)}
        self._version += 1
        self._weights_ref = ray.put(cpu)
        ray.get([w.load_weights.remote(self._weights_ref, self._version) for w in self.workers])
        return self._version

    def shutdown(self) -> None:
        import ray

        for w in self.workers:
            ray.kill(w)
        self.workers = []

    # -- episodes ----------------------------------------------------------------------------
    def run_episodes(
        self, requests: Sequence[EpisodeRequest], seed: int | None = None, temperature: float | None = None
    ) -> list[Episode]:
        """Episodes for ``requests``, in order. Contiguous shards go to the workers (so a group's
        episodes mostly share a worker's batches); a dead worker's shard is retried elsewhere."""
        import ray
        from ray.exceptions import RayActorError

        self._replace_dead()
        n, total = len(self.workers), len(requests)
        shards = [list(range(k * total // n, (k + 1) * total // n)) for k in range(n)]
        results: dict[int, Episode] = {}
        attempts = [0] * n
        pending: dict[Any, tuple[int, int]] = {}  # call -> (worker, shard)
        live = list(range(n))

        def submit(shard: int, worker: int) -> None:
            call = self.workers[worker].run.remote([requests[i] for i in shards[shard]], seed, temperature)
            pending[call] = (worker, shard)

        for k in range(n):
            if shards[k]:
                submit(k, k)
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            worker, k = pending.pop(done[0])
            try:
                for i, ep in zip(shards[k], ray.get(done[0])):
                    ep.metrics["worker_retries"] = attempts[k]
                    results[i] = ep
                continue
            except RayActorError as e:
                err = f"rollout worker {worker} died: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
            self.events.append(err)
            if worker in live:
                live.remove(worker)
            if live and attempts[k] < self.max_retries:
                target = min(live, key=lambda w: sum(1 for wk, _ in pending.values() if wk == w))
                self.events.append(f"retrying {len(shards[k])} episodes on worker {target}")
                attempts[k] += 1
                submit(k, target)
            else:
                for i in shards[k]:
                    results[i] = failed_episode(requests[i], err, attempts[k])
        return [results[i] for i in range(len(requests))]

    def _replace_dead(self) -> None:
        """Swap dead actors for fresh ones carrying the current weights."""
        import ray
        from ray.exceptions import RayActorError

        for i, w in enumerate(self.workers):
            try:
                ray.get(w.pid.remote(), timeout=60)
                continue
            except (RayActorError, ray.exceptions.GetTimeoutError):
                pass
            self.workers[i] = self._spawn()
            if self._weights_ref is not None:
                ray.get(self.workers[i].load_weights.remote(self._weights_ref, self._version))
            self.events.append(f"replaced dead worker {i}")

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[Completion]:
        """Engine protocol: prompts split evenly across the workers' engines."""
        import ray

        plist = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        n = len(self.workers)
        bounds = [i * len(prompts) // n for i in range(n + 1)]
        calls = [
            self.workers[i].generate.remote(
                prompts[bounds[i] : bounds[i + 1]], plist[bounds[i] : bounds[i + 1]]
            )
            for i in range(n)
            if bounds[i + 1] > bounds[i]
        ]
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
