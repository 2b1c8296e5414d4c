"""Assemble a run from its config: the policy to start from (the SFT warm start, cached), the engine
(in this process, or a pool of Ray rollout workers) and the runner that drives it. Shared by
``train``, ``rollout``, ``sft``, ``eval`` and the study; the in-process pieces are in ``components``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from agentrl.config import Config, config_to_yaml
from agentrl.engines.base import Engine
from agentrl.models import cache_root, resolve_model_path
from agentrl.rollout import components
from agentrl.rollout.ray_workers import RayEpisodeRunner, RolloutPool
from agentrl.rollout.runner import EpisodeRunner
from agentrl.training.sft import run_sft, sft_seed


def warm_start_key(cfg: Config, base: str) -> str:
    """Cache key of a warm-started model: everything that changes what SFT produces."""
    s = cfg.sft
    payload = {
        "base": base,
        "env": cfg.env.name,
        "env_options": cfg.env.options,
        "data": [cfg.data.source, cfg.data.path, cfg.data.options],
        "sft": {
            "demos": s.demos,
            "num_demos": s.num_demos,
            "steps": s.steps,
            "epochs": s.epochs,
            "lr": s.lr,
            "batch_size": s.batch_size,
        },
        "seed": sft_seed(cfg),
        "version": 1,
    }
    if s.exclude_train_seeds:  # only when set, so existing keys (and caches) stay valid
        payload["exclude_train_seeds"] = sorted(s.exclude_train_seeds)
    if s.num_tasks is not None:
        payload["num_tasks"] = s.num_tasks
    if s.holdout > 0:
        payload["holdout"] = [s.holdout, s.eval_every, s.patience]
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


KEY_FILE = "warm_start_key.txt"


def warm_start_dir(cfg: Config, base: str | None = None) -> str:
    """Where ``policy_path`` keeps (or would keep) the model RL starts from, without building it:
    the configured model itself when SFT is off."""
    base = base or resolve_model_path(cfg.model.path)
    if not cfg.sft.enabled:
        return base
    if cfg.sft.cache:
        return str(cache_root() / "warmstart" / warm_start_key(cfg, base))
    return str(Path(cfg.run.output_dir or ".") / "warm_start")


def policy_path(cfg: Config, log: Callable[[str], None] = print) -> str:
    """The model directory to start RL from: the configured model, warm-started by SFT first when
    ``sft.enabled``. With ``sft.cache`` the warm start is kept in the cache (``$AGENTRL_CACHE``) and
    reused by any run with the same key; without it, it goes into the run directory
    (``run.output_dir/warm_start``) and nothing is written to the cache."""
    base = resolve_model_path(cfg.model.path)
    if not cfg.sft.enabled:
        return base
    key = warm_start_key(cfg, base)
    out = Path(warm_start_dir(cfg, base))
    stored = _read(out / KEY_FILE)  # a cache directory is named by its key (older ones have no key file)
    if (out / "config.json").exists() and (stored == key or (cfg.sft.cache and stored is None)):
        log(f"warm start: using {'cached ' if cfg.sft.cache else ''}SFT model {out}")
        return str(out)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    run_sft(cfg, base, tmp, log=log)
    (tmp / "agentrl_config.yaml").write_text(config_to_yaml(cfg))
    (tmp / KEY_FILE).write_text(key)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return str(out)


def _read(path: Path) -> str | None:
    return path.read_text().strip() if path.exists() else None


def build_engine(cfg: Config, model: torch.nn.Module | None, tokenizer: Any, path: str) -> Engine:
    """The generation engine: in this process (``components.local_engine``), or with
    ``rollout.workers`` > 0 a pool of Ray workers, each holding such an engine."""
    if cfg.rollout.workers > 0:
        return RolloutPool.from_config(cfg, path)
    return components.local_engine(cfg, model, tokenizer, path)


def build_runner(
    cfg: Config, engine: Engine, tokenizer: Any, seed: int | None = None, temperature: float | None = None
) -> EpisodeRunner:
    """The runner for ``engine``: a Ray pool splits episodes across its workers, a local engine gets
    the EpisodeRunner of ``rollout.runner``."""
    if isinstance(engine, RolloutPool):
        return RayEpisodeRunner(engine, seed, temperature)  # type: ignore[return-value]
    return components.local_runner(cfg, engine, tokenizer, seed, temperature)
