"""The settings records training's parts take, built from the whole config: each part reads its
own sections and plain values (``LearnerSettings``, ``CollectorSettings``, ``PushSettings``), never
the ``Config``."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from agentrl.assembly import build, components
from agentrl.config import Config, weighting_name, weighting_settings
from agentrl.parallel import sharding
from agentrl.sync.weight_sync import SyncSettings
from agentrl.training.collect import CollectorSettings
from agentrl.training.learner import Learner, LearnerSettings
from agentrl.training.run_state import RunState
from agentrl.training.weight_push import PushSettings


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
    """The ``Learner`` of ``cfg`` for the loaded policy ``model``; its KL reference, when it needs
    one, is built by ``build.reference_model``."""
    strategy = strategy or sharding.Replicated(0, 1, next(model.parameters()).device)
    reference = partial(build.reference_model, cfg, strategy, strategy.device, log)  # built with KL only
    return Learner(learner_settings(cfg), model, pad_id, strategy, log, reference, shards_from=shards_from)


def collector_settings(cfg: Config) -> CollectorSettings:
    return CollectorSettings(
        algorithm=cfg.algorithm,
        rollout=cfg.rollout,
        trainer=cfg.trainer,
        seed=cfg.run.seed,
        data_wait_s=cfg.timeouts.data_wait_s,
    )


def sync_settings(cfg: Config) -> SyncSettings:
    s = cfg.rollout.sync
    return SyncSettings(s.bucket_mb, s.verify, s.probe_tokens, s.probe_atol, cfg.timeouts.weight_sync_s)


def push_settings(cfg: Config) -> PushSettings:
    return PushSettings(
        sync=sync_settings(cfg),
        colocate=cfg.rollout.colocate,
        sleep_wake_s=cfg.timeouts.sleep_wake_s,
        bf16=cfg.trainer.computes_bf16,
        engine_dtype=components.engine_dtype(cfg),
    )


def make_run_state(
    cfg: Config, root_dir: Path, run_dir: Path, rank: int, world: int, log: Callable[[str], None]
) -> RunState:
    return RunState(cfg.trainer.keep_checkpoints, cfg.run.seed, root_dir, run_dir, rank, world, log)
