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
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from agentrl import algorithms as alg
from agentrl.config import Config, config_to_dict, output_dir, run_history, save_config
from agentrl.env.data import TaskSampler
from agentrl.episode import Episode
from agentrl.models import resolve_model_path
from agentrl.parallel import ranks, sharding
from agentrl.rollout import components
from agentrl.rollout.pipeline import EngineGate, RolloutPipeline, batch_requests
from agentrl.rollout.runner import EpisodeRequest
from agentrl.seeds import mix_seed, seed_everything
from agentrl.sync import weight_sync
from agentrl.training import build, lora, preflight
from agentrl.training import offpolicy as off
from agentrl.training.checkpoint import (
    begin,
    check_resumable,
    commit,
    existing_run,
    latest_checkpoint,
    load_state,
    load_weights,
    move_aside,
    rank_state,
    refuse_existing_run,
    save_weights,
    saved_rank_state,
    set_rng_state,
    truncate_to,
    weights_record,
)
from agentrl.training.evaluation import evaluate
from agentrl.training.learner import Learner
from agentrl.training.metrics import FailureSummary, MetricsLogger, episode_metrics, failure_summary, plot_run
from agentrl.training.progress import TrainProgress
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
        # data-parallel ranks under torchrun (ranks.py); a collective some rank never joins raises
        self.rank, self.world = ranks.init_from_env(timeout_s=cfg.timeouts.collective_s)
        self.device = components.device_of(cfg)
        # the layout over the ranks (sharding.py): an HSDP mesh that does not fit fails here, first
        self.strategy = sharding.make_strategy(cfg, self.rank, self.world, self.device)
        if lora.enabled(cfg):  # target modules that match nothing fail before any work, too
            lora.check_targets(components.meta_model(cfg.model.path, cfg.model.dtype), cfg.model.lora)
        self.root_dir = output_dir(cfg)  # rank 0's; checkpoints
        self._claim_run_dir(overwrite)
        # other ranks keep their own copy of the run's files
        self.run_dir = self.root_dir / "ranks" / str(self.rank) if self.rank else self.root_dir
        seed_everything(cfg.run.seed)
        if cfg.run.deterministic:
            torch.use_deterministic_algorithms(True)
        self.start_step = self.step = 0
        ckpt, state = self._resume_point() if cfg.run.resume else (None, None)
        record = weights_record(state) if state else None
        # the model RL starts from: the SFT warm start. A checkpoint of full weights replaces it, so a
        # resume does not warm-start again (another machine, another cache); LoRA adapters need it
        full = record is not None and not record["lora"]
        self.base_path = resolve_model_path(cfg.model.path) if full else build.policy_path(cfg, log=log)
        if ckpt and record:
            check_resumable(record, cfg, ckpt, self.base_path)
        # full HF weights load from the checkpoint; LoRA and DCP checkpoints fill a model built from the base
        path = str(ckpt) if record and record["format"] == "hf" and not record["lora"] else self.base_path
        sharded = self.strategy.equal_forwards
        # sharded: rank 0 reads the weights into host memory and the other ranks get their shards
        # from it; when a full DCP checkpoint will fill every shard, no rank reads them
        dcp_full = record is not None and record["format"] == "dcp" and not record["lora"]
        device = ("meta" if self.rank > 0 or dcp_full else "cpu") if sharded else None
        model, self.tokenizer = components.load_model(cfg, path, device=device)
        model.train()
        # the engine's copy of the weights, before LoRA and sharding change the model
        self.engine = build.build_engine(cfg, None if sharded else model, self.tokenizer, path)
        if cfg.trainer.mode == "async" and not isinstance(self.engine, build.RolloutPool):
            self.engine = EngineGate(self.engine)  # rollouts and weight pushes take turns (pipeline.py)
        self.pipeline: RolloutPipeline | None = None  # async mode: started by the first collect
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
        self._pipeline_state: dict[str, Any] | None = None  # a resumed async run's pending batches
        self._async_marks = (0.0, 0.0)  # the engine's idle and blocked seconds at the last step
        self.learner = Learner(cfg, model, self.tokenizer.pad_token_id or 0, self.strategy, log)
        self.model = self.learner.model  # the policy being trained (peft with LoRA, sharded with fsdp2)
        assert checked.train_tasks is not None
        self.train_tasks, self.test_tasks = checked.train_tasks, checked.test_tasks
        self.sampler = TaskSampler(self.train_tasks, cfg.run.seed)
        self.mismatch = off.MismatchMonitor()  # warns when rollout/trainer logprobs drift apart
        self.stop_requested = False  # set by a first SIGTERM/SIGINT (``train``): stop after this step
        if ckpt and state:
            self._resume(ckpt, state)  # cuts metrics/transcripts back to the checkpoint before we append
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
        )

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
        at all: such a run never reports success."""
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
                    raise TrainingFailed(self._breaker_message(step, failing, out.failure))
                if cfg.trainer.checkpoint_every and (step + 1) % cfg.trainer.checkpoint_every == 0:
                    self.checkpoint(step + 1)
                history.append(out.metrics)
                progress.update(step, out.metrics, failure=str(out.failure) if out.failure else None)
                elapsed = (time.perf_counter() - t_start) / 60
                # rank 0's clock decides, so every rank stops after the same step
                if cfg.trainer.max_wall_minutes and ranks.broadcast_from_rank0(
                    elapsed > cfg.trainer.max_wall_minutes
                ):
                    self.log(
                        f"stopping: trainer.max_wall_minutes={cfg.trainer.max_wall_minutes} reached after step {step}"
                    )
                    break
                if ranks.any_rank(self.stop_requested):  # a signal on any rank stops every rank here
                    self.stop_requested = True
                    self.log(f"stopping on a signal after step {step}, with a checkpoint")
                    break
        done, every = self.start_step + len(history), cfg.trainer.checkpoint_every
        if history and not (every and done % every == 0):  # no periodic checkpoint at the last step
            self.checkpoint(done)
        self.metrics.close()
        if cfg.logging.plots:
            plot_run(self.run_dir)
        if history and not any(m.get("advantages/nonzero_frac", 0.0) > 0 for m in history):
            raise TrainingFailed(self._nothing_trained_message(history))
        return history

    @contextlib.contextmanager
    def _closing_pipeline(self) -> Iterator[None]:
        """Async mode: the rollouts still running when training stops are waited for, not leaked."""
        try:
            yield
        finally:
            if self.pipeline is not None:
                self.pipeline.close(timeout=self.cfg.timeouts.data_wait_s)
                self.pipeline = None

    def _breaker_message(self, step: int, failing: int, failure: FailureSummary | None) -> str:
        assert failure is not None
        return (
            f"{failure.fraction:.0%} of step {step}'s episodes failed, and more than "
            f"trainer.max_failed_fraction={self.cfg.trainer.max_failed_fraction} failed for {failing} steps in a "
            f"row. Most frequent failure ({failure.count} episodes), at the '{failure.boundary}' boundary: "
            f"{failure.message}. Example episode: {failure.example} (agentrl replay {self.run_dir} "
            f"--episode {failure.example}). Fix the cause, or raise trainer.max_failed_fraction (null: never stop)."
        )

    def _nothing_trained_message(self, history: list[dict[str, float]]) -> str:
        failed = max(m.get("episodes/failed_frac", 0.0) for m in history)
        if all(_prompt_too_long(m) for m in history):
            return (
                f"no step trained: in all {len(history)} steps every episode stopped before the model wrote a "
                f"token: the prompt (system prompt, tool schemas, task) is longer than "
                f"rollout.max_episode_tokens={self.cfg.rollout.max_episode_tokens}; raise it"
            )
        why = (
            "episodes failed: see the FAILED part of the progress lines, and agentrl replay "
            f"{self.run_dir} --filter failure=BOUNDARY"
            if failed > 0
            else "no group had rewards that differ (all correct or all wrong): check the warm start with "
            "agentrl eval, or the reward functions"
        )
        return (
            f"no step trained: in all {len(history)} steps every advantage was 0 or the update was "
            f"skipped ({why})"
        )

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
            metrics.update(self._async_metrics(metrics))
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
        """The learner's update, then the new weights pushed to the engine. With
        ``rollout.colocate.sleep`` the engine sleeps through the update and wakes its weights for the
        push, then its KV cache (colocate.py)."""

        def update() -> dict[str, float]:
            return self.learner.update(batch, step)  # π_old, advantages, weights, optimizer steps

        if self.cfg.rollout.colocate.sleep:
            from agentrl.sync import colocate

            reports: list[weight_sync.SyncReport] = []

            def push() -> dict[str, float]:  # verified once the KV cache is awake (the probe generates)
                reports.append(self._sync(defer_verify=True))
                return {}

            metrics = colocate.cycle_for(self.engine, self.cfg).around_update(update, push)
            report = weight_sync.verify_synced(self.engine, reports[0], *self._sync_args())
            metrics.update(report.metrics())
            return metrics
        metrics = update()
        metrics.update(self._push_weights())
        return metrics

    def _push_weights(self) -> dict[str, float]:
        """Send the learner's current weights to the engine in buckets and, as ``rollout.sync.verify``
        says, check that it serves them (``weight_sync.py``; every rank, in step); returns the sync's
        metrics. Raises ``WeightSyncError`` when the engine serves other weights."""
        return self._sync().metrics()

    def _sync_args(self) -> tuple[weight_sync.SyncSettings, weight_sync.PolicyProbe]:
        return weight_sync.SyncSettings.from_config(self.cfg), weight_sync.PolicyProbe.of(self.learner)

    def _sync(self, defer_verify: bool = False) -> weight_sync.SyncReport:
        return weight_sync.sync_weights(
            self.engine, self.learner.engine_weights(), *self._sync_args(), defer_verify=defer_verify
        )

    # -- rollouts and filters ----------------------------------------------------------------
    def collect(self, step: int) -> tuple[list[Episode], list[Episode], dict[str, float]]:
        """Episodes of this step (all, for transcripts) and the ones to train on. With dynamic
        sampling, keeps sampling rounds until ``prompts_per_step`` informative groups are found or
        ``max_sampling_rounds`` is spent."""
        cfg, a = self.cfg, self.cfg.algorithm
        rounds = a.max_sampling_rounds if a.dynamic_sampling else 1
        info: dict[str, float] = {}
        all_eps: list[Episode] = []
        kept_groups: list[list[Episode]] = []
        n_groups_seen = n_stale = 0
        waited = 0.0
        for r in range(rounds):
            if cfg.trainer.mode == "async":  # finished episodes from the rollout pipeline
                pipeline = self._pipeline(step)
                if r > 0:
                    pipeline.grant_round(step, r)
                eps, _, took = pipeline.take()
                waited += took.waited_s
                if r == 0:
                    info["async/queued_batches"] = float(took.queued)
                    info["async/running_batches"] = float(took.running)
            else:
                tasks = self.sampler.next(cfg.rollout.prompts_per_step)
                label = (
                    step,
                    r,
                )  # distinct seeds for every episode of the step: no two share a sample stream
                requests = batch_requests(label, tasks, cfg.rollout.group_size)
                eps = ranks.gather_episodes(partial(self._run_batch, label), requests)  # each rank its share
            all_eps += eps
            # off-policy guard: episodes sampled more than max_staleness versions ago are not trained on
            stale = off.too_stale(eps, self.engine.version, cfg.rollout.max_staleness)
            n_stale += sum(stale)
            usable = [ep for ep, too_old in zip(eps, stale) if not ep.failed and not too_old]
            n_groups_seen += len({ep.group for ep in usable})
            # Dynamic sampling keys on the task outcome, the reward *before* DAPO's overlong shaping
            # (DAPO and verl filter on accuracy): an all-correct group whose members differ only in
            # their length penalty carries no outcome signal and is dropped.
            keep = (
                alg.dynamic_sampling_keep([ep.reward for ep in usable], [ep.group for ep in usable])
                if a.dynamic_sampling
                else range(len(usable))
            )
            self.shape_rewards(eps)
            groups = defaultdict(list)
            for i in keep:
                groups[usable[i].group].append(usable[i])
            kept_groups += [g for g in groups.values() if len(g) >= 2]  # a group of one has no baseline
            if len(kept_groups) >= cfg.rollout.prompts_per_step:
                break
        kept_groups = kept_groups[: cfg.rollout.prompts_per_step]
        info.update(
            {
                "groups/informative": float(len(kept_groups)),
                "groups/seen": float(n_groups_seen),
                "groups/sampling_rounds": float(r + 1),
                "offpolicy/stale_dropped": float(n_stale),
                **off.staleness_metrics(all_eps, self.engine.version),
            }
        )
        if cfg.trainer.mode == "async":
            info["async/trainer_wait_s"] = waited
        return all_eps, [e for g in kept_groups for e in g], info

    def _run_batch(self, label: tuple[int, int], requests: list[EpisodeRequest]) -> list[Episode]:
        """One batch's episodes on this rank's engine, with the runner seed of its (step, round)."""
        runner = build.build_runner(
            cfg := self.cfg, self.engine, self.tokenizer, seed=mix_seed(cfg.run.seed, *label)
        )
        try:
            return runner.run(requests)
        finally:
            runner.close()

    def _pipeline(self, step: int) -> RolloutPipeline:
        """Async mode's rollout pipeline, started at the first step this process runs."""
        if self.pipeline is None:
            cfg = self.cfg
            self.pipeline = RolloutPipeline(
                self.sampler,
                cfg.rollout.prompts_per_step,
                cfg.trainer.total_steps,
                cfg.rollout.max_staleness,
                cfg.rollout.on_stale,
                lambda label, tasks: self._run_batch(
                    label, ranks.local_share(batch_requests(label, tasks, cfg.rollout.group_size))
                ),
                cfg.timeouts.data_wait_s,
                start_step=step,
                state=self._pipeline_state,
            )
            self._async_marks = (0.0, self._blocked_s())
        return self.pipeline

    def _blocked_s(self) -> float:
        return self.engine.blocked_s if isinstance(self.engine, EngineGate) else 0.0

    def _async_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """Where async mode's time went this step: the trainer waiting for data, the engine idle (no
        batch running: waiting for weights) and engine calls blocked by a weight push."""
        assert self.pipeline is not None
        idle, blocked = self.pipeline.idle_s(), self._blocked_s()
        out = {
            "async/engine_idle_s": idle - self._async_marks[0],
            "async/engine_blocked_s": blocked - self._async_marks[1],
            "async/trainer_idle_frac": metrics.get("async/trainer_wait_s", 0.0)
            / max(metrics["time/step_s"], 1e-9),
        }
        self._async_marks = (idle, blocked)
        return out

    def shape_rewards(self, episodes: list[Episode]) -> None:
        """DAPO soft overlong punishment on the policy-token length, added to the reward."""
        o = self.cfg.algorithm.overlong
        if not o.enabled:
            return
        assert o.max_length is not None and o.cache_length is not None  # resolved by load_config
        pen = alg.overlong_penalty([e.num_policy_tokens for e in episodes], o.max_length, o.cache_length)
        for ep, p in zip(episodes, pen):
            if p:
                ep.reward_components["overlong"] = p
                ep.reward += p

    # -- evaluation, checkpoints -------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        tasks = self.test_tasks if self.cfg.eval.split == "test" and self.test_tasks else None
        tasks = tasks or components.load_tasks(self.cfg, self.cfg.eval.split)
        if self.cfg.eval.num_tasks:
            tasks = tasks[: self.cfg.eval.num_tasks]
        return evaluate(self.cfg, self.engine, self.tokenizer, tasks)[0]

    def checkpoint(self, step: int) -> Path:
        """Every rank calls this. Each writes its part of the weights (all of them on rank 0 unless
        sharded) into one temporary directory; rank 0 adds the state (sampler, algorithm state, every
        rank's RNG states and JSONL lengths gathered) and renames it complete (``checkpoint.commit``)."""
        parts = ranks.gather_to_rank0(rank_state(self.run_dir))
        tmp = begin(self.root_dir, step, self.rank)
        record = save_weights(tmp, self.learner, self.base_path)
        if self.rank:
            return self.root_dir / "checkpoints" / f"step_{step}"
        state = {
            **self.learner.state_dict(),  # the weighting's state (and the optimizer's, unless sharded)
            "sampler": self.pipeline.state()["sampler"] if self.pipeline else self.sampler.state(),
            "pipeline": self.pipeline.state() if self.pipeline else self._pipeline_state,
            "engine_version": int(self.engine.version),
            "ranks": parts,
            "weights": record,
        }
        return commit(self.root_dir, tmp, step, self.tokenizer, state, keep=self.cfg.trainer.keep_checkpoints)

    def _resume_point(self) -> tuple[Path | None, dict[str, Any] | None]:
        """Rank 0's newest complete checkpoint and its state: rank 0 picks it for every rank. Without
        one the run starts over: lines a killed first attempt wrote before any checkpoint are cut, so
        no step is written twice."""
        ckpt = ranks.broadcast_from_rank0(latest_checkpoint(self.root_dir) if self.rank == 0 else None)
        if ckpt is None:
            cut = sum(truncate_to(self.run_dir / f, 0) for f in ("metrics.jsonl", "transcripts.jsonl"))
            if cut:
                self.log(
                    f"no checkpoint in {self.root_dir}: starting over (dropped {cut} bytes written before one)"
                )
            return None, None
        return ckpt, load_state(ckpt)  # every rank reads rank 0's directory (one node or a shared filesystem)

    def _resume(self, ckpt: Path, state: dict[str, Any]) -> None:
        self.start_step = int(state["step"])
        load_weights(ckpt, self.learner, weights_record(state))  # DCP reshards to this run's ranks
        self.learner.load_state_dict(state)
        self.sampler.load(state["sampler"])
        if self.cfg.trainer.mode == "async":
            self._pipeline_state = state.get("pipeline")  # the batches granted and not yet trained on
        self._push_weights()
        while int(self.engine.version) < state["engine_version"]:
            self.engine.load_weights({})  # keep version numbers continuous
        own = saved_rank_state(state, self.rank, self.world)  # this rank's RNG and file lengths
        if own is None:  # a resume on more ranks than saved it: this rank starts its streams afresh
            own = {"metrics_bytes": 0, "transcripts_bytes": 0, "rng": None}
            seed_everything(mix_seed(self.cfg.run.seed, self.start_step, 1000 + self.rank))
        cut_m = truncate_to(self.run_dir / "metrics.jsonl", own["metrics_bytes"])
        cut_t = truncate_to(self.run_dir / "transcripts.jsonl", own["transcripts_bytes"])
        if own["rng"] is not None:
            set_rng_state(own["rng"])
        saved_world = len(state.get("ranks") or [state])
        if self.rank == 0:  # ranks this run no longer has: their files end at the checkpoint too
            for r, part in enumerate(state.get("ranks") or []):
                if r >= self.world:
                    gone = self.root_dir / "ranks" / str(r)
                    truncate_to(gone / "metrics.jsonl", part["metrics_bytes"])
                    truncate_to(gone / "transcripts.jsonl", part["transcripts_bytes"])
        self.log(
            f"resumed from {ckpt} (the state after steps 0-{self.start_step - 1}) at step {self.start_step}"
            + (
                f" (dropped {cut_m} + {cut_t} bytes of metrics/transcripts written after it)"
                if cut_m or cut_t
                else ""
            )
            + (
                f"; written by {saved_world} rank(s), resumed on {self.world}: weights and optimizer "
                "resharded, ranks without a saved part start fresh RNG streams"
                if saved_world != self.world
                else ""
            )
        )


# -- the entry point ------------------------------------------------------------------------------
def train(cfg: Config, log=print, overwrite: bool = False, force: bool = False) -> list[dict[str, float]]:
    """Run training to ``trainer.total_steps`` (or resume to it).

    A first SIGTERM or SIGINT (Ctrl-C) lets the current step finish, writes a checkpoint at it and
    then raises ``KeyboardInterrupt`` (so the CLI exits with 130 and says how to resume); a second
    one raises ``KeyboardInterrupt`` at once, and the run resumes from its last checkpoint."""
    trainer = Trainer(cfg, log=log, overwrite=overwrite, force=force)

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

    main = threading.current_thread() is threading.main_thread()  # handlers: main thread only
    previous = {sig: signal.signal(sig, _graceful) for sig in (signal.SIGTERM, signal.SIGINT)} if main else {}
    try:
        history = trainer.train()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        mcp = sys.modules.get("agentrl.env.mcp_tools")  # the environments' MCP servers, if any started
        if mcp is not None:
            mcp.close_all()
    if trainer.stop_requested:
        raise KeyboardInterrupt
    return history
