"""A step's episodes: rollouts on this rank's share of the tasks, then the filters (failed and
stale episodes out, dynamic sampling on the outcome, groups of one dropped) and DAPO's overlong
shaping. In async mode (``trainer.mode: async``) the episodes come from the rollout pipeline
(``rollout/pipeline.py``), which runs batches ahead of the trainer."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from agentrl import algorithms as alg
from agentrl.config import AlgorithmConfig, RolloutConfig, TrainerConfig
from agentrl.engines.base import Engine
from agentrl.env.data import TaskSampler
from agentrl.episode import Episode
from agentrl.parallel import ranks
from agentrl.parallel.engine_group import FollowerEngine, LeaderEngine
from agentrl.rollout.pipeline import EngineGate, RolloutPipeline, batch_requests
from agentrl.rollout.runner import EpisodeRequest, MakeRunner
from agentrl.seeds import mix_seed
from agentrl.training import offpolicy as off


@dataclass(frozen=True)
class CollectorSettings:
    """What the rollouts read of the config (``assembly/records.py`` builds it)."""

    algorithm: AlgorithmConfig
    rollout: RolloutConfig
    trainer: TrainerConfig
    seed: int
    """from ``run.seed``"""
    data_wait_s: float
    """from ``timeouts.data_wait_s``"""


class Collector:
    """The trainer's rollouts: ``collect(step)`` each step; ``state``/``load_state`` for checkpoints
    (the task sampler's position and, in async mode, the batches granted and not yet trained on).
    ``make_runner`` builds each batch's runner on the collector's current engine."""

    def __init__(
        self, settings: CollectorSettings, engine: Engine, sampler: TaskSampler, make_runner: MakeRunner
    ) -> None:
        self.settings, self.engine, self.sampler, self.make_runner = settings, engine, sampler, make_runner
        self.pipeline: RolloutPipeline | None = None  # async mode: started by the first collect
        self.pipeline_state: dict[str, Any] | None = None  # a resumed async run's pending batches
        self._async_marks = (0.0, 0.0)  # the engine's idle and blocked seconds at the last step

    def collect(self, step: int) -> tuple[list[Episode], list[Episode], dict[str, float]]:
        """Episodes of this step (all, for transcripts) and the ones to train on. With dynamic
        sampling, keeps sampling rounds until ``prompts_per_step`` informative groups are found or
        ``max_sampling_rounds`` is spent. The ``groups/*`` metrics here and in
        ``metrics.episode_metrics`` are described in docs/training.md ("Group metrics")."""
        s, a = self.settings, self.settings.algorithm
        rounds = a.max_sampling_rounds if a.dynamic_sampling else 1
        info: dict[str, float] = {}
        all_eps: list[Episode] = []
        kept_groups: list[list[Episode]] = []
        n_informative = n_stale = n_dropped = 0
        waited = 0.0
        for r in range(rounds):
            eps, took_s = self._round(step, r, info)
            waited += took_s
            all_eps += eps
            # off-policy guard: episodes sampled more than max_staleness versions ago are not trained on
            stale = off.too_stale(eps, self.engine.version, s.rollout.max_staleness)
            n_stale += sum(stale)
            usable = [ep for ep, too_old in zip(eps, stale) if not ep.failed and not too_old]
            # A group is informative when its usable episodes' task outcomes differ: the reward *before*
            # DAPO's overlong shaping (DAPO and verl filter on accuracy), so an all-correct group whose
            # members differ only in their length penalty carries no outcome signal. Dynamic sampling
            # trains on those groups only; without it every group trains, informative or not.
            informative = alg.dynamic_sampling_keep([ep.reward for ep in usable], [ep.group for ep in usable])
            n_informative += len({usable[i].group for i in informative})
            keep = informative if a.dynamic_sampling else range(len(usable))
            self.shape_rewards(eps)
            groups = defaultdict(list)
            for i in keep:
                groups[usable[i].group].append(usable[i])
            kept_groups += [g for g in groups.values() if len(g) >= 2]  # a group of one has no baseline
            scored = Counter(ep.group for ep in usable)  # failed episodes (a judge's) are not scored
            n_dropped += sum(scored[g] < 2 for g in {ep.group for ep in eps})
            if len(kept_groups) >= s.rollout.prompts_per_step:
                break
        kept_groups = kept_groups[: s.rollout.prompts_per_step]
        n_groups = len({ep.group for ep in all_eps})  # groups/count, written by metrics.episode_metrics
        info.update(
            {
                "groups/informative_frac": n_informative / max(n_groups, 1),
                "groups/trained_count": float(len(kept_groups)),
                "groups/dropped_count": float(n_dropped),
                "groups/sampling_rounds": float(r + 1),
                "offpolicy/stale_dropped": float(n_stale),
                **off.staleness_metrics(all_eps, self.engine.version),
            }
        )
        if s.trainer.mode == "async":
            info["async/trainer_wait_s"] = waited
        return all_eps, [e for g in kept_groups for e in g], info

    def _round(self, step: int, r: int, info: dict[str, float]) -> tuple[list[Episode], float]:
        """One sampling round's episodes, and the seconds the trainer waited for them."""
        s = self.settings
        if s.trainer.mode == "async":  # finished episodes from the rollout pipeline
            pipeline = self._pipeline(step)
            if r > 0:
                pipeline.grant_round(step, r)
            eps, _, took = pipeline.take()
            if r == 0:
                info["async/queued_batches"] = float(took.queued)
                info["async/running_batches"] = float(took.running)
            return eps, took.waited_s
        tasks = self.sampler.next(s.rollout.prompts_per_step)
        label = (step, r)  # distinct seeds for every episode of the step: no two share a sample stream
        requests = batch_requests(label, tasks, s.rollout.group_size)
        return ranks.gather_episodes(partial(self.run_batch, label), requests), 0.0  # each rank its share

    def run_batch(self, label: tuple[int, int], requests: list[EpisodeRequest]) -> list[Episode]:
        """One batch's episodes on this rank's engine, with the runner seed of its (step, round)."""
        return self.on_engine(self._run_batch, label, requests)

    def _run_batch(self, label: tuple[int, int], requests: list[EpisodeRequest]) -> list[Episode]:
        runner = self.make_runner(self.engine, mix_seed(self.settings.seed, *label), None)
        try:
            return runner.run(requests)
        finally:
            runner.close()

    def on_engine(self, run: Callable[..., list[Episode]], *args: Any) -> list[Episode]:
        """``run(*args)``, whose last argument is this rank's share of a batch's requests, as the
        placement wants it: a rank with no share (its episodes run on rank 0's Ray pool) runs
        nothing; a rank that follows a tensor-parallel group's leader makes the leader's generation
        calls instead, until the leader, done with its share, releases it (``engine_group.py``)."""
        if isinstance(self.engine, FollowerEngine):
            self.engine.follow()
            return []
        try:
            return run(*args) if args[-1] else []
        finally:
            if isinstance(self.engine, LeaderEngine):
                self.engine.release()

    def gather(self, run: Callable[[list], list[Episode]], requests: list[EpisodeRequest]) -> list[Episode]:
        """Every rank's episodes of ``requests``, each rank running its share with ``run``
        (``on_engine``); under torchrun a collective (``ranks.gather_episodes``)."""
        return ranks.gather_episodes(lambda share: self.on_engine(run, share), requests)

    def _pipeline(self, step: int) -> RolloutPipeline:
        """Async mode's rollout pipeline, started at the first step this process runs."""
        if self.pipeline is None:
            s = self.settings
            self.pipeline = RolloutPipeline(
                self.sampler,
                s.rollout.prompts_per_step,
                s.trainer.total_steps,
                s.rollout.max_staleness,
                s.rollout.on_stale,
                lambda label, tasks: self.run_batch(
                    label, ranks.local_share(batch_requests(label, tasks, s.rollout.group_size))
                ),
                s.data_wait_s,
                start_step=step,
                state=self.pipeline_state,
            )
            self._async_marks = (0.0, self._blocked_s())
        return self.pipeline

    def _blocked_s(self) -> float:
        return self.engine.blocked_s if isinstance(self.engine, EngineGate) else 0.0

    def async_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """Where async mode's time went this step: the trainer waiting for data, the engine idle (no
        batch running: waiting for weights) and engine calls blocked by a weight push."""
        assert self.pipeline is not None
        idle, blocked = self.pipeline.idle_s(), self._blocked_s()
        out = {
            "async/engine_idle_s": idle - self._async_marks[0],
            "async/engine_blocked_s": blocked - self._async_marks[1],
            "async/trainer_idle_frac": metrics.get("async/trainer_wait_s", 0.0)
            / max(metrics["time/step_s"], 1e-9),
        }
        self._async_marks = (idle, blocked)
        return out

    def shape_rewards(self, episodes: list[Episode]) -> None:
        """DAPO soft overlong punishment on the policy-token length, added to the reward."""
        o = self.settings.algorithm.overlong
        if not o.enabled:
            return
        assert o.max_length is not None and o.cache_length is not None  # resolved by load_config
        pen = alg.overlong_penalty([e.num_policy_tokens for e in episodes], o.max_length, o.cache_length)
        for ep, p in zip(episodes, pen):
            if p:
                ep.reward_components["overlong"] = p
                ep.reward += p

    def close(self) -> None:
        """Async mode: the rollouts still running when training stops are waited for, not leaked."""
        if self.pipeline is not None:
            self.pipeline.close(timeout=self.settings.data_wait_s)
            self.pipeline = None

    def state(self) -> dict[str, Any]:
        return {
            "sampler": self.pipeline.state()["sampler"] if self.pipeline else self.sampler.state(),
            "pipeline": self.pipeline.state() if self.pipeline else self.pipeline_state,
        }

    def load_state(self, state: dict[str, Any]) -> None:
        self.sampler.load(state["sampler"])
        if self.settings.trainer.mode == "async":
            self.pipeline_state = state.get("pipeline")  # the batches granted and not yet trained on
