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

Scale (docs/scaling.md): the engine may be vLLM or a pool of Ray workers (built in ``agentrl/assembly/``);
under torchrun each rank runs its share of the rollouts and of every mini-batch's rows, and DDP sums
the gradients (``agentrl.parallel.sharding``). Off-policy guards (``offpolicy.py``): episodes lagging more than
``rollout.max_staleness`` weight versions are not trained on; ``algorithm.is_correction=tis``
weights each token by the truncated ratio π_old/π_rollout; a jump in the mismatch is warned about.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.config import run_history
from agentrl.config.schema import TrainerConfig
from agentrl.config.schema_runtime import LoggingConfig
from agentrl.engines.base import Engine
from agentrl.env.records import Task
from agentrl.episode import Episode
from agentrl.parallel import ranks
from agentrl.rollout.pipeline import RolloutPipeline
from agentrl.sync.weight_sync import PolicyNotFinite
from agentrl.training import offpolicy as off
from agentrl.training.collect import Collector
from agentrl.training.learner import Learner
from agentrl.training.metrics import FailureSummary, MetricsLogger, episode_metrics, failure_summary, plot_run
from agentrl.training.progress import TrainProgress
from agentrl.training.run_lock import RunLock
from agentrl.training.run_state import RunState
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
    t: TrainerConfig, run_dir: Path, step: int, failing: int, failure: FailureSummary | None
) -> str:
    assert failure is not None
    return (
        f"{failure.fraction:.0%} of step {step}'s episodes failed, and more than "
        f"trainer.max_failed_fraction={t.max_failed_fraction} failed for {failing} steps in a "
        f"row. Most frequent failure ({failure.count} episodes), at the '{failure.boundary}' boundary: "
        f"{failure.message}. Example episode: {failure.example} (agentrl replay {run_dir} "
        f"--episode {failure.example}). Fix the cause, or raise trainer.max_failed_fraction (null: never stop)."
    )


def _trained(metrics: dict[str, float]) -> bool:
    """Did this step change the weights? Some advantage was nonzero and an optimizer step ran."""
    return metrics.get("advantages/nonzero_frac", 0.0) > 0 and metrics.get("update/steps", 1.0) > 0


def _nothing_trained_message(max_episode_tokens: int, run_dir: Path, history: list[dict[str, float]]) -> str:
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
            f"rollout.max_episode_tokens={max_episode_tokens}; raise it"
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


@dataclass
class LoopSettings:
    """What the loop reads of the config (``assembly/trainer.py`` fills it)."""

    trainer: TrainerConfig
    logging: LoggingConfig
    max_episode_tokens: int
    """from ``rollout.max_episode_tokens``"""


@dataclass
class TrainerParts:
    """Everything the loop works with, built and checked by ``assembly.make_trainer``: on a resume
    the checkpoint is already loaded into them and ``start_step`` is the step it was written at."""

    learner: Learner
    rollouts: Collector
    weights: WeightPush
    state: RunState
    tokenizer: Any
    base_path: str
    """the model RL started from (the warm start), recorded in every checkpoint"""
    root_dir: Path
    run_dir: Path
    """``root_dir``, or rank r's own copy ``root_dir/ranks/r``"""
    rank: int
    world: int
    start_step: int
    train_tasks: list[Task]
    test_tasks: list[Task] | None
    evaluate: Callable[[Engine], dict[str, float]]
    """the held-out evaluation (``eval.*``) on the given engine"""
    transcripts: TranscriptWriter
    metrics: MetricsLogger
    run_lock: RunLock | None
    """rank 0's hold on the run directory (``run_lock.py``), let go when ``train`` returns"""


class Trainer:
    """The loop over its parts (``TrainerParts``); ``assembly.make_trainer(cfg)`` builds one from a
    config, having checked every input and, on a resume, loaded the checkpoint."""

    def __init__(
        self, settings: LoopSettings, parts: TrainerParts, log: Callable[[str], None] = print
    ) -> None:
        self.settings, self.parts, self.log = settings, parts, log
        self.learner, self.rollouts, self.weights, self.state = (
            parts.learner,
            parts.rollouts,
            parts.weights,
            parts.state,
        )
        self.model = self.learner.model  # the policy being trained (peft with LoRA, sharded with fsdp2)
        self.tokenizer, self.base_path = parts.tokenizer, parts.base_path
        self.root_dir, self.run_dir, self.rank, self.world = (
            parts.root_dir,
            parts.run_dir,
            parts.rank,
            parts.world,
        )
        self.train_tasks, self.test_tasks = parts.train_tasks, parts.test_tasks
        self.transcripts, self.metrics, self.run_lock = parts.transcripts, parts.metrics, parts.run_lock
        self.start_step = self.step = parts.start_step
        self.mismatch = off.MismatchMonitor()  # warns when rollout/trainer logprobs drift apart
        self.stop_requested = False  # set by a first SIGTERM/SIGINT (``stop_after_step_on_signal``)

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
        t: TrainerConfig = self.settings.trainer
        lg: LoggingConfig = self.settings.logging
        history: list[dict[str, float]] = []
        if self.start_step >= t.total_steps:
            self.log(
                f"nothing to train: {self.root_dir} has run all trainer.total_steps={t.total_steps} "
                f"steps; to train further, resume with a larger trainer.total_steps"
            )
        t_start = time.perf_counter()
        failing = 0  # consecutive steps over trainer.max_failed_fraction
        rows = read_metrics(self.run_dir) if self.start_step else []  # the run's first step, when resuming
        with (
            TrainProgress(
                t.total_steps,
                self.start_step,
                every=lg.log_every,
                first_row=rows[0] if rows else None,
                history=list(run_history.describe(run_history.read(self.root_dir))),
            ) as progress,
            self._closing_pipeline(),
        ):
            for step in range(self.start_step, t.total_steps):
                out = self.train_step(step)
                failing = self._record(step, out, failing)
                history.append(out.metrics)
                progress.update(step, out.metrics, failure=str(out.failure) if out.failure else None)
                if self._should_stop(step, t_start):
                    break
        done, every = self.start_step + len(history), t.checkpoint_every
        if history and not (every and done % every == 0):  # no periodic checkpoint at the last step
            self.checkpoint(done)
        with self.state.after_the_run("the metrics' last events", "metrics.jsonl holds every step"):
            self.metrics.close()
        if lg.plots:
            with self.state.after_the_run("the plots", f"free space, then run agentrl plot {self.run_dir}"):
                plot_run(self.run_dir)
        if history and not any(_trained(m) for m in history):
            raise TrainingFailed(
                _nothing_trained_message(self.settings.max_episode_tokens, self.run_dir, history)
            )
        return history

    def _record(self, step: int, out: StepOutput, failing: int) -> int:
        """Evaluate, log and checkpoint after a step as configured; returns the count of consecutive
        steps with too many failed episodes, raising ``TrainingFailed`` when the breaker trips (and
        ``DiskFull``, exit 4 with the resume command, when the disk has no room for the records)."""
        with self.state.writing(f"the records of step {step} in {self.run_dir}"):
            t: TrainerConfig = self.settings.trainer
            lg: LoggingConfig = self.settings.logging
            if t.eval_every and (step + 1) % t.eval_every == 0:
                out.metrics.update(self.evaluate())
            self.metrics.log(step, out.metrics)
            if _prompt_too_long(out.metrics):
                self.log(
                    f"warning (step {step}): every episode stopped before the model wrote a token: the prompt "
                    f"is longer than rollout.max_episode_tokens={self.settings.max_episode_tokens}"
                )
            failing = failing + 1 if _over(out.failure, t.max_failed_fraction) else 0
            tripped = failing >= t.max_failed_steps
            if lg.transcripts and (step % lg.transcript_every == 0 or tripped):
                self.transcripts.write(out.episodes)
            if tripped:
                raise TrainingFailed(_breaker_message(t, self.run_dir, step, failing, out.failure))
            if t.checkpoint_every and (step + 1) % t.checkpoint_every == 0:
                self.checkpoint(step + 1)
            return failing

    def _should_stop(self, step: int, t_start: float) -> bool:
        """``trainer.max_wall_minutes`` reached (rank 0's clock decides, so every rank stops after the
        same step), or a signal on any rank."""
        t: TrainerConfig = self.settings.trainer
        limit = t.max_wall_minutes
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
        return self.parts.evaluate(self.engine)

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
            name = signal.Signals(signum).name
            log(
                f"{name} again: stopping now; step {trainer.step} is lost, and a resume starts from the last checkpoint"
            )
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
