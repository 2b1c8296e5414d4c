"""The settings records training's parts take, built from the whole config: each part reads its
own sections and plain values (``LearnerSettings``, ``CollectorSettings``, ``PushSettings``), never
the ``Config``. Also the parts these records need besides the config: the KL reference policy, the
runners the rollouts and the evaluation sample with."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from agentrl.config import Config, weighting_name, weighting_settings
from agentrl.engines.base import Engine
from agentrl.env import Task
from agentrl.env.data import TaskSampler
from agentrl.parallel import shard_reads, sharding
from agentrl.rollout import components
from agentrl.rollout.runner import EpisodeRunner
from agentrl.sync.weight_sync import SyncSettings
from agentrl.training import build
from agentrl.training.collect import Collector, CollectorSettings, RunnerFactory
from agentrl.training.learner import Learner, LearnerSettings
from agentrl.training.run_state import RunState
from agentrl.training.weight_push import PushSettings

EVAL_SEED_OFFSET = 10_007
"""The evaluation's runner seed is ``run.seed`` plus this: its samples never repeat a training step's."""


def learner_settings(cfg: Config) -> LearnerSettings:
    return LearnerSettings(
        trainer=cfg.trainer,
        algorithm=cfg.algorithm,
        model=cfg.model,
        seed=cfg.run.seed,
        temperature=cfg.rollout.temperature,
        train_on_truncated=cfg.rollout.train_on_truncated,
        keep_overlays=cfg.logging.transcripts,
        weighting=weighting_name(cfg),
        weighting_settings=weighting_settings(cfg),
    )


def make_learner(
    cfg: Config,
    model: torch.nn.Module,
    pad_id: int,
    strategy: sharding.Strategy | None = None,
    log: Callable[[str], None] = print,
    shards_from: str | None = None,
) -> Learner:
    """The ``Learner`` of ``cfg`` for the loaded policy ``model``, with its KL reference when it
    needs one (``reference_policy``)."""
    settings = learner_settings(cfg)
    strategy = strategy or sharding.Replicated(0, 1, next(model.parameters()).device)
    reference = reference_policy(cfg, strategy, strategy.device, log) if settings.needs_reference else None
    return Learner(settings, model, pad_id, strategy, log, reference=reference, shards_from=shards_from)


def reference_policy(
    cfg: Config, strategy: sharding.Strategy, device: torch.device, log: Callable[[str], None]
) -> torch.nn.Module:
    """The frozen reference policy of the KL penalty: ``model.ref_path``, else the policy RL started
    from (the warm start; on a resume too, never the checkpoint). It costs one more copy of the
    weights in ``model.dtype`` (sharded like the policy; no gradients, no optimizer state) and one
    forward per step. Sharded, it loads as the policy does: each rank reads its own shards when every
    rank sees the checkpoint's files (``parallel/shard_reads.py``), else rank 0 reads it into host
    memory and the others build it on the meta device; each rank's GPU receives only its shards."""
    path = cfg.model.ref_path or build.policy_path(cfg, log=log)
    sharded = strategy.equal_forwards and strategy.world > 1
    local = shard_reads.shard_source(path) if sharded else None  # each rank reads its own shards
    reads = local is not None
    where = ("meta" if strategy.rank > 0 or reads else "cpu") if strategy.equal_forwards else device
    ref, _ = components.load_model(cfg, path, device=where)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    full = ref.state_dict() if strategy.equal_forwards and strategy.rank == 0 and not reads else None
    ref = strategy.prepare_frozen(ref)
    if sharded:
        sharding.materialize(ref, device, full, broadcast=not reads)
    if local is not None:
        shard_reads.read_own_shards(ref, local)
    log(f"KL reference policy: {path}")
    return ref


def collector_settings(cfg: Config) -> CollectorSettings:
    return CollectorSettings(
        algorithm=cfg.algorithm,
        rollout=cfg.rollout,
        trainer=cfg.trainer,
        seed=cfg.run.seed,
        data_wait_s=cfg.timeouts.data_wait_s,
    )


def make_collector(cfg: Config, engine: Engine, tokenizer: Any, tasks: Sequence[Task]) -> Collector:
    """The rollouts of ``cfg`` on ``engine``, sampling the training ``tasks`` (``run.seed``)."""
    sampler = TaskSampler(list(tasks), cfg.run.seed)
    return Collector(collector_settings(cfg), engine, runner_factory(cfg, tokenizer), sampler)


def runner_factory(cfg: Config, tokenizer: Any) -> RunnerFactory:
    """``(engine, seed) -> runner``: ``build.build_runner`` of ``cfg``, for the rollouts."""
    return lambda engine, seed: build.build_runner(cfg, engine, tokenizer, seed=seed)


def eval_runner(cfg: Config, engine: Engine, tokenizer: Any) -> EpisodeRunner:
    """The runner ``evaluation.evaluate`` samples with: ``eval.temperature``, its own seed."""
    seed = cfg.run.seed + EVAL_SEED_OFFSET
    return build.build_runner(cfg, engine, tokenizer, seed=seed, temperature=cfg.eval.temperature)


def sync_settings(cfg: Config) -> SyncSettings:
    s = cfg.rollout.sync
    return SyncSettings(s.bucket_mb, s.verify, s.probe_tokens, s.probe_atol, cfg.timeouts.weight_sync_s)


def push_settings(cfg: Config) -> PushSettings:
    return PushSettings(
        sync=sync_settings(cfg),
        colocate=cfg.rollout.colocate,
        sleep_wake_s=cfg.timeouts.sleep_wake_s,
        bf16=cfg.trainer.bf16,
        engine_dtype=components.engine_dtype(cfg),
    )


def make_run_state(
    cfg: Config, root_dir: Path, run_dir: Path, rank: int, world: int, log: Callable[[str], None]
) -> RunState:
    return RunState(cfg.trainer.keep_checkpoints, cfg.run.seed, root_dir, run_dir, rank, world, log)
