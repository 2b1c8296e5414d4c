"""A trainer from a config: every input checked, the run directory claimed, the policy, its engine
and the loop's parts built, a checkpoint loaded on a resume; then ``train`` runs it.

Nothing is written before every input has been checked (``preflight``) and, on a resume, the
checkpoint loaded: the resolved config (``config.yaml``, atomically, the one it replaces kept as
``config.prev.yaml``) and the session's line in ``history.jsonl`` come last."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.assembly import build, components, precision, preflight, records
from agentrl.assembly.evaluation import evaluate
from agentrl.config import Config, config_to_dict, output_dir, save_config
from agentrl.engines.base import Engine
from agentrl.env.data import TaskSampler
from agentrl.models import resolve_model_path
from agentrl.parallel import ranks, shard_reads, sharding
from agentrl.parallel.sharding import Strategy
from agentrl.rollout.pipeline import EngineGate
from agentrl.rollout.runner import MakeRunner
from agentrl.seeds import seed_everything
from agentrl.training import lora
from agentrl.training.checkpoint import (
    check_resumable,
    existing_run,
    move_aside,
    refuse_existing_run,
    weights_record,
)
from agentrl.training.collect import Collector
from agentrl.training.metrics import MetricsLogger
from agentrl.training.run_lock import RunLock
from agentrl.training.trainer import (
    LoopSettings,
    Trainer,
    TrainerParts,
    sigterm_as_interrupt,
    stop_after_step_on_signal,
)
from agentrl.training.weight_push import WeightPush
from agentrl.transcripts import TranscriptWriter


def make_trainer(
    cfg: Config, log: Callable[[str], None] = print, overwrite: bool = False, force: bool = False
) -> Trainer:
    """``overwrite``: move a run already in ``run.output_dir`` aside (to ``<dir>.old-<n>``) instead of
    refusing to start; without it (and without ``run.resume``) an existing run is an error.
    ``force``: a resume may change keys a run cannot take mid-way (``run_history.FIXED_MID_RUN``);
    the run's history records it."""
    checked = checked_inputs(cfg, force, log)
    # device, rank under torchrun, where every process lives: a map that cannot work stops here
    device, rank, world, placement = build.join_run(cfg, log)
    cfg, as_given = precision.resolved(cfg, device, log), cfg  # trainer.bf16: auto decided; `auto` saved
    components.say_slow_bf16(cfg, device, log)  # emulated bf16 on this CPU: many times slower
    # the layout over the ranks (sharding.py): an HSDP mesh that does not fit fails here, first
    strategy = sharding.make_strategy(cfg.trainer, rank, world, device)
    if lora.enabled(cfg.model.lora):  # target modules that match nothing fail before any work, too
        lora.check_targets(components.meta_model(cfg.model.path, cfg.model.dtype), cfg.model.lora)
    root_dir = output_dir(cfg)  # rank 0's; checkpoints
    # one process trains a run directory at a time (run_lock.py); held until train() returns
    run_lock = RunLock(root_dir) if rank == 0 else None
    claim_run_dir(cfg, root_dir, rank, overwrite, log)
    # other ranks keep their own copy of the run's files
    run_dir = root_dir / "ranks" / str(rank) if rank else root_dir
    seed_everything(cfg.run.seed)
    state = records.make_run_state(cfg, root_dir, run_dir, rank, world, log)
    ckpt, saved = state.resume_point() if cfg.run.resume else (None, None)
    policy = PolicyAndEngine(cfg, strategy, placement, rank, log, ckpt, saved)
    pad_id = policy.tokenizer.pad_token_id or 0
    learner = records.make_learner(cfg, policy.model, pad_id, strategy, log, shards_from=policy.shards_from)
    assert checked.train_tasks is not None
    sampler = TaskSampler(checked.train_tasks, cfg.run.seed)
    rollouts = Collector(
        records.collector_settings(cfg), policy.engine, sampler, runner_maker(cfg, policy.tokenizer)
    )
    weights = WeightPush(records.push_settings(cfg), learner, policy.engine)
    start_step = 0
    if ckpt and saved:  # cuts metrics/transcripts back to the checkpoint before we append
        start_step = state.restore(ckpt, saved, learner, rollouts, weights)
    record_start(as_given, root_dir, run_dir, rank, start_step, ckpt, checked.resume)
    parts = TrainerParts(
        learner=learner,
        rollouts=rollouts,
        weights=weights,
        state=state,
        tokenizer=policy.tokenizer,
        base_path=policy.base_path,
        root_dir=root_dir,
        run_dir=run_dir,
        rank=rank,
        world=world,
        start_step=start_step,
        train_tasks=checked.train_tasks,
        test_tasks=checked.test_tasks,
        evaluate=held_out(cfg, policy.tokenizer, checked.test_tasks, rollouts),
        transcripts=TranscriptWriter(run_dir / "transcripts.jsonl"),
        metrics=metrics_logger(cfg, run_dir, start_step),
        run_lock=run_lock,
    )
    return Trainer(LoopSettings(cfg.trainer, cfg.logging, cfg.rollout.max_episode_tokens), parts, log)


def checked_inputs(cfg: Config, force: bool, log: Callable[[str], None]) -> preflight.CheckedInputs:
    """Every input checked before any work (``preflight``), the threads set."""
    # the held-out tasks too when they are evaluated or split from the training data (the log says how many)
    test = bool(cfg.trainer.eval_every) or (components.shared_rows(cfg) and cfg.data.test_fraction > 0)
    checked = preflight.check_inputs(cfg, train=True, test=test, force=force)
    for note in checked.notes:
        log(note)
    components.apply_threads(cfg, log)
    return checked


def record_start(
    cfg: Config,
    root_dir: Path,
    run_dir: Path,
    rank: int,
    start_step: int,
    ckpt: Path | None,
    resume: preflight.ResumeChanges | None,
) -> None:
    """Every input checked and the checkpoint loaded: the resolved config, then the session's line."""
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run_dir, keep_previous=True)
    if rank == 0:
        preflight.record_session(root_dir, start_step, ckpt.name if ckpt else None, resume)


def metrics_logger(cfg: Config, run_dir: Path, start_step: int) -> MetricsLogger:
    return MetricsLogger(
        run_dir,
        tensorboard=cfg.logging.tensorboard,
        wandb_project=cfg.logging.wandb_project if cfg.logging.wandb else None,
        config=config_to_dict(cfg),
        every=cfg.logging.log_every,
        start_step=start_step,
    )


def runner_maker(cfg: Config, tokenizer: Any) -> MakeRunner:
    """The runner for an engine (``build.build_runner``), as the collector asks for it."""
    return lambda engine, seed, override: build.build_runner(cfg, engine, tokenizer, seed, override)


def claim_run_dir(
    cfg: Config, root_dir: Path, rank: int, overwrite: bool, log: Callable[[str], None]
) -> None:
    """Before any work: a new run never writes into a directory that holds another one."""
    if cfg.run.resume:
        return
    if overwrite and rank == 0 and existing_run(root_dir):
        log(f"--overwrite: moved the previous run to {move_aside(root_dir)}")
    ranks.broadcast_from_rank0(None)  # every rank waits for the move
    refuse_existing_run(root_dir)


def held_out(
    cfg: Config, tokenizer: Any, test_tasks: list | None, rollouts: Collector
) -> Callable[[Engine], dict[str, float]]:
    """The loop's evaluation: ``eval.split``'s tasks (the held-out split already loaded, when it is
    the one), at most ``eval.num_tasks`` of them, on the engine it is given."""

    def run(engine: Engine) -> dict[str, float]:
        tasks = test_tasks if cfg.eval.split == "test" and test_tasks else None
        tasks = tasks or components.load_tasks(cfg, cfg.eval.split)
        if cfg.eval.num_tasks:
            tasks = tasks[: cfg.eval.num_tasks]
        return evaluate(cfg, engine, tokenizer, tasks, gather=rollouts.gather)[0]

    return run


class PolicyAndEngine:
    """The model RL starts from and the rollout engine: ``base_path`` (the SFT warm start, or the
    model itself when a checkpoint of full weights replaces it, so a resume does not warm-start
    again; LoRA adapters need it), ``model``, ``tokenizer``, ``engine``, ``shards_from``."""

    def __init__(
        self,
        cfg: Config,
        strategy: Strategy,
        placement: Any,
        rank: int,
        log: Callable[[str], None],
        ckpt: Path | None,
        state: dict[str, Any] | None,
    ) -> None:
        record = weights_record(state) if state else None
        full = record is not None and not record["lora"]
        self.base_path = resolve_model_path(cfg.model.path) if full else build.policy_path(cfg, log=log)
        if ckpt and record:
            check_resumable(record, cfg.trainer.strategy, cfg.model.lora, ckpt, self.base_path)
        # full HF weights load from the checkpoint; LoRA and DCP checkpoints fill a model built from the base
        path = str(ckpt) if record and record["format"] == "hf" and not record["lora"] else self.base_path
        sharded = strategy.equal_forwards
        # sharded: each rank reads its own shards when every rank sees the checkpoint's files
        # (parallel/shard_reads.py; not with LoRA, whose adapters rank 0 draws), else rank 0 reads the
        # weights into host memory and the others get their shards from it; when a full DCP
        # checkpoint will fill every shard, no rank reads them
        dcp_full = record is not None and record["format"] == "dcp" and not record["lora"]
        self.shards_from = shard_reads.first_load(
            path, sharded and not dcp_full, lora.enabled(cfg.model.lora), log
        )
        on_meta = rank > 0 or dcp_full or self.shards_from is not None
        self.model, self.tokenizer = components.load_model(
            cfg, path, device=("meta" if on_meta else "cpu") if sharded else None
        )
        self.model.train()
        # the engine's copy of the weights, before LoRA and sharding change the model
        self.engine: Engine = build.build_engine(
            cfg, None if sharded else self.model, self.tokenizer, path, placement, rank
        )
        if (why := getattr(self.engine, "cpu_gemm_why", None)) and rank == 0:  # measured or set: said
            library = getattr(self.engine, "cpu_gemm", None) or "the device's own"
            log(f"engine products: {library} ({why})")
        if cfg.trainer.mode == "async" and not isinstance(self.engine, build.RolloutPool):
            self.engine = EngineGate(self.engine)  # rollouts and weight pushes take turns (pipeline.py)
        if (
            cfg.trainer.mode == "async"
            and cfg.rollout.max_staleness > 0
            and cfg.algorithm.is_correction == "none"
        ):
            log(
                f"note: trainer.mode=async with rollout.max_staleness={cfg.rollout.max_staleness} trains on tokens "
                "sampled by older weights without an importance correction; algorithm.is_correction=tis corrects "
                "each token from its own behaviour log-prob"
            )


def train(
    cfg: Config, log: Callable[[str], None] = print, overwrite: bool = False, force: bool = False
) -> list[dict[str, float]]:
    """Run training to ``trainer.total_steps`` (or resume to it).

    A first SIGTERM or SIGINT (Ctrl-C) lets the current step finish, writes a checkpoint at it and
    then raises ``KeyboardInterrupt`` (so the CLI exits with 130 and says how to resume); a second
    one raises ``KeyboardInterrupt`` at once, and the run resumes from its last checkpoint."""
    with sigterm_as_interrupt("the run's set-up (the SFT warm start, the engine)", log):
        trainer = make_trainer(cfg, log=log, overwrite=overwrite, force=force)
    try:
        with stop_after_step_on_signal(trainer, log):
            history = trainer.train()
    finally:
        mcp = sys.modules.get("agentrl.env.mcp_tools")  # the environments' MCP servers, if any started
        if mcp is not None:
            mcp.close_all()
    if trainer.stop_requested:
        raise KeyboardInterrupt
    return history
