"""Evaluation from a config: the runner of ``eval.*`` on an engine, then ``training/evaluation.py``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentrl.assembly import build
from agentrl.config import Config
from agentrl.engines.base import Engine
from agentrl.env import Task
from agentrl.episode import Episode
from agentrl.rollout.runner import SamplingOverride
from agentrl.training.evaluation import EVAL_SEED, Gather, evaluate_with


def evaluate(
    cfg: Config,
    engine: Engine,
    tokenizer: Any,
    tasks: Sequence[Task],
    k: int | None = None,
    gather: Gather | None = None,
) -> tuple[dict[str, float], list[Episode]]:
    """mean@k and pass@k of ``engine``'s policy on ``tasks`` (``k``: ``eval.k`` unless given), sampled
    at ``eval.temperature`` and ``eval.top_p`` (``training/evaluation.py`` ``evaluate_with``)."""
    override = SamplingOverride(temperature=cfg.eval.temperature, top_p=cfg.eval.top_p)
    runner = build.build_runner(cfg, engine, tokenizer, seed=cfg.run.seed + EVAL_SEED, override=override)
    return evaluate_with(runner, tasks, k or cfg.eval.k, gather)
