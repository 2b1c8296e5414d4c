"""Which policy ``agentrl eval`` and ``agentrl serve`` use, and its engine: given a run directory,
its newest checkpoint (the trained policy) or the one ``--checkpoint`` names (``step_N`` among the
run's checkpoints, or a checkpoint directory); given a config file, the policy the config starts from
(warm-started when ``sft.enabled``). A checkpoint of any format loads: full HF weights, a LoRA
adapter (merged into its base) or FSDP2 shards (joined), and the engine takes the checkpoint's
weight version, so what it generates is stamped with the version that trained it."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentrl.assembly import build, components
from agentrl.assembly.export import checkpoint_model
from agentrl.config import Config, ConfigError
from agentrl.engines.base import Engine
from agentrl.training.checkpoint import STATE_FILE, latest_checkpoint, list_checkpoints


@dataclass
class Policy:
    path: str
    """The model directory or checkpoint."""
    label: str
    """``step_N`` for a checkpoint, ``start`` for the policy a config starts from."""
    run_dir: Path | None = None


def chosen_policy(config: str | None, checkpoint: str | None, cfg: Config, verb: str) -> Policy:
    """The policy to ``verb`` (module docstring). ``config``: the command's CONFIG argument (a run
    directory or a config file); ``checkpoint``: ``--checkpoint``."""
    run_dir = Path(config) if config and Path(config).is_dir() else None
    if checkpoint:
        path = Path(checkpoint)
        if not (path / "config.json").is_file() and run_dir is not None:
            path = run_dir / "checkpoints" / checkpoint  # step_N, among the run's
        if not (path / "config.json").is_file():
            have = [p.name for p in list_checkpoints(run_dir)] if run_dir else []
            raise ConfigError(
                f"--checkpoint {checkpoint}: not a model directory (no config.json); a run's checkpoints are "
                f"RUN/checkpoints/step_N{f' (this run has {have})' if have else ''}"
            )
        return Policy(str(path), path.name, run_dir)
    newest = latest_checkpoint(run_dir) if run_dir else None
    if newest is not None:
        return Policy(str(newest), newest.name, run_dir)
    if run_dir:
        print(f"{run_dir} has no checkpoint yet: {verb} the policy it starts from", file=sys.stderr)
    return Policy(start_policy(cfg).path, "start", run_dir)


def start_policy(cfg: Config, log: Callable[[str], None] = print) -> Policy:
    """The policy a config starts from: its model, warm-started when ``sft.enabled``."""
    return Policy(build.policy_path(cfg, log=log), "start")


def loaded_policy(cfg: Config, policy: Policy) -> tuple[torch.nn.Module, Any, Engine]:
    """``policy``'s model, tokenizer and engine (a checkpoint of any format: adapters merged, shards
    joined; the engine at the checkpoint's weight version)."""
    path = policy.path
    state_file = Path(path) / STATE_FILE
    if state_file.exists():
        model, tokenizer = checkpoint_model(Path(path), cfg.model.dtype)
        model = model.to(components.device_of(cfg))
    else:
        model, tokenizer = components.load_model(cfg, path)
    engine = build.build_engine(cfg, model, tokenizer, path)
    if state_file.exists():
        version = int(torch.load(state_file, weights_only=False, map_location="cpu").get("engine_version", 0))
        while engine.version < version:  # engines count their own loads: the checkpoint's version
            engine.load_weights({})
    return model, tokenizer, engine


def policy_engine(cfg: Config, policy: Policy) -> tuple[Engine, Any]:
    """The engine and tokenizer for ``policy`` (``loaded_policy``)."""
    _, tokenizer, engine = loaded_policy(cfg, policy)
    return engine, tokenizer
