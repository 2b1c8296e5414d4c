"""Build the pieces a run needs from its config: policy (with the SFT warm start), engine,
environment factory, tasks and the EpisodeRunner. Shared by ``train``, ``rollout``, ``sft``, ``eval``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from typing import Any

import torch

from agentrl.config import Config, config_to_yaml
from agentrl.engines.base import Engine, SamplingParams
from agentrl.env import Environment, Task, import_environment_module, make_env, registered
from agentrl.runner import Budgets, EpisodeRunner


def device_of(cfg: Config) -> str:
    if cfg.run.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return cfg.run.device


def env_factory(cfg: Config) -> Callable[[], Environment]:
    if cfg.env.module:
        import_environment_module(cfg.env.module)
    envs = registered()
    if cfg.env.name not in envs:
        make_env(cfg.env.name)  # raises with a did-you-mean and the registered names
    options = dict(cfg.env.options)
    env_cls = envs[cfg.env.name]
    if hasattr(env_cls, "backend") and hasattr(env_cls, "sandbox"):  # sandboxed environments
        options.setdefault("backend", cfg.sandbox.backend)
        options.setdefault("sandbox", sandbox_options(cfg))
    return functools.partial(make_env, cfg.env.name, **options)


def sandbox_options(cfg: Config) -> dict[str, Any]:
    """The ``sandbox`` section as keyword arguments of ``sandboxes.make_sandbox``."""
    s, lim = cfg.sandbox, cfg.sandbox.limits
    opts: dict[str, Any] = {
        "limits": {
            "wall_s": lim.wall_s,
            "cpu_s": lim.cpu_s,
            "memory_bytes": lim.memory_mb * 2**20,
            "processes": lim.max_procs,
            "output_bytes": lim.output_bytes,
            "file_bytes": lim.file_size_mb * 2**20,
        },
    }
    if s.backend == "unisolated":
        opts["allow_unisolated"] = s.allow_unisolated
    if s.backend == "docker":
        opts["image"] = s.docker_image
    if s.backend == "e2b" and s.e2b_template:
        opts["template"] = s.e2b_template
    return opts


def load_tasks(cfg: Config, split: str, seed: int | None = None) -> list[Task]:
    """Tasks for ``split`` ("train" or "test") from the environment's generator or a dataset, drawn
    with ``seed`` (default ``run.seed``)."""
    n = cfg.data.num_train if split == "train" else cfg.data.num_test
    seed = cfg.run.seed if seed is None else seed
    if cfg.data.source == "builtin":
        if cfg.env.module:
            import_environment_module(cfg.env.module)
        env_cls = registered()[cfg.env.name]
        return env_cls.load_tasks(split, n=n, seed=seed, **cfg.data.options)
    from agentrl.data import load_tasks_from_source

    return load_tasks_from_source(
        source=cfg.data.source,
        path=cfg.data.path or "",
        adapter=cfg.data.adapter,
        columns=dict(cfg.data.columns),
        split=cfg.data.train_split if split == "train" else cfg.data.test_split,
        n=n,
        seed=seed,
        **cfg.data.options,
    )


# -- policy and warm start ----------------------------------------------------------------------
def sft_seed(cfg: Config) -> int:
    """The warm start's seed: ``sft.seed``, else ``run.seed``."""
    return cfg.run.seed if cfg.sft.seed is None else cfg.sft.seed


def warm_start_key(cfg: Config, base: str) -> str:
    """Cache key of a warm-started model: everything that changes what SFT produces."""
    payload = {
        "base": base,
        "env": cfg.env.name,
        "env_options": cfg.env.options,
        "data": [cfg.data.source, cfg.data.path, cfg.data.options],
        "sft": {
            k: getattr(cfg.sft, k) for k in ("demos", "num_demos", "steps", "epochs", "lr", "batch_size")
        },
        "seed": sft_seed(cfg),
        "version": 1,
    }
    if cfg.sft.exclude_train_seeds:  # only when set, so existing keys (and caches) stay valid
        payload["exclude_train_seeds"] = sorted(cfg.sft.exclude_train_seeds)
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def policy_path(cfg: Config, log: Callable[[str], None] = print) -> str:
    """The model directory to start RL from: the configured model, warm-started by SFT first when
    ``sft.enabled`` (cached, so later runs start at once)."""
    from agentrl.models import cache_root, resolve_model_path

    base = resolve_model_path(cfg.model.path)
    if not cfg.sft.enabled:
        return base
    out = cache_root() / "warmstart" / warm_start_key(cfg, base)
    if cfg.sft.cache and (out / "config.json").exists():
        log(f"warm start: using cached SFT model {out}")
        return str(out)
    from agentrl.sft import run_sft

    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    run_sft(cfg, base, tmp, log=log)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    (out / "agentrl_config.yaml").write_text(config_to_yaml(cfg))
    return str(out)


def load_model(cfg: Config, path: str) -> tuple[torch.nn.Module, Any]:
    from agentrl.models import load_policy

    return load_policy(path, dtype=cfg.model.dtype, device=device_of(cfg))


# -- engine and runner --------------------------------------------------------------------------
def build_engine(cfg: Config, model: torch.nn.Module, tokenizer: Any, path: str) -> Engine:
    """The generation engine. The HF engine gets its own copy of the weights, synced after each
    update through ``load_weights`` exactly like vLLM's, so both paths behave the same. With
    ``rollout.workers`` > 0 it is a pool of Ray workers, each holding such an engine."""
    if cfg.rollout.workers > 0:
        from agentrl.ray_workers import RolloutPool

        return RolloutPool.from_config(cfg, path)
    if cfg.rollout.engine == "hf":
        import copy

        from agentrl.engines.hf import HFEngine

        engine_model = copy.deepcopy(model).eval()
        for p in engine_model.parameters():
            p.requires_grad_(False)
        return HFEngine(engine_model, tokenizer=tokenizer, device=device_of(cfg))
    from agentrl.engines.vllm import VLLMEngine  # type: ignore[import-not-found]

    return VLLMEngine.from_config(cfg, path, tokenizer)


def sampling_params(cfg: Config, seed: int | None = None, temperature: float | None = None) -> SamplingParams:
    return SamplingParams(
        temperature=cfg.rollout.temperature if temperature is None else temperature,
        top_p=cfg.rollout.top_p,
        top_k=cfg.rollout.top_k,
        seed=seed,
    )


def build_runner(
    cfg: Config, engine: Engine, tokenizer: Any, seed: int | None = None, temperature: float | None = None
) -> EpisodeRunner:
    from agentrl.ray_workers import RayEpisodeRunner, RolloutPool

    if isinstance(engine, RolloutPool):
        return RayEpisodeRunner(engine, seed, temperature)  # type: ignore[return-value]
    budgets = Budgets(
        max_turns=cfg.rollout.max_turns,
        max_tokens_per_turn=cfg.rollout.max_tokens_per_turn,
        max_episode_tokens=cfg.rollout.max_episode_tokens,
        max_tool_output_tokens=cfg.rollout.max_tool_output_tokens,
    )
    if cfg.rollout.runner == "async":
        from agentrl.async_runner import AsyncEpisodeRunner

        return AsyncEpisodeRunner(
            engine,
            tokenizer,
            env_factory(cfg),
            budgets=budgets,
            sampling=sampling_params(cfg, seed, temperature),
            max_concurrent_episodes=cfg.rollout.max_concurrent_episodes,
        )
    return EpisodeRunner(
        engine,
        tokenizer,
        env_factory(cfg),
        budgets=budgets,
        sampling=sampling_params(cfg, seed, temperature),
        env_workers=min(64, cfg.rollout.max_concurrent_episodes),
    )
