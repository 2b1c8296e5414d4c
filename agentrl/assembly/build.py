"""Assemble a run from its config: the policy to start from (the SFT warm start, cached), the engine
(in this process, or a pool of Ray rollout workers) and the runner that drives it. Shared by
``train``, ``rollout``, ``sft``, ``eval`` and the study; the in-process pieces are in ``components``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from agentrl.assembly import components
from agentrl.assembly.sft import run_sft
from agentrl.config import Config, ConfigError, config_to_yaml
from agentrl.engines.base import Engine
from agentrl.models import cache_root, resolve_model_path
from agentrl.parallel import ranks, shard_reads, sharding
from agentrl.parallel.engine_group import AbsentEngine, FollowerEngine, LeaderEngine
from agentrl.parallel.placement import Placement
from agentrl.parallel.placement import render as render_placement
from agentrl.rollout.ray_workers import RayEpisodeRunner, RolloutPool
from agentrl.rollout.runner import EpisodeRunner, SamplingOverride
from agentrl.seeds import deterministic_kernels
from agentrl.training import lora
from agentrl.training.sft import sft_seed, trains_adapters
from agentrl.training.warm_start_inputs import describe as describe_inputs
from agentrl.training.warm_start_inputs import warm_start_inputs


def inputs_of(cfg: Config, base: str) -> dict[str, str]:
    """``warm_start_inputs`` of the warm start of ``cfg`` from ``base``."""
    return warm_start_inputs(base, components.env_class(cfg), cfg.env.module, cfg.data, cfg.sft.demos)


def warm_start_key(cfg: Config, base: str) -> str:
    """Cache key of a warm-started model: everything that changes what SFT produces, the contents of
    its inputs included (``warm_start_inputs``: the model, the environment's code, the data and
    demonstrations files)."""
    s = cfg.sft
    payload = {
        "base": base,
        "inputs": inputs_of(cfg, base),
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
        "seed": sft_seed(cfg.sft, cfg.run.seed),
        "version": 2,
    }
    if s.exclude_train_seeds:  # only when set, so existing keys (and caches) stay valid
        payload["exclude_train_seeds"] = sorted(s.exclude_train_seeds)
    if s.num_tasks is not None:
        payload["num_tasks"] = s.num_tasks
    if s.holdout > 0:
        payload["holdout"] = [s.holdout, s.eval_every, s.patience]
    if cfg.rollout.context.policy == "compact":  # the summaries may be demonstrated too (assembly/sft.py)
        payload["compaction"] = cfg.rollout.context.summary_prompt or "the environment's request"
    if trains_adapters(cfg.sft, cfg.model.lora):  # a LoRA warm start (keys of full ones stay as they were)
        payload["lora"] = lora.settings_dict(cfg.model.lora)
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
    (``run.output_dir/warm_start``) and nothing is written to the cache.

    Under torchrun this is collective (every rank calls it at the same point): rank 0 trains the warm
    start while the others wait for it (``timeouts.warm_start_s``), then every rank reads it. A node
    that cannot see rank 0's directory (a cache on a disk of its own) has its first rank train it
    again there while that node's other ranks wait; one that fails stops every rank, named."""
    base = resolve_model_path(cfg.model.path)
    if not cfg.sft.enabled:
        return base
    key = warm_start_key(cfg, base)
    out = Path(warm_start_dir(cfg, base))
    rank, world = ranks.rank_and_world()
    if world == 1:
        return str(_warm_start(cfg, base, key, out, log))
    wait = (
        cfg.timeouts.warm_start_s,
        "the SFT warm start",
        f"timeouts.warm_start_s={cfg.timeouts.warm_start_s:g}s",
    )
    ranks.builders_first(rank == 0, lambda: _warm_start(cfg, base, key, out, log), *wait)
    views = ranks.gather_parts([(socket.gethostname(), _found(cfg, out, key))])
    blind = [(r, host) for r, (host, seen) in enumerate(views) if not seen]
    builders = {min(r for r, h in blind if h == host) for _, host in blind}
    if builders:
        if rank in builders:
            log(
                f"warm start: rank 0's {out} is not visible on this node ({socket.gethostname()}): training it here"
            )
        ranks.builders_first(rank in builders, lambda: _warm_start(cfg, base, key, out, log), *wait)
    if not _found(cfg, out, key):
        raise RuntimeError(f"warm start: {out} is missing on rank {rank} after it was trained on this node")
    return str(out)


def _found(cfg: Config, out: Path, key: str) -> bool:
    """Is the warm start of ``key`` in ``out``? A cache directory is named by its key (older ones
    have no key file)."""
    stored = _read(out / KEY_FILE)
    return (out / "config.json").exists() and (stored == key or (cfg.sft.cache and stored is None))


def _warm_start(cfg: Config, base: str, key: str, out: Path, log: Callable[[str], None]) -> Path:
    """The warm start of ``key`` in ``out``: found there, or trained in a directory of this process
    and published by one rename (``_publish``)."""
    if _found(cfg, out, key):
        matched = describe_inputs(inputs_of(cfg, base))
        log(
            f"warm start: using {'cached ' if cfg.sft.cache else ''}SFT model {out} (the same {matched}, and settings)"
        )
        return out
    tmp = out.with_name(f"{out.name}.tmp-{socket.gethostname()}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        run_sft(cfg, base, tmp, log=log)
    except BaseException:  # stopped or failed: no half-trained warm start is left behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    (tmp / "agentrl_config.yaml").write_text(config_to_yaml(cfg))
    (tmp / KEY_FILE).write_text(key)
    _publish(tmp, out, key)
    return out


def _read(path: Path) -> str | None:
    return path.read_text().strip() if path.exists() else None


def _publish(tmp: Path, out: Path, key: str) -> None:
    """Move the finished ``tmp`` to ``out`` by one rename, never deleting what another process may
    be reading: when ``out`` already holds this key's warm start (another run published it first),
    ``tmp`` is dropped; anything else there (another key's, a half-written one) is renamed aside
    first. Atomic on one filesystem, a shared one included (a rename is atomic on NFS and Lustre)."""
    try:
        os.rename(tmp, out)  # refused when out is a directory with files in it
        return
    except OSError:
        if _read(out / KEY_FILE) == key and (out / "config.json").exists():
            shutil.rmtree(tmp, ignore_errors=True)
            return
    aside = out.with_name(f"{out.name}.stale-{socket.gethostname()}-{os.getpid()}")
    os.rename(out, aside)
    os.rename(tmp, out)
    shutil.rmtree(aside, ignore_errors=True)


def join_run(cfg: Config, log: Callable[[str], None] = print) -> tuple[torch.device, int, int, Placement]:
    """This process's place in the run: its device (``run.deterministic``'s settings made before CUDA
    starts, as cuBLAS needs), its rank and the world under torchrun (``ranks.init_from_env``: a
    collective some rank never joins raises), and the run's placement (``run_placement``)."""
    device = components.device_of(cfg)
    if cfg.run.deterministic:
        for note in deterministic_kernels(device):
            log(note)
    rank, world = ranks.init_from_env(timeout_s=cfg.timeouts.collective_s)
    return device, rank, world, run_placement(cfg, rank, world, log)


def run_placement(cfg: Config, rank: int, world: int, log: Callable[[str], None] = print) -> Placement:
    """This process's placement (``parallel/placement.py``, from torchrun's variables and the GPUs torch
    sees): a map that cannot work is a ``ConfigError`` naming the settings to change; rank 0 logs the
    map of a run of several processes; every rank learns which ranks run episodes (collective)."""
    where = components.placement(cfg)
    if not where.ok:
        raise ConfigError(
            "the run's placement cannot work: " + "; ".join(f"{p.key}: {p.message}" for p in where.problems)
        )
    if rank == 0 and (world > 1 or cfg.rollout.workers > 0):
        for line in render_placement(where):
            log(line)
    ranks.configure_rollouts(where.episode_ranks, cfg.timeouts.data_wait_s)
    return where


def build_engine(
    cfg: Config,
    model: torch.nn.Module | None,
    tokenizer: Any,
    path: str,
    where: Placement | None = None,
    rank: int = 0,
) -> Engine:
    """Trainer ``rank``'s generation engine, where the placement (``parallel/placement.py``; by default
    this process's) puts it: in this process (``components.local_engine``); with ``rollout.workers``
    > 0 a pool of Ray workers, each holding such an engine, on rank 0 and none on the other ranks
    (``AbsentEngine``: rank 0 runs their episodes), which wait for the pool to start at a barrier
    bounded by the pool's own limits (not ``timeouts.collective_s``: starting N engines can take
    longer than any collective); a colocated vLLM engine that spans several ranks
    (tensor parallelism) led by its first rank and followed by the others (``engine_group.py``).
    Under torchrun every rank calls this at the same point: the engines' process groups are made
    collectively."""
    where = where or components.placement(cfg)
    if cfg.rollout.workers > 0:  # every rank waits for the pool, bounded by the pool's own limits
        runs = rank in where.episode_ranks
        limit = components.pool_settings(cfg).start_limit_s
        setting = f"2 × timeouts.ray_call_s={cfg.timeouts.ray_call_s:g}s (the workers' reservation, then their start)"
        pool = ranks.builders_first(
            runs,
            lambda: components.rollout_pool(cfg, path, where),
            limit,
            "starting the Ray rollout workers",
            setting,
        )
        return pool if runs else AbsentEngine()  # type: ignore[return-value]
    engine = components.local_engine(cfg, model, tokenizer, path)
    spans = [site.ranks for site in where.engines if len(site.ranks) > 1]
    if not spans:
        return engine
    group = ranks.subgroup(spans, cfg.timeouts.data_wait_s)  # the leaders' calls travel over it
    site = where.engine_of(rank)
    assert site is not None and group is not None
    if rank == site.ranks[0]:
        return LeaderEngine(engine, group, rank, seed=cfg.run.seed)  # type: ignore[return-value]
    return FollowerEngine(engine, group, site.ranks[0])  # type: ignore[return-value]


def build_runner(
    cfg: Config,
    engine: Engine,
    tokenizer: Any,
    seed: int | None = None,
    override: SamplingOverride | None = None,
) -> EpisodeRunner:
    """The runner for ``engine``: a Ray pool splits episodes across its workers, a local engine gets
    the EpisodeRunner of ``rollout.runner``."""
    if isinstance(engine, RolloutPool):
        return RayEpisodeRunner(engine, seed, override)  # type: ignore[return-value]
    return components.local_runner(cfg, engine, tokenizer, seed, override)


def reference_model(
    cfg: Config, strategy: sharding.Strategy, device: torch.device, log: Callable[[str], None]
) -> torch.nn.Module:
    """The frozen reference policy of the KL penalty: ``model.ref_path``, else the policy RL started
    from (the warm start; on a resume too, never the checkpoint). It costs one more copy of the
    weights in ``model.dtype`` (sharded like the policy; no gradients, no optimizer state) and one
    forward per step. Sharded, it loads as the policy does: each rank reads its own shards when every
    rank sees the checkpoint's files (``parallel/shard_reads.py``), else rank 0 reads it into host
    memory and the others build it on the meta device; each rank's GPU receives only its shards."""
    path = cfg.model.ref_path or policy_path(cfg, log=log)
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
