"""The RL loop, top to bottom.

Per step: sample tasks -> run ``group_size`` episodes per task -> rewards (+ DAPO overlong shaping)
-> filters (failed episodes out, dynamic sampling, void-turn and truncation masks) -> advantages ->
recompute old logprobs and entropy on the trainer -> token weights on the whole batch (STARE, ...)
-> mini/micro-batched updates -> push weights to the engine -> overlays, transcripts, metrics,
checkpoint.

Departures from plain GRPO, each a config switch (ALGORITHMS.md): clip-higher, dual clip,
token-mean over the whole batch, dynamic sampling, token weightings. Only policy tokens (mask 1)
enter any loss or statistic; tool output, prompts, scaffolding and padding never do.
Episodes that failed (an exception at the model, env, tool, sandbox or reward boundary) are kept in
the transcripts but left out of groups and losses: an infrastructure failure says nothing about the
policy.

Scale (docs/scaling.md): the engine may be vLLM or a pool of Ray workers (``build.build_engine``);
under torchrun each rank runs its share of the rollouts and of every mini-batch's rows, and DDP sums
the gradients (``ddp.py``). Off-policy guards (``offpolicy.py``): episodes lagging more than
``rollout.max_weight_lag`` weight versions are not trained on; ``algorithm.is_correction=tis``
weights each token by the truncated ratio π_old/π_rollout; a jump in the mismatch is warned about.
"""

from __future__ import annotations

import math
import random
import signal
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentrl import algorithms as alg
from agentrl import build, components, ddp
from agentrl import offpolicy as off
from agentrl.algorithms.registry import weighting_name, weighting_settings
from agentrl.batch import Batch, batch_forward, build_batch, token_metrics
from agentrl.checkpoint import (
    latest_checkpoint,
    load_state,
    rank_state,
    save_checkpoint,
    saved_rank_state,
    set_rng_state,
    truncate_to,
)
from agentrl.config import Config, config_to_dict, save_config
from agentrl.data import TaskSampler
from agentrl.episode import Episode
from agentrl.evaluation import evaluate
from agentrl.metrics import MetricsLogger, episode_metrics, plot_run
from agentrl.overlays import attach_overlays
from agentrl.progress import TrainProgress
from agentrl.runner import EpisodeRequest
from agentrl.transcripts import TranscriptWriter

TRUNCATED = ("token_budget", "max_turns", "truncated")


@dataclass
class StepOutput:
    metrics: dict[str, float]
    episodes: list[Episode]


@dataclass
class PolicyStats:
    """π_old's log-prob and entropy of every target token of a batch, [B, T] each. ``pending``: not
    computed before the update; the gradient pass fills them (``Trainer.policy_stats``)."""

    logp: torch.Tensor
    entropy: torch.Tensor
    pending: bool = False


class Trainer:
    def __init__(self, cfg: Config, log=print) -> None:
        self.cfg, self.log = cfg, log
        self.rank, self.world = ddp.init_from_env()  # data-parallel ranks under torchrun (ddp.py)
        self.root_dir = Path(cfg.run.output_dir or f"runs/{cfg.run.name}")  # rank 0's; checkpoints
        # other ranks keep their own copy of the run's files
        self.run_dir = self.root_dir / "ranks" / str(self.rank) if self.rank else self.root_dir
        self.run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, self.run_dir)
        _seed_everything(cfg.run.seed)
        if cfg.run.deterministic:
            torch.use_deterministic_algorithms(True)
        self.start_step = self.step = 0
        ckpt, state = self._resume_point() if cfg.run.resume else (None, None)
        path = str(ckpt) if ckpt else build.policy_path(cfg, log=log)
        self.model, self.tokenizer = components.load_model(cfg, path)
        self.model.train()
        if cfg.model.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()  # type: ignore[operator]
        self.dp_model = ddp.wrap(self.model, self.world)  # the model itself on one process
        # shared-prompt forward (agentrl.forward): one process only (DDP expects one forward per
        # backward) and not with gradient checkpointing (which turns the KV cache off)
        self.share_prefix = (
            cfg.trainer.share_prefix and self.world == 1 and not cfg.model.gradient_checkpointing
        )
        self.fuse_old_logprobs = True  # see update(); tests turn it off to compare both paths
        t = cfg.trainer
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            trainable,
            lr=t.lr,
            betas=(t.betas[0], t.betas[1]),
            weight_decay=t.weight_decay,
            # one fused kernel over all parameters (the same update; ~4x faster than the per-tensor
            # loop torch picks by default on CPU)
            fused=all(p.is_floating_point() for p in trainable) or None,
        )
        self.ref_model = self._reference_model(log) if cfg.algorithm.kl_coef > 0 else None
        self.engine = build.build_engine(cfg, self.model, self.tokenizer, path)
        self.train_tasks = components.load_tasks(cfg, "train")
        self.sampler = TaskSampler(self.train_tasks, cfg.run.seed)
        self.weighting = weighting_name(cfg)
        self.weighting_state: Any = None
        self.mismatch = off.MismatchMonitor()  # warns when rollout/trainer logprobs drift apart
        self.stop_requested = False  # set by a first SIGTERM/SIGINT (``train``): stop after this step
        if ckpt and state:
            self._resume(ckpt, state)  # cuts metrics/transcripts back to the checkpoint before we append
        self.transcripts = TranscriptWriter(self.run_dir / "transcripts.jsonl")
        self.metrics = MetricsLogger(
            self.run_dir,
            tensorboard=cfg.logging.tensorboard,
            wandb_project=cfg.logging.wandb_project if cfg.logging.wandb else None,
            config=config_to_dict(cfg),
            every=cfg.logging.log_every,
        )

    def _reference_model(self, log) -> torch.nn.Module:
        """The frozen reference policy of the KL penalty: ``model.ref_path``, else the policy RL
        started from (the warm start; on a resume too, never the checkpoint). It costs one more copy
        of the weights in ``model.dtype`` (no gradients, no optimizer state) and one forward per step."""
        path = self.cfg.model.ref_path or build.policy_path(self.cfg, log=log)
        ref, _ = components.load_model(self.cfg, path)
        ref.eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        log(f"KL reference policy: {path}")
        return ref

    # -- the loop ----------------------------------------------------------------------------
    def train(self) -> list[dict[str, float]]:
        cfg, history = self.cfg, []
        t_start = time.perf_counter()
        with TrainProgress(cfg.trainer.total_steps, self.start_step, every=cfg.logging.log_every) as progress:
            for step in range(self.start_step, cfg.trainer.total_steps):
                out = self.train_step(step)
                if cfg.trainer.eval_every and (step + 1) % cfg.trainer.eval_every == 0:
                    out.metrics.update(self.evaluate())
                self.metrics.log(step, out.metrics)
                if cfg.logging.transcripts and step % cfg.logging.transcript_every == 0:
                    self.transcripts.write(out.episodes)
                if cfg.trainer.checkpoint_every and (step + 1) % cfg.trainer.checkpoint_every == 0:
                    self.checkpoint(step + 1)
                history.append(out.metrics)
                progress.update(step, out.metrics)
                elapsed = (time.perf_counter() - t_start) / 60
                # rank 0's clock decides, so every rank stops after the same step
                if cfg.trainer.max_wall_minutes and ddp.broadcast_from_rank0(
                    elapsed > cfg.trainer.max_wall_minutes
                ):
                    self.log(
                        f"stopping: trainer.max_wall_minutes={cfg.trainer.max_wall_minutes} reached at step {step + 1}"
                    )
                    break
                if ddp.any_rank(self.stop_requested):  # a signal on any rank stops every rank here
                    self.stop_requested = True
                    self.log(f"stopping on a signal after step {step + 1}, with a checkpoint")
                    break
        done, every = self.start_step + len(history), cfg.trainer.checkpoint_every
        if history and not (every and done % every == 0):  # no periodic checkpoint at the last step
            self.checkpoint(done)
        self.metrics.close()
        if cfg.logging.plots:
            plot_run(self.run_dir)
        return history

    def train_step(self, step: int) -> StepOutput:
        self.step = step
        t0 = time.perf_counter()
        episodes, kept, info = self.collect(step)  # rollouts + filters
        t_rollout = time.perf_counter() - t0
        metrics = {**episode_metrics(episodes), **info}
        if kept:
            batch = self.make_batch(kept)  # rewards -> advantages -> tensors
            metrics.update(self.update(batch))  # old logprobs, weights, optimizer steps
            self.engine.load_weights(self.model.state_dict())  # push the new weights
        else:
            metrics["update/skipped"] = 1.0
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
        if "mismatch/abs_logp_mean" in metrics and (
            w := self.mismatch.update(metrics["mismatch/abs_logp_mean"])
        ):
            self.log(f"warning (step {step}): {w}")
            metrics["mismatch/jump"] = 1.0
        for ep in episodes:
            ep.step = step
            ep.metrics["weighting"] = self.weighting
        return StepOutput(metrics, episodes)

    # -- rollouts and filters ----------------------------------------------------------------
    def collect(self, step: int) -> tuple[list[Episode], list[Episode], dict[str, float]]:
        """Episodes of this step (all, for transcripts) and the ones to train on. With dynamic
        sampling, keeps sampling rounds until ``prompts_per_step`` informative groups are found or
        ``max_sampling_rounds`` is spent."""
        cfg, a = self.cfg, self.cfg.algorithm
        rounds = a.max_sampling_rounds if a.dynamic_sampling else 1
        all_eps: list[Episode] = []
        kept_groups: list[list[Episode]] = []
        n_groups_seen = n_stale = lag_max = 0
        for r in range(rounds):
            tasks = self.sampler.next(cfg.rollout.prompts_per_step)
            runner = build.build_runner(cfg, self.engine, self.tokenizer, seed=_mix(cfg.run.seed, step, r))
            requests = [
                EpisodeRequest(  # distinct seeds for every episode of the step, so no two share a sample stream
                    task,
                    seed=i * cfg.rollout.group_size + j,
                    group=f"s{step}r{r}t{i}",
                    episode_id=f"s{step}-r{r}-t{i}-g{j}",
                )
                for i, task in enumerate(tasks)
                for j in range(cfg.rollout.group_size)
            ]
            try:
                eps = ddp.gather_episodes(runner.run, requests)  # each rank runs its share
            finally:
                runner.close()
            all_eps += eps
            # off-policy guard: episodes sampled more than max_weight_lag versions ago are not trained on
            stale = off.too_stale(eps, self.engine.version, cfg.rollout.max_weight_lag)
            n_stale += sum(stale)
            lag_max = max([lag_max] + [off.version_lag(e, self.engine.version) for e in eps])
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
        info = {
            "groups/informative": float(len(kept_groups)),
            "groups/seen": float(n_groups_seen),
            "groups/sampling_rounds": float(r + 1),
            "offpolicy/stale_dropped": float(n_stale),
            "offpolicy/version_lag_max": float(lag_max),
        }
        return all_eps, [e for g in kept_groups for e in g], info

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

    def make_batch(self, episodes: list[Episode]) -> Batch:
        """The kept episodes as tensors; void-turn episodes (SimpleTIR) and, unless
        ``rollout.train_on_truncated``, truncated ones get loss mask 0 but stay in their groups.
        Advantages are set by the update (``advantages``), once the KL penalty is known."""
        a = self.cfg.algorithm
        void = alg.void_turn_multipliers([e.stop_reason == "void_turn" for e in episodes])
        multipliers = [
            (v if a.void_turn_masking else 1.0)
            * (0.0 if not self.cfg.rollout.train_on_truncated and e.stop_reason in TRUNCATED else 1.0)
            for v, e in zip(void, episodes)
        ]
        zeros = torch.zeros(len(episodes))
        return build_batch(episodes, zeros, multipliers, pad_id=self.tokenizer.pad_token_id or 0)

    # -- the update, in phases ---------------------------------------------------------------
    def update(self, batch: Batch) -> dict[str, float]:
        """Train on one step's batch, phase by phase:
        1. ``policy_stats``: π_old's log-probs and entropies (one no-grad pass, or none; see there);
        2. ``reference_logprobs``: the frozen reference policy's log-probs (KL penalty only);
        3. ``advantages``: group advantages of the rewards (minus β·KL with ``kl_in: reward``);
        4. ``token_weights``: the method's weighting over the whole batch (STARE, ...);
        5. ``optimise``: one optimizer step per mini-batch, gradients accumulated over micro-batches;
        6. metrics, and the per-token overlays for the transcripts (one more no-grad pass)."""
        plan = self._update_plan(batch.size)
        stats = self.policy_stats(batch)
        ref = self.reference_logprobs(batch)
        batch.advantages, out = self.advantages(batch, stats, ref)
        tw = self.token_weights(batch, stats, plan)
        losses, clip_status = self.optimise(batch, stats, ref, tw, plan)
        out.update(losses)
        out.update({f"{self.weighting}/{k}": v for k, v in tw.stats.items()})
        out.update(token_metrics(stats.logp, stats.entropy, batch))
        if self.cfg.logging.transcripts:
            with torch.no_grad():
                logp_new, _ = self._forward(self.model, batch)
            attach_overlays(batch, stats.logp, logp_new, stats.entropy, tw, clip_status)
        return out

    def policy_stats(self, batch: Batch) -> PolicyStats:
        """π_old's log-prob and entropy at every target token, from a no-grad pass. When nothing
        reads them before the gradient pass (one on-policy optimizer pass, no token weighting, no TIS,
        no KL in the reward), that pass's own values are π_old's (same weights, same tokens): this
        pass is skipped and ``optimise`` fills them, as TRL does at num_iterations=1."""
        t, a = self.cfg.trainer, self.cfg.algorithm
        pending = (
            self.fuse_old_logprobs
            and self.weighting == "none"
            and t.epochs_per_step == 1
            and t.mini_batches_per_step == 1
            and a.is_correction == "none"
            and not (self.ref_model is not None and a.kl_in == "reward")
        )
        if pending:
            return PolicyStats(torch.zeros_like(batch.mask), torch.zeros_like(batch.mask), pending=True)
        with torch.no_grad():
            logp, entropy = self._forward(self.model, batch)  # [B, T] each
        return PolicyStats(logp, entropy)

    def reference_logprobs(self, batch: Batch) -> torch.Tensor | None:
        """The frozen reference policy's log-probs [B, T] (None without a KL penalty)."""
        if self.ref_model is None:
            return None
        with torch.no_grad():
            return self._forward(self.ref_model, batch)[0]

    def advantages(
        self, batch: Batch, stats: PolicyStats, ref: torch.Tensor | None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Group advantages [B] of the episodes' rewards. With ``kl_in: reward`` each reward first
        loses β·Σ_t KL_t over the episode's trained tokens (π_old against the reference)."""
        a = self.cfg.algorithm
        assert a.advantage is not None  # presets are resolved by load_config
        rewards = torch.tensor([e.reward for e in batch.episodes], dtype=torch.float64)
        out: dict[str, float] = {}
        if ref is not None and a.kl_in == "reward":
            kl = alg.kl_penalty(stats.logp, ref, a.kl_estimator)  # [B, T]
            per_episode = torch.where(batch.mask > 0, kl, torch.zeros_like(kl)).sum(-1).double()  # [B]
            rewards = rewards - a.kl_coef * per_episode
            out["kl/reward_penalty_mean"] = float(a.kl_coef * per_episode.mean())
        groups = [e.group for e in batch.episodes]
        return alg.compute_advantages(a.advantage, rewards, groups), out

    def token_weights(
        self, batch: Batch, stats: PolicyStats, plan: list[list[torch.Tensor]]
    ) -> alg.TokenWeights:
        """The method's token weights over the whole batch, from its record: its settings and this
        step's context (seed, the micro-batches the update runs, last step's state)."""
        record = alg.WEIGHTINGS[self.weighting]
        step = alg.StepContext(
            seed=_mix(self.cfg.run.seed, self.step, 29),  # a fresh draw every step, the same on resume
            row_groups=[
                g.tolist() for g in ddp.micro_batches(plan[0], self.cfg.trainer.micro_batch_size, self.world)
            ],
            state=self.weighting_state,
        )
        inputs = alg.WeightingInputs.build(stats.logp, stats.entropy, batch.advantages, batch.mask)
        tw = alg.compute_weights(record.name, inputs, **record.kwargs(weighting_settings(self.cfg), step))
        if tw.state is not None:
            self.weighting_state = tw.state
        return tw

    def optimise(
        self,
        batch: Batch,
        stats: PolicyStats,
        ref: torch.Tensor | None,
        tw: alg.TokenWeights,
        plan: list[list[torch.Tensor]],
    ) -> tuple[dict[str, float], torch.Tensor]:
        """One optimizer step per mini-batch of ``plan``: each rank runs its rows in micro-batches and
        the gradients are all-reduced once, on the last one. Returns the loss metrics and the clip
        status of every token."""
        a, t = self.cfg.algorithm, self.cfg.trainer
        assert a.loss_agg is not None  # presets are resolved by load_config
        tis = None  # truncated IS weights for the rollout/trainer mismatch, [B, T] (offpolicy.py)
        if a.is_correction == "tis":
            tis = off.tis_weights(stats.logp, batch.engine_logp, batch.has_engine_logp, a.is_cap)
        max_len = a.overlong.max_length or batch.ids.shape[1]
        clip_status = torch.zeros_like(batch.mask)
        parts: dict[str, list[tuple[float, float]]] = defaultdict(list)
        grad_norms = []
        for minis in plan:
            for mini in minis:
                norm = alg.loss_normaliser(tw.mask[mini], a.loss_agg, max_len)
                self.optimizer.zero_grad(set_to_none=True)
                rows, scale = ddp.local_rows(mini, self.rank, self.world)  # this rank's rows, loss × W
                micros = rows.split(t.micro_batch_size)
                for i, micro in enumerate(micros):
                    ddp.set_sync(self.dp_model, last=i == len(micros) - 1)  # all-reduce once
                    result = self.micro_step(batch, micro, stats, ref, tw, tis, norm)
                    (result.loss * scale).backward()
                    clip_status[micro, : result.clip_status.shape[1]] = result.clip_status
                    for k, v in result.stats.items():
                        parts[k].append((v, result.stats["n_tokens"]))
                if t.grad_clip:
                    grad_norms.append(
                        float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), t.grad_clip))
                    )
                self._set_lr()
                self.optimizer.step()
        out = {f"loss/{k}": _weighted(v) for k, v in parts.items() if k != "n_tokens"}
        if tis is not None and (m := (batch.mask > 0) & batch.has_engine_logp).any():
            out["offpolicy/tis_mean"] = float(tis[m].mean())
            out["offpolicy/tis_capped_frac"] = float((tis[m] >= a.is_cap).float().mean())
        if grad_norms:
            out["grad/norm"] = float(np.mean(grad_norms))
        return out, clip_status

    def micro_step(
        self,
        batch: Batch,
        micro: torch.Tensor,
        stats: PolicyStats,
        ref: torch.Tensor | None,
        tw: alg.TokenWeights,
        tis: torch.Tensor | None,
        normaliser: float,
    ) -> alg.PolicyLoss:
        """The loss of rows ``micro`` (their forward with gradient; the caller runs the backward)."""
        a = self.cfg.algorithm
        assert a.loss_agg is not None and a.clip_low is not None and a.clip_high is not None
        sub, part = batch.rows(micro), tw.rows(micro)  # trimmed to the micro-batch's longest episode
        w = sub.mask.shape[1]
        logp, ent = self._forward(self.dp_model, sub, grad=True)
        if stats.pending:  # one on-policy pass: these are π_old's values (see policy_stats)
            stats.logp[micro, :w], stats.entropy[micro, :w] = logp.detach(), ent.detach()
        weights = part.weights[:, :w] if tis is None else part.weights[:, :w] * tis[micro, :w]
        return alg.policy_loss(
            logp,
            stats.logp[micro, :w],
            sub.advantages,
            part.mask[:, :w],
            normaliser=normaliser,
            agg_mode=a.loss_agg,
            weights=weights,
            clip=part.clip and bool(a.ratio_clip),
            abs_kl_weights=None if part.abs_kl_weights is None else part.abs_kl_weights[:, :w],
            clip_low=a.clip_low,
            clip_high=a.clip_high,
            dual_clip=a.dual_clip,
            logp_ref=ref[micro, :w] if ref is not None and a.kl_in == "loss" else None,
            kl_coef=a.kl_coef,
            kl_estimator=a.kl_estimator,
            entropy=ent if a.entropy_coef else None,
            entropy_coef=a.entropy_coef,
        )

    def _forward(
        self, model: torch.nn.Module, batch: Batch, grad: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs and entropies [B, T] of ``batch`` under ``model`` (micro-batched when no grad)."""
        t = self.cfg.trainer
        size = batch.size if grad else t.micro_batch_size
        return batch_forward(
            model,
            batch,
            size,
            self.cfg.rollout.temperature,
            grad=grad,
            bf16=t.bf16,
            share_prefix=self.share_prefix,
        )

    def _update_plan(self, batch_size: int) -> list[list[torch.Tensor]]:
        """The rows of each optimizer step, per epoch: one mini-batch of all rows, or
        ``mini_batches_per_step`` mini-batches of a fresh seeded shuffle every epoch."""
        t = self.cfg.trainer
        rng = torch.Generator().manual_seed(_mix(self.cfg.run.seed, self.step, 17))
        plan = []
        for _epoch in range(t.epochs_per_step):
            order = (
                torch.randperm(batch_size, generator=rng)
                if t.mini_batches_per_step > 1
                else torch.arange(batch_size)
            )
            plan.append(list(order.chunk(t.mini_batches_per_step)))
        return plan

    def _set_lr(self) -> None:
        t, step = self.cfg.trainer, self.step
        scale = min(1.0, (step + 1) / t.warmup_steps) if t.warmup_steps else 1.0
        if t.lr_schedule == "cosine":
            scale *= 0.5 * (1 + math.cos(math.pi * min(step, t.total_steps) / t.total_steps))
        for g in self.optimizer.param_groups:
            g["lr"] = t.lr * scale

    # -- evaluation, checkpoints -------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        tasks = components.load_tasks(self.cfg, self.cfg.eval.split)
        if self.cfg.eval.num_tasks:
            tasks = tasks[: self.cfg.eval.num_tasks]
        return evaluate(self.cfg, self.engine, self.tokenizer, tasks)[0]

    def checkpoint(self, step: int) -> Path:
        """Every rank calls this. Rank 0 writes the checkpoint (weights, optimizer, sampler, algorithm
        state: the same on every rank) with each rank's own RNG states and JSONL lengths gathered into
        it, so the one atomic rename of ``save_checkpoint`` completes all ranks' parts together."""
        parts = ddp.gather_to_rank0(rank_state(self.run_dir))
        if self.rank:
            return self.root_dir / "checkpoints" / f"step_{step}"
        state = {
            "optimizer": self.optimizer.state_dict(),
            "sampler": self.sampler.state(),
            "weighting": self.weighting,
            "weighting_state": _state_dict(self.weighting_state),
            "engine_version": int(self.engine.version),
            "ranks": parts,
        }
        return save_checkpoint(
            self.root_dir, step, self.model, self.tokenizer, state, keep=self.cfg.trainer.keep_checkpoints
        )

    def _resume_point(self) -> tuple[Path | None, dict[str, Any] | None]:
        """Rank 0's newest complete checkpoint and its state: rank 0 picks it for every rank."""
        ckpt = ddp.broadcast_from_rank0(latest_checkpoint(self.root_dir) if self.rank == 0 else None)
        if ckpt is None:
            return None, None
        state = load_state(ckpt)  # every rank reads rank 0's directory (one node or a shared filesystem)
        saved_rank_state(state, self.rank, self.world, ckpt)  # another world size: fail before loading
        return ckpt, state

    def _resume(self, ckpt: Path, state: dict[str, Any]) -> None:
        own = saved_rank_state(state, self.rank, self.world, ckpt)  # this rank's RNG and file lengths
        self.start_step = int(state["step"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.sampler.load(state["sampler"])
        record = alg.WEIGHTINGS[self.weighting]
        saved = state.get("weighting_state")
        if saved is not None and record.state is not None and state.get("weighting") == self.weighting:
            self.weighting_state = record.state.from_dict(saved)  # type: ignore[attr-defined]
        self.engine.load_weights(self.model.state_dict())
        while int(self.engine.version) < state["engine_version"]:
            self.engine.load_weights(self.model.state_dict())  # keep version numbers continuous
        cut_m = truncate_to(self.run_dir / "metrics.jsonl", own["metrics_bytes"])
        cut_t = truncate_to(self.run_dir / "transcripts.jsonl", own["transcripts_bytes"])
        set_rng_state(own["rng"])
        self.log(
            f"resumed from {ckpt} at step {self.start_step}"
            + (
                f" (dropped {cut_m} + {cut_t} bytes of metrics/transcripts written after it)"
                if cut_m or cut_t
                else ""
            )
        )


# -- helpers --------------------------------------------------------------------------------------
def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _mix(*xs: int) -> int:
    h = 1469598103934665603
    for x in xs:
        h = ((h ^ (x & 0xFFFFFFFF)) * 1099511628211) % 2**61
    return h % 2**31


def _weighted(pairs: list[tuple[float, float]]) -> float:
    total = sum(n for _, n in pairs)
    return sum(v * n for v, n in pairs) / total if total else float("nan")


def _state_dict(state: Any) -> Any:
    return state.to_dict() if hasattr(state, "to_dict") else state


def train(cfg: Config, log=print) -> list[dict[str, float]]:
    """Run training to ``trainer.total_steps`` (or resume to it).

    A first SIGTERM or SIGINT (Ctrl-C) lets the current step finish, writes a checkpoint at it and
    then raises ``KeyboardInterrupt`` (so the CLI exits with 130 and says how to resume); a second
    one raises ``KeyboardInterrupt`` at once, and the run resumes from its last checkpoint."""
    trainer = Trainer(cfg, log=log)

    def _graceful(signum, frame):
        if trainer.stop_requested:
            raise KeyboardInterrupt
        trainer.stop_requested = True
        log(
            f"{signal.Signals(signum).name}: finishing step {trainer.step + 1}, then checkpointing and "
            "stopping (send it again to stop now, losing the step)"
        )

    main = threading.current_thread() is threading.main_thread()  # handlers: main thread only
    previous = {sig: signal.signal(sig, _graceful) for sig in (signal.SIGTERM, signal.SIGINT)} if main else {}
    try:
        history = trainer.train()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if trainer.stop_requested:
        raise KeyboardInterrupt
    return history
