"""The RL loop, top to bottom.

Per step: sample tasks -> run ``group_size`` episodes per task -> filters (failed and stale episodes
out, dynamic sampling on the outcome) -> DAPO overlong shaping -> the learner's update
(``learner.py``: π_old's log-probs and entropies, the reference's, advantages, token weights on the
whole batch, mini/micro-batched optimizer steps) -> push weights to the engine -> transcripts,
metrics, checkpoint.

Departures from plain GRPO, each a config switch (docs/algorithms.md): clip-higher, dual clip,
token-mean over the whole batch, dynamic sampling, token weightings. Only policy tokens (mask 1)
enter any loss or statistic; tool output, prompts, scaffolding and padding never do.
Episodes that failed (an exception at the model, env, tool, sandbox or reward boundary) are kept in
the transcripts but left out of groups and losses: an infrastructure failure says nothing about the
policy.

Scale (docs/scaling.md): the engine may be vLLM or a pool of Ray workers (``build.build_engine``);
under torchrun each rank runs its share of the rollouts and of every mini-batch's rows, and DDP sums
the gradients (``agentrl.parallel.sharding``). Off-policy guards (``offpolicy.py``): episodes lagging more than
``rollout.max_staleness`` weight versions are not trained on; ``algorithm.is_correction=tis``
weights each token by the truncated ratio π_old/π_rollout; a jump in the mismatch is warned about.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.assembly import records
from agentrl.config import Config, config_to_dict, output_dir, run_history, save_config
from agentrl.engines.base import Engine
from agentrl.episode import Episode
from agentrl.models import resolve_model_path
from agentrl.parallel import ranks, shard_reads, sharding
from agentrl.rollout import components
from agentrl.rollout.pipeline import EngineGate, RolloutPipeline
from agentrl.seeds import seed_everything
from agentrl.sync.weight_sync import PolicyNotFinite
from agentrl.training import build, lora, preflight
from agentrl.training import offpolicy as off
from agentrl.training.checkpoint import (
    check_resumable,
    existing_run,
    move_aside,
    refuse_existing_run,
    weights_record,
)
from agentrl.training.evaluation import evaluate
from agentrl.training.metrics import FailureSummary, MetricsLogger, episode_metrics, failure_summary, plot_run
from agentrl.training.progress import TrainProgress
from agentrl.training.run_lock import RunLock
from agentrl.training.weight_push import WeightPush
from agentrl.transcripts import TranscriptWriter, read_metrics

TRUNCATED = ("token_budget", "max_turns", "truncated")


@dataclass
class StepOutput:
    metrics: dict[str, float]
    episodes: list[Episode]
    failure: FailureSummary | None = None
    """The step's failed episodes: their share and the most frequent failure (None: none failed)."""


def _prompt_too_long(metrics: dict[str, float]) -> bool:
    """Every episode of the step ran out of its token budget before the policy wrote anything."""
    return (
        metrics.get("stop/token_budget", 0.0) == 1.0 and metrics.get("length/policy_tokens_total", 0.0) == 0
    )


class TrainingFailed(RuntimeError):
    """The run cannot make progress (the circuit breaker tripped, or no step trained at all)."""


def _over(failure: FailureSummary | None, limit: float | None) -> bool:
    return failure is not None and limit is not None and failure.fraction > limit


def _breaker_message(
    cfg: Config, run_dir: Path, step: int, failing: int, failure: FailureSummary | None
) -> str:
    assert failure is not None
    return (
        f"{failure.fraction:.0%} of step {step}'s episodes failed, and more than "
        f"trainer.max_failed_fraction={cfg.trainer.max_failed_fraction} failed for {failing} steps in a "
        f"row. Most frequent failure ({failure.count} episodes), at the '{failure.boundary}' boundary: "
        f"{failure.message}. Example episode: {failure.example} (agentrl replay {run_dir} "
        f"--episode {failure.example}). Fix the cause, or raise trainer.max_failed_fraction (null: never stop)."
    )


def _trained(metrics: dict[str, float]) -> bool:
    """Did this step change the weights? Some advantage was nonzero and an optimizer step ran."""
    return metrics.get("advantages/nonzero_frac", 0.0) > 0 and metrics.get("update/steps", 1.0) > 0


def _nothing_trained_message(cfg: Config, run_dir: Path, history: list[dict[str, float]]) -> str:
    informative = [m for m in history if m.get("advantages/nonzero_frac", 0.0) > 0]
    if informative and all(m.get("update/nonfinite") for m in informative):
        return (
            f"no step trained: in all {len(history)} steps every update was skipped because its advantages, "
            "token weights, loss or gradients were not finite (update/nonfinite in metrics.jsonl; the warnings "
            "above name which): check the method's settings (algorithm.*) and trainer.lr"
        )
    failed = max(m.get("episodes/failed_frac", 0.0) for m in history)
    if all(_prompt_too_long(m) for m in history):
        return (
            f"no step trained: in all {len(history)} steps every episode stopped before the model wrote a "
            f"token: the prompt (system prompt, tool schemas, task) is longer than "
            f"rollout.max_episode_tokens={cfg.rollout.max_episode_tokens}; raise it"
        )
    why = (
        "episodes failed: see the FAILED part of the progress lines, and agentrl replay "
        f"{run_dir} --filter failure=BOUNDARY"
        if failed > 0
        else "no group had rewards that differ (all correct or all wrong): check the warm start with "
        "agentrl eval, or the reward functions"
    )
    return (
        f"no step trained: in all {len(history)} steps every advantage was 0 or the update was "
        f"skipped ({why})"
    )


class Trainer:
    """``overwrite``: move a run already in ``run.output_dir`` aside (to ``<dir>.old-<n>``) instead of
    refusing to start; without it (and without ``run.resume``) an existing run is an error.
    ``force``: a resume may change keys a run cannot take mid-way (``run_history.FIXED_MID_RUN``);
    the run's history records it.

    Nothing is written before every input has been checked (``preflight``) and, on a resume, the
    checkpoint loaded: the resolved config (``config.yaml``, atomically, the one it replaces kept as
    ``config.prev.yaml``) and the session's line in ``history.jsonl`` come last."""

    def __init__(self, cfg: Config, log=print, overwrite: bool = False, force: bool = False) -> None:
        self.cfg, self.log = cfg, log
        # the held-out tasks too when they are evaluated or split from the training data (the log says how many)
        test = bool(cfg.trainer.eval_every) or (components.shared_rows(cfg) and cfg.data.test_fraction > 0)
        checked = preflight.check_inputs(cfg, train=True, test=test, force=force)
        for note in checked.notes:
            log(note)
        components.apply_threads(cfg, log)
        # device, rank under torchrun, where every process lives: a map that cannot work stops here
        self.device, self.rank, self.world, self.placement = build.join_run(cfg, log)
        components.say_slow_bf16(cfg, self.device, log)  # emulated bf16 on this CPU: many times slower
        # the layout over the ranks (sharding.py): an HSDP mesh that does not fit fails here, first
        self.strategy = sharding.make_strategy(cfg.trainer, self.rank, self.world, self.device)
        if lora.enabled(cfg.model.lora):  # target modules that match nothing fail before any work, too
            lora.check_targets(components.meta_model(cfg.model.path, cfg.model.dtype), cfg.model.lora)
        self.root_dir = output_dir(cfg)  # rank 0's; checkpoints
        # one process trains a run directory at a time (run_lock.py); held until train() returns
        self.run_lock = RunLock(self.root_dir) if self.rank == 0 else None
        self._claim_run_dir(overwrite)
        # other ranks keep their own copy of the run's files
        self.run_dir = self.root_dir / "ranks" / str(self.rank) if self.rank else self.root_dir
        seed_everything(cfg.run.seed)
        self.start_step = self.step = 0
        self.state = records.make_run_state(cfg, self.root_dir, self.run_dir, self.rank, self.world, log)
        ckpt, state = self.state.resume_point() if cfg.run.resume else (None, None)
        model, engine = self._policy_and_engine(ckpt, state)
        self.learner = records.make_learner(
            cfg, model, self.tokenizer.pad_token_id or 0, self.strategy, log, shards_from=self.shards_from
        )
        self.model = self.learner.model  # the policy being trained (peft with LoRA, sharded with fsdp2)
        assert checked.train_tasks is not None
        self.train_tasks, self.test_tasks = checked.train_tasks, checked.test_tasks
        self.rollouts = records.make_collector(cfg, engine, self.tokenizer, self.train_tasks)
        self.weights = WeightPush(records.push_settings(cfg), self.learner, engine)
        self.mismatch = off.MismatchMonitor()  # warns when rollout/trainer logprobs drift apart
        self.stop_requested = False  # set by a first SIGTERM/SIGINT (``train``): stop after this step
        if ckpt and state:  # cuts metrics/transcripts back to the checkpoint before we append
            self.start_step = self.state.restore(ckpt, state, self.learner, self.rollouts, self.weights)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, self.run_dir, keep_previous=True)  # every input checked, the checkpoint loaded
        if self.rank == 0:
            preflight.record_session(
                self.root_dir, self.start_step, ckpt.name if ckpt else None, checked.resume
            )
        self.transcripts = TranscriptWriter(self.run_dir / "transcripts.jsonl")
        self.metrics = MetricsLogger(
            self.run_dir,
            tensorboard=cfg.logging.tensorboard,
            wandb_project=cfg.logging.wandb_project if cfg.logging.wandb else None,
            config=config_to_dict(cfg),
            every=cfg.logging.log_every,
            start_step=self.start_step,
        )

    def _policy_and_engine(self, ckpt: Path | None, state: dict[str, Any] | None) -> tuple[Any, Engine]:
        """The model RL starts from (sets ``base_path`` and ``tokenizer``) and the rollout engine."""
        cfg, log = self.cfg, self.log
        record = weights_record(state) if state else None
        # the model RL starts from: the SFT warm start. A checkpoint of full weights replaces it, so a
        # resume does not warm-start again (another machine, another cache); LoRA adapters need it
        full = record is not None and not record["lora"]
        self.base_path = resolve_model_path(cfg.model.path) if full else build.policy_path(cfg, log=log)
        if ckpt and record:
            check_resumable(record, cfg.trainer.strategy, cfg.model.lora, ckpt, self.base_path)
        # full HF weights load from the checkpoint; LoRA and DCP checkpoints fill a model built from the base
        path = str(ckpt) if record and record["format"] == "hf" and not record["lora"] else self.base_path
        sharded = self.strategy.equal_forwards
        # sharded: each rank reads its own shards when every rank sees the checkpoint's files
        # (parallel/shard_reads.py; not with LoRA, whose adapters rank 0 draws), else rank 0 reads the
        # weights into host memory and the others get their shards from it; when a full DCP
        # checkpoint will fill every shard, no rank reads them
        dcp_full = record is not None and record["format"] == "dcp" and not record["lora"]
        fills = sharded and not dcp_full
        self.shards_from = shard_reads.first_load(path, fills, lora.enabled(cfg.model.lora), log)
        on_meta = self.rank > 0 or dcp_full or self.shards_from is not None
        device = ("meta" if on_meta else "cpu") if sharded else None
        model, self.tokenizer = components.load_model(cfg, path, device=device)
        model.train()
        # the engine's copy of the weights, before LoRA and sharding change the model
        engine = build.build_engine(
            cfg, None if sharded else model, self.tokenizer, path, self.placement, self.rank
        )
        if cfg.trainer.mode == "async" and not isinstance(engine, build.RolloutPool):
            engine = EngineGate(engine)  # rollouts and weight pushes take turns (pipeline.py)
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
        return model, engine

    @property
    def engine(self) -> Engine:
        """The rollout engine the step samples with and pushes weights to."""
        return self.rollouts.engine

    @engine.setter
    def engine(self, engine: Engine) -> None:
        self.rollouts.engine = self.weights.engine = engine

    @property
    def pipeline(self) -> RolloutPipeline | None:
        """Async mode's rollout pipeline (``rollout/pipeline.py``), once the first step started it."""
        return self.rollouts.pipeline

    def _claim_run_dir(self, overwrite: bool) -> None:
        """Before any work: a new run never writes into a directory that holds another one."""
        if self.cfg.run.resume:
            return
        if overwrite and self.rank == 0 and existing_run(self.root_dir):
            self.log(f"--overwrite: moved the previous run to {move_aside(self.root_dir)}")
        ranks.broadcast_from_rank0(None)  # every rank waits for the move
        refuse_existing_run(self.root_dir)

    # -- the loop ----------------------------------------------------------------------------
    def train(self) -> list[dict[str, float]]:
        """Steps ``start_step`` .. ``total_steps - 1``. Raises ``TrainingFailed`` when the circuit
        breaker trips (too many failed episodes, ``trainer.max_failed_*``) and when no step trained
        at all: such a run never reports success. Lets go of the run directory's lock at the end."""
        try:
            return self._train_steps()
        finally:
            if self.run_lock is not None:
                self.run_lock.release()

    def _train_steps(self) -> list[dict[str, float]]:
        cfg, history = self.cfg, []
        if self.start_step >= cfg.trainer.total_steps:
            self.log(
                f"nothing to train: {self.root_dir} has run all trainer.total_steps={cfg.trainer.total_steps} "
                f"steps; to train further, resume with a larger trainer.total_steps"
            )
        t_start = time.perf_counter()
        failing = 0  # consecutive steps over trainer.max_failed_fraction
        rows = read_metrics(self.run_dir) if self.start_step else []  # the run's first step, when resuming
        with (
            TrainProgress(
                cfg.trainer.total_steps,
                self.start_step,
                every=cfg.logging.log_every,
                first_row=rows[0] if rows else None,
                history=list(run_history.describe(run_history.read(self.root_dir))),
            ) as progress,
            self._closing_pipeline(),
        ):
            for step in range(self.start_step, cfg.trainer.total_steps):
                out = self.train_step(step)
                failing = self._record(step, out, failing)
                history.append(out.metrics)
                progress.update(step, out.metrics, failure=str(out.failure) if out.failure else None)
                if self._should_stop(step, t_start):
                    break
        done, every = self.start_step + len(history), cfg.trainer.checkpoint_every
        if history and not (every and done % every == 0):  # no periodic checkpoint at the last step
            self.checkpoint(done)
        with self.state.after_the_run("the metrics' last events", "metrics.jsonl holds every step"):
            self.metrics.close()
        if cfg.logging.plots:
            with self.state.after_the_run("the plots", f"free space, then run agentrl plot {self.run_dir}"):
                plot_run(self.run_dir)
        if history and not any(_trained(m) for m in history):
            raise TrainingFailed(_nothing_trained_message(self.cfg, self.run_dir, history))
        return history

    def _record(self, step: int, out: StepOutput, failing: int) -> int:
        """Evaluate, log and checkpoint after a step as configured; returns the count of consecutive
        steps with too many failed episodes, raising ``TrainingFailed`` when the breaker trips (and
        ``DiskFull``, exit 4 with the resume command, when the disk has no room for the records)."""
        with self.state.writing(f"the records of step {step} in {self.run_dir}"):
            cfg = self.cfg
            if cfg.trainer.eval_every and (step + 1) % cfg.trainer.eval_every == 0:
                out.metrics.update(self.evaluate())
            self.metrics.log(step, out.metrics)
            if _prompt_too_long(out.metrics):
                self.log(
                    f"warning (step {step}): every episode stopped before the model wrote a token: the prompt "
                    f"is longer than rollout.max_episode_tokens={cfg.rollout.max_episode_tokens}"
                )
            failing = failing + 1 if _over(out.failure, cfg.trainer.max_failed_fraction) else 0
            tripped = failing >= cfg.trainer.max_failed_steps
            if cfg.logging.transcripts and (step % cfg.logging.transcript_every == 0 or tripped):
                self.transcripts.write(out.episodes)
            if tripped:
                raise TrainingFailed(_breaker_message(cfg, self.run_dir, step, failing, out.failure))
            if cfg.trainer.checkpoint_every and (step + 1) % cfg.trainer.checkpoint_every == 0:
                self.checkpoint(step + 1)
            return failing

    def _should_stop(self, step: int, t_start: float) -> bool:
        """``trainer.max_wall_minutes`` reached (rank 0's clock decides, so every rank stops after the
        same step), or a signal on any rank."""
        limit = self.cfg.trainer.max_wall_minutes
        if limit and ranks.broadcast_from_rank0((time.perf_counter() - t_start) / 60 > limit):
            self.log(f"stopping: trainer.max_wall_minutes={limit} reached after step {step}")
            return True
        if ranks.any_rank(self.stop_requested):  # a signal on any rank stops every rank here
            self.stop_requested = True
            self.log(f"stopping on a signal after step {step}, with a checkpoint")
            return True
        return False

    @contextlib.contextmanager
    def _closing_pipeline(self) -> Iterator[None]:
        """Async mode: the rollouts still running when training stops are waited for, not leaked."""
        try:
            yield
        finally:
            self.rollouts.close()

    def train_step(self, step: int) -> StepOutput:
        self.step = step
        t0 = time.perf_counter()
        episodes, kept, info = self.collect(step)  # rollouts + filters
        t_rollout = time.perf_counter() - t0
        metrics = {**episode_metrics(episodes), **info}
        if kept:
            batch = self.learner.make_batch(kept)  # tensors
            metrics.update(self._update(batch, step))  # π_old, advantages, optimizer steps, weight push
        else:
            metrics["update/skipped"] = 1.0
        if self.pipeline is not None:
            self.pipeline.step_done(step)  # wait mode: the batch K steps ahead may start now
        metrics.update(
            {
                "time/rollout_s": t_rollout,
                "time/step_s": time.perf_counter() - t0,
                "weights/version": float(self.engine.version),
            }
        )
        metrics["tokens/s"] = metrics.get("length/policy_tokens_total", 0.0) / max(
            metrics["time/step_s"], 1e-9
        )
        if self.pipeline is not None:
            metrics.update(self.rollouts.async_metrics(metrics))
        if "mismatch/abs_logp_mean" in metrics and (
            w := self.mismatch.update(metrics["mismatch/abs_logp_mean"])
        ):
            self.log(f"warning (step {step}): {w}")
            metrics["mismatch/jump"] = 1.0
        for ep in episodes:
            ep.step = step
            ep.metrics["weighting"] = self.learner.weighting
        return StepOutput(metrics, episodes, failure_summary(episodes))

    def _update(self, batch: Any, step: int) -> dict[str, float]:
        """The learner's update (π_old, advantages, weights, optimizer steps), then the new weights
        pushed to the engine (``weight_push.py``)."""
        try:
            return self.weights.around(lambda: self.learner.update(batch, step))
        except PolicyNotFinite as e:  # the update diverged: the run cannot go on, and says why
            raise TrainingFailed(f"step {step}: {e}") from e

    # -- rollouts and filters ----------------------------------------------------------------
    def collect(self, step: int) -> tuple[list[Episode], list[Episode], dict[str, float]]:
        """Episodes of this step (all, for transcripts) and the ones to train on (``collect.py``)."""
        return self.rollouts.collect(step)

    # -- evaluation, checkpoints -------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        tasks = self.test_tasks if self.cfg.eval.split == "test" and self.test_tasks else None
        tasks = tasks or components.load_tasks(self.cfg, self.cfg.eval.split)
        if self.cfg.eval.num_tasks:
            tasks = tasks[: self.cfg.eval.num_tasks]
        runner = records.eval_runner(self.cfg, self.engine, self.tokenizer)
        return evaluate(runner, tasks, self.cfg.eval.k, gather=self.rollouts.gather)[0]

    def checkpoint(self, step: int) -> Path:
        """Every rank calls this (``run_state.py``)."""
        return self.state.save(step, self.learner, self.base_path, self.rollouts, self.engine, self.tokenizer)


# -- the entry point ------------------------------------------------------------------------------
@contextlib.contextmanager
def stop_after_step_on_signal(trainer: Trainer, log=print) -> Iterator[None]:
    """While inside: a first SIGTERM or SIGINT sets ``trainer.stop_requested`` (the trainer finishes
    its step, checkpoints it and returns); a second raises ``KeyboardInterrupt`` at once. Handlers can
    only be set on the main thread; elsewhere this does nothing."""

    def _graceful(signum, frame):
        if trainer.stop_requested:
            log(f"{signal.Signals(signum).name} again: stopping now; step {trainer.step} is lost, and a resume starts "
                "from the last checkpoint")  # fmt: skip
            raise KeyboardInterrupt
        trainer.stop_requested = True
        log(
            f"{signal.Signals(signum).name}: finishing step {trainer.step}, then checkpointing and "
            "stopping (send it again to stop now, losing the step)"
        )

    main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, _graceful) for sig in (signal.SIGTERM, signal.SIGINT)} if main else {}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def sigterm_as_interrupt(what: str, log=print) -> Iterator[None]:
    """While inside (the SFT warm start, the trainer's set-up): SIGTERM stops the work as Ctrl-C
    does, by ``KeyboardInterrupt``, saying so, instead of killing the process without a word; there
    is no step yet to finish. Only on the main thread, where handlers can be set."""

    def _stop(signum, frame):
        log(f"{signal.Signals(signum).name}: stopping {what}")
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def train(cfg: Config, log=print, overwrite: bool = False, force: bool = False) -> list[dict[str, float]]:
    """Run training to ``trainer.total_steps`` (or resume to it).

    A first SIGTERM or SIGINT (Ctrl-C) lets the current step finish, writes a checkpoint at it and
    then raises ``KeyboardInterrupt`` (so the CLI exits with 130 and says how to resume); a second
    one raises ``KeyboardInterrupt`` at once, and the run resumes from its last checkpoint."""
    with sigterm_as_interrupt("the run's set-up (the SFT warm start, the engine)", log):
        trainer = Trainer(cfg, log=log, overwrite=overwrite, force=force)
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
