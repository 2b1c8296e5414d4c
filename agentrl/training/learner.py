"""The learner: one training step's update of the policy from a batch of episodes, in named phases.

``Trainer`` (``trainer.py``) runs the loop: rollouts, filters, the learner's ``update``, weight sync,
transcripts, metrics, checkpoints. The learner owns what the update needs between steps: the policy
being trained (wrapped for DDP under torchrun), the optimizer, the frozen reference policy of the KL
penalty, and the token weighting's state (STARE's controller). Its ``update`` reads top to bottom:
π_old's statistics -> the reference's log-probs -> advantages -> token weights -> optimizer steps ->
metrics and overlays.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from agentrl import algorithms as alg
from agentrl.config import AlgorithmConfig, ModelConfig, TrainerConfig
from agentrl.episode import Episode
from agentrl.parallel import ranks, shard_reads, sharding
from agentrl.seeds import mix_seed
from agentrl.training import lora
from agentrl.training import offpolicy as off
from agentrl.training.batch import Batch, build_batch, token_metrics
from agentrl.training.overlays import attach_overlays
from agentrl.training.passes import Passes
from agentrl.training.policy_setup import make_optimizer, prepare_policy, set_lr, update_plan

TRUNCATED = ("token_budget", "max_turns", "truncated")
"""Stop reasons of episodes cut by a budget (trained unless ``rollout.train_on_truncated`` is off)."""


@dataclass(frozen=True)
class LearnerSettings:
    """What the learner reads of the config (``assembly/records.py`` builds it)."""

    trainer: TrainerConfig
    algorithm: AlgorithmConfig
    model: ModelConfig
    seed: int
    """from ``run.seed``"""
    temperature: float
    """from ``rollout.temperature``"""
    train_on_truncated: bool
    """from ``rollout.train_on_truncated``"""
    keep_overlays: bool
    """from ``logging.transcripts``"""
    weighting: str
    """from ``weighting_name(cfg)``"""
    weighting_settings: Any = None
    """from ``weighting_settings(cfg)``"""

    @property
    def adapters(self) -> bool:
        """Whether the policy trains LoRA adapters (``lora.enabled``)."""
        return lora.enabled(self.model.lora)

    @property
    def needs_reference(self) -> bool:
        """Whether the KL penalty needs its own frozen reference model (not the base under LoRA)."""
        return self.algorithm.kl_coef > 0 and not (self.adapters and not self.model.ref_path)


@dataclass
class PolicyStats:
    """π_old's log-prob and entropy of every target token of a batch, [B, T] each. ``pending``: not
    computed before the update; the gradient pass fills them (``Learner.policy_stats``)."""

    logp: torch.Tensor
    entropy: torch.Tensor
    pending: bool = False
    phi: torch.Tensor | None = None
    """φ of every target token (``alg.entropy_phi``), when the weighting reads it (``needs_phi``)."""


class Learner:
    """The policy's side of training. ``model`` is the policy as loaded (on this rank's device, or
    on the meta device for a rank that receives its shards from rank 0); the learner adds LoRA
    (``model.lora``), wraps or shards it for ``strategy`` (``agentrl.parallel.sharding``) and trains it in
    place: ``self.model`` is the result (a peft model with LoRA, FSDP2-sharded with ``fsdp2``).
    ``shards_from``: the checkpoint every rank reads its own shards from (``parallel/shard_reads.py``;
    each rank then passes ``model`` on the meta device)."""

    def __init__(
        self,
        settings: LearnerSettings,
        model: torch.nn.Module,
        pad_id: int,
        strategy: sharding.Strategy | None = None,
        log: Callable[[str], None] = print,
        reference: torch.nn.Module | Callable[[], torch.nn.Module] | None = None,
        shards_from: str | None = None,
    ) -> None:
        """``reference``: the KL penalty's frozen reference policy prepared for ``strategy``, or a
        callable that builds it (``assembly.build.reference_model``); required when
        ``settings.needs_reference``, built only then."""
        self.settings, self.pad_id = settings, pad_id
        self.strategy = strategy or sharding.Replicated(0, 1, next(model.parameters()).device)
        self.rank, self.world = self.strategy.rank, self.strategy.world
        self.device = self.strategy.device  # every batch tensor follows the policy
        self.step = 0
        # ranks > 0 of a sharded run get their shards from rank 0's weights
        self.log = log
        self.model, broadcast, rank0_state = prepare_policy(
            settings.model, settings.seed, model, self.strategy, log, settings.trainer.computes_bf16
        )
        self.train_module = self.strategy.prepare(self.model)  # DDP's wrapper, or the sharded model
        if broadcast or sharding.on_meta(self.model):
            sharding.materialize(self.model, self.device, rank0_state, broadcast=broadcast)
        del rank0_state
        if shards_from is not None:  # every rank built the policy on meta and reads its own shards
            shard_reads.read_own_shards(self.model, shards_from)
        sharded = self.strategy.equal_forwards
        # shared-prompt forward (agentrl.training.forward): a data-dependent number of forwards, so not where
        # every forward is a collective (FSDP2); in the gradient pass, one process only (DDP expects
        # one forward per backward) and not with gradient checkpointing (which turns the KV cache off)
        self.share_prefix_nograd = settings.trainer.share_prefix and not sharded
        self.share_prefix = (
            self.share_prefix_nograd and self.world == 1 and not settings.model.gradient_checkpointing
        )
        self.passes = Passes(
            settings.trainer, settings.temperature, self.strategy, self.share_prefix_nograd, self.share_prefix
        )
        self.fuse_old_logprobs = True  # see policy_stats(); tests turn it off to compare both paths
        self.optimizer = make_optimizer(settings.trainer, self.model)
        # the KL penalty's frozen reference: with LoRA and no model.ref_path, the base model itself
        # (the policy with its adapters off)
        self.ref_is_base = settings.algorithm.kl_coef > 0 and not settings.needs_reference
        self.ref_model = None
        if settings.needs_reference:
            if reference is None:
                raise ValueError("algorithm.kl_coef > 0 needs the frozen reference: pass reference")
            self.ref_model = reference if isinstance(reference, torch.nn.Module) else reference()
        self.weighting = settings.weighting
        self.weighting_state: Any = None

    def make_batch(self, episodes: list[Episode]) -> Batch:
        """The kept episodes as tensors on the policy's device (``training_batch``)."""
        return training_batch(self.settings, episodes, self.pad_id).to(self.device)

    # -- the update, in phases ---------------------------------------------------------------
    def update(self, batch: Batch, step: int) -> dict[str, float]:
        """Train on one step's batch, phase by phase:
        1. ``policy_stats``: π_old's log-probs and entropies (one no-grad pass, or none; see there);
        2. ``reference_logprobs``: the frozen reference policy's log-probs (KL penalty only);
        3. ``advantages``: group advantages of the rewards (minus β·KL with ``kl_in: reward``);
        4. ``token_weights``: the method's weighting over the whole batch (STARE, ...);
        5. ``optimise``: one optimizer step per mini-batch, gradients accumulated over micro-batches;
        6. metrics, and the per-token overlays for the transcripts (one more no-grad pass)."""
        self.step = step
        plan = update_plan(self.settings.trainer, self.settings.seed, step, batch.size)
        stats = self.policy_stats(batch)
        ref = self.reference_logprobs(batch)
        batch.advantages, out = self.advantages(batch, stats, ref)
        tw = self.token_weights(batch, stats, plan)
        bad = nonfinite({"advantages": batch.advantages, f"{self.weighting} token weights": tw.weights})
        if bad:  # nothing non-finite reaches the update: the step's weights stay as they are
            self.log(f"warning (step {step}): {bad} hold non-finite values: the update is skipped")
            return {**out, "update/nonfinite": 1.0, "update/steps": 0.0}
        losses, clip_status = self.optimise(batch, stats, ref, tw, plan)
        out.update(losses)
        out.update({f"{self.weighting}/{k}": v for k, v in tw.stats.items()})
        out.update(token_metrics(stats.logp, stats.entropy, batch))
        if self.settings.keep_overlays:
            logp_new, _ = self.passes.no_grad(self.model, batch)
            attach_overlays(batch, stats.logp, logp_new, stats.entropy, tw, clip_status)
        return out

    def policy_stats(self, batch: Batch) -> PolicyStats:
        """π_old's log-prob and entropy at every target token, from a no-grad pass. When nothing
        reads them before the gradient pass (one on-policy optimizer pass, no token weighting, no KL
        in the reward), that pass's own values are π_old's (same weights, same tokens): this pass is
        skipped and ``optimise`` fills them, as TRL does at num_iterations=1. TIS's weights are then
        taken per micro-batch from those values (``micro_step``)."""
        t, a = self.settings.trainer, self.settings.algorithm
        pending = (
            self.fuse_old_logprobs
            and self.weighting == "none"
            and t.epochs_per_step == 1
            and t.mini_batches_per_step == 1
            and not (self.ref_model is not None and a.kl_in == "reward")
        )
        if pending:
            return PolicyStats(torch.zeros_like(batch.mask), torch.zeros_like(batch.mask), pending=True)
        phi = alg.WEIGHTINGS[self.weighting].needs_phi  # φ: the same pass, two more vocabulary reductions
        logp, entropy, *rest = self.passes.no_grad(self.model, batch, phi=phi)  # [B, T] each
        return PolicyStats(logp, entropy, phi=rest[0] if rest else None)

    def reference_logprobs(self, batch: Batch) -> torch.Tensor | None:
        """The frozen reference policy's log-probs [B, T] (None without a KL penalty). With LoRA and
        no ``model.ref_path`` the reference is the base model: the policy with its adapters off."""
        if self.ref_is_base:
            with self.model.disable_adapter():  # type: ignore[operator]
                return self.passes.no_grad(self.model, batch)[0]
        if self.ref_model is None:
            return None
        return self.passes.no_grad(self.ref_model, batch)[0]

    def advantages(
        self, batch: Batch, stats: PolicyStats, ref: torch.Tensor | None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Group advantages [B] of the episodes' rewards (``group_advantages``)."""
        return group_advantages(self.settings.algorithm, batch, stats.logp, ref)

    def token_weights(
        self, batch: Batch, stats: PolicyStats, plan: list[list[torch.Tensor]]
    ) -> alg.TokenWeights:
        """The method's token weights over the whole batch, from its record: its settings and this
        step's context (seed, the micro-batches the update runs, last step's state)."""
        record = alg.WEIGHTINGS[self.weighting]
        step = alg.StepContext(
            seed=mix_seed(self.settings.seed, self.step, 29),  # a fresh draw every step, the same on resume
            row_groups=[
                g.tolist()
                for g in ranks.micro_batches(plan[0], self.settings.trainer.micro_batch_size, self.world)
            ],
            state=self.weighting_state,
        )
        inputs = weighting_inputs(self.settings.algorithm, batch, stats)
        tw = alg.compute_weights(record.name, inputs, **record.kwargs(self.settings.weighting_settings, step))
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
        a, t = self.settings.algorithm, self.settings.trainer
        assert a.loss_agg is not None  # presets are resolved by load_config
        max_len = a.overlong.max_length or batch.ids.shape[1]
        clip_status = torch.zeros_like(batch.mask)
        parts: dict[str, list[tuple[float, float]]] = defaultdict(list)
        pg_losses: list[float] = []  # per mini-batch: micro-batches' (and ranks') shares add up to its loss
        grad_norms: list[float] = []
        skipped = 0  # optimizer steps whose gradient norm was not finite
        for minis in plan:
            clip_status.zero_()  # the last epoch's status is the one shown
            for mini in minis:
                norm = alg.loss_normaliser(tw.mask[mini], a.loss_agg, max_len)
                self.optimizer.zero_grad(set_to_none=True)
                micros = self.passes.micro_batches(mini)  # this rank's rows, loss × W (reductions average)
                pg_losses.append(0.0)
                for i, m in enumerate(micros):
                    self.strategy.set_sync(self.train_module, last=i == len(micros) - 1)  # reduce once
                    result = self.micro_step(batch, m.rows, stats, ref, tw, norm, dummy=m.dummy)
                    (result.loss * m.scale).backward()
                    if m.dummy:
                        continue
                    clip_status[m.rows, : result.clip_status.shape[1]] = result.clip_status
                    pg_losses[-1] += result.stats["pg_loss"]  # a share: over the mini-batch's normaliser
                    for k, v in result.stats.items():
                        if k != "pg_loss":  # the rest are means over the micro-batch's tokens
                            parts[k].append((v, result.stats["n_tokens"]))
                grad_norm = self.apply_gradients()
                if grad_norm is None:
                    skipped += 1
                elif t.grad_clip:
                    grad_norms.append(grad_norm)
        if self.world > 1:  # every rank trained its own rows: share what the metrics and overlays read
            clip_status = ranks.sum_over_ranks(clip_status)  # each row written by one rank
            parts = ranks.merge_lists(parts)
            pg_losses = ranks.sum_over_ranks(torch.tensor(pg_losses, dtype=torch.float64)).tolist()
            if stats.pending:  # one mini-batch of all rows: each rank filled its own shard
                stats.logp, stats.entropy = self.passes.gather_own(stats.logp, stats.entropy)
        tis = tis_of(a, stats.logp, batch)  # the weights micro_step applied, for the metrics
        out = loss_metrics(parts, pg_losses, grad_norms, tis, batch, a.is_cap)
        return {**out, **steps_taken(sum(map(len, plan)), skipped, self.step, self.log)}, clip_status

    def apply_gradients(self) -> float | None:
        """Clip the accumulated gradients (by ``trainer.grad_clip``, if set) and take the optimizer
        step. Returns the gradient norm (the same on every rank), or None when it was not finite: the
        gradients are dropped and the step is not taken."""
        norm = self.strategy.clip_grad_norm(self.model, self.settings.trainer.grad_clip or math.inf)
        if not math.isfinite(norm):  # a non-finite loss or gradient
            self.optimizer.zero_grad(set_to_none=True)
            return None
        set_lr(self.settings.trainer, self.optimizer, self.step)
        self.optimizer.step()
        return norm

    def micro_step(
        self,
        batch: Batch,
        micro: torch.Tensor,
        stats: PolicyStats,
        ref: torch.Tensor | None,
        tw: alg.TokenWeights,
        normaliser: float,
        dummy: bool = False,
    ) -> alg.PolicyLoss:
        """The loss of rows ``micro`` (their forward with gradient; the caller runs the backward),
        with TIS's weights (``algorithm.is_correction: tis``, offpolicy.py) from π_old's log-probs.
        ``dummy``: a micro-batch that only keeps the ranks' collectives in step (scale 0): nothing is
        recorded and no statistic is computed."""
        a = self.settings.algorithm
        assert a.loss_agg is not None and a.clip_low is not None and a.clip_high is not None
        sub, part = batch.rows(micro), tw.rows(micro)  # trimmed to the micro-batch's longest episode
        w = sub.mask.shape[1]
        logp, ent = self.passes.forward(self.train_module, sub, grad=True)
        if stats.pending and not dummy:  # one on-policy pass: these are π_old's values (see policy_stats)
            stats.logp[micro, :w], stats.entropy[micro, :w] = logp.detach(), ent.detach()
        tis = tis_of(a, stats.logp[micro, :w], sub)  # π_old's values: just filled when pending
        weights = part.weights[:, :w] if tis is None else part.weights[:, :w] * tis
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
            stats=not dummy,
        )

    # -- weights for the engine, state for checkpoints ----------------------------------------
    def engine_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """What the engine needs after an update, one whole tensor at a time (under FSDP2 each is
        all-gathered when the engine asks for it, a collective every rank must take in step, so
        consume the stream to its end on every rank): with LoRA the merged weights of the adapted
        layers (nothing else changed), else every parameter."""
        if self.settings.adapters:
            return lora.merged_weights(self.model)
        return self.strategy.full_parameters(self.model)

    def engine_buckets(
        self, bucket_bytes: float, dtype: torch.dtype | None = None, full: bool = False
    ) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """``engine_weights`` in buckets of at most ``bucket_bytes``, for a weight sync into an engine
        computing in ``dtype``: under FSDP2 each bucket's shards are cast to ``dtype`` and gathered
        by one collective (``parallel/buckets.py``; consume it to its end on every rank); unsharded
        weights travel as they are (the engine casts as it copies). With LoRA only the adapted layers
        change, so only they travel, unless ``full`` (an engine that discarded its weights)."""
        if self.settings.adapters:
            return lora.merged_buckets(self.model, bucket_bytes, dtype, self.device, full=full)
        return self.strategy.engine_buckets(self.model, bucket_bytes, dtype)

    def state_dict(self) -> dict[str, Any]:
        """The weighting's state and, when the model is not sharded, the optimizer's (a sharded
        optimizer is saved with the model's shards: ``checkpoint.save_weights``)."""
        state = self.weighting_state
        out = {
            "weighting": self.weighting,
            "weighting_state": state.to_dict() if hasattr(state, "to_dict") else state,
        }
        if not self.strategy.equal_forwards:
            out["optimizer"] = self.optimizer.state_dict()
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict``'s output; the weighting's state through its record's state class."""
        if "optimizer" in state:
            self.optimizer.load_state_dict(state["optimizer"])
        record = alg.WEIGHTINGS[self.weighting]
        saved = state.get("weighting_state")
        if saved is not None and record.state is not None and state.get("weighting") == self.weighting:
            self.weighting_state = record.state.from_dict(saved)  # type: ignore[attr-defined]


def steps_taken(total: int, skipped: int, step: int, log: Callable[[str], None]) -> dict[str, float]:
    """``update/steps``, the optimizer steps taken of ``total``; with some ``skipped`` because their
    gradient was not finite, ``update/nonfinite`` too, and a warning in ``log``."""
    if not skipped:
        return {"update/steps": float(total)}
    log(
        f"warning (step {step}): the gradient of {skipped} of {total} mini-batch(es) was not finite (the "
        "loss, or a token's log-prob, was NaN or infinite): those optimizer steps were skipped"
    )
    return {"update/steps": float(total - skipped), "update/nonfinite": float(skipped)}


def weighting_inputs(a: AlgorithmConfig, batch: Batch, stats: PolicyStats) -> alg.WeightingInputs:
    """What the token weighting reads: π_old's values, the advantages, the loss mask, and where the
    π_old pass computed φ, each token's share of the loss aggregation (``alg.token_shares``)."""
    share = None
    if stats.phi is not None:
        assert a.loss_agg is not None  # presets are resolved by load_config
        share = alg.token_shares(batch.mask > 0, a.loss_agg)
    return alg.WeightingInputs.build(
        stats.logp, stats.entropy, batch.advantages, batch.mask, phi=stats.phi, share=share
    )


def training_batch(settings: LearnerSettings, episodes: list[Episode], pad_id: int) -> Batch:
    """The kept episodes as tensors; void-turn episodes (SimpleTIR) and, unless
    ``rollout.train_on_truncated``, truncated ones get loss mask 0 but stay in their groups.
    Advantages are set by the update (``Learner.advantages``), once the KL penalty is known."""
    a = settings.algorithm
    void = alg.void_turn_multipliers([e.stop_reason == "void_turn" for e in episodes])
    multipliers = [
        (v if a.void_turn_masking else 1.0)
        * (0.0 if not settings.train_on_truncated and e.stop_reason in TRUNCATED else 1.0)
        for v, e in zip(void, episodes)
    ]
    return build_batch(episodes, torch.zeros(len(episodes)), multipliers, pad_id=pad_id)


def group_advantages(
    a: AlgorithmConfig, batch: Batch, logp_old: torch.Tensor, ref: torch.Tensor | None
) -> tuple[torch.Tensor, dict[str, float]]:
    """Group advantages [B] of the episodes' rewards. With ``kl_in: reward`` each reward first
    loses β·Σ_t KL_t over the episode's trained tokens (π_old against the reference)."""
    assert a.advantage is not None  # presets are resolved by load_config
    episodes, row_of = batch.parent_rows()  # a split episode is one member of its group
    rewards = torch.tensor([e.reward for e in episodes], dtype=torch.float64)
    out: dict[str, float] = {}
    if ref is not None and a.kl_in == "reward":
        kl = alg.kl_penalty(logp_old, ref, a.kl_estimator)  # [B, T]
        per_row = torch.where(batch.mask > 0, kl, torch.zeros_like(kl)).sum(-1).double().cpu()  # [B]
        per_episode = torch.zeros(len(episodes), dtype=torch.float64).index_add_(0, row_of, per_row)
        rewards = rewards - a.kl_coef * per_episode
        out["kl/reward_penalty_mean"] = float(a.kl_coef * per_episode.mean())
    groups = [e.group for e in episodes]
    advantages = alg.compute_advantages(a.advantage, rewards, groups)[row_of].to(batch.device)
    out["advantages/nonzero_frac"] = float((advantages != 0).float().mean())  # 0: nothing to learn
    return advantages, out


def tis_of(a: Any, logp_old: torch.Tensor, batch: Batch) -> torch.Tensor | None:
    """``algorithm.is_correction: tis``'s weights of ``batch``'s tokens from π_old's ``logp_old``, or None."""
    if a.is_correction != "tis":
        return None
    return off.tis_weights(logp_old, batch.engine_logp, batch.has_engine_logp, a.is_cap)


def loss_metrics(
    parts: dict[str, list[tuple[float, float]]],
    pg_losses: list[float],
    grad_norms: list[float],
    tis: torch.Tensor | None,
    batch: Batch,
    is_cap: float,
) -> dict[str, float]:
    """The update's loss metrics: token-weighted means of the micro-batches' statistics, the mean
    mini-batch loss, the TIS weights' mean and capped share, the mean clipped gradient norm."""
    out = {f"loss/{k}": _weighted(v) for k, v in parts.items() if k != "n_tokens"}
    out["loss/pg_loss"] = float(np.mean(pg_losses))  # the mean mini-batch loss
    if tis is not None and (has := (batch.mask > 0) & batch.has_engine_logp).any():
        out["offpolicy/tis_mean"] = float(tis[has].mean())
        out["offpolicy/tis_capped_frac"] = float((tis[has] >= is_cap).float().mean())
    if grad_norms:
        out["grad/norm"] = float(np.mean(grad_norms))
    return out


def nonfinite(tensors: dict[str, torch.Tensor]) -> str:
    """The names of the tensors holding a NaN or an infinity, joined (empty when all are finite)."""
    return ", ".join(name for name, t in tensors.items() if not bool(torch.isfinite(t).all()))


def _weighted(pairs: list[tuple[float, float]]) -> float:
    total = sum(n for _, n in pairs)
    return sum(v * n for v, n in pairs) / total if total else float("nan")
