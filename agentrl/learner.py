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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from agentrl import algorithms as alg
from agentrl import build, components, ddp
from agentrl import offpolicy as off
from agentrl.algorithms.registry import weighting_name, weighting_settings
from agentrl.batch import Batch, batch_forward, build_batch, token_metrics
from agentrl.config import Config
from agentrl.episode import Episode
from agentrl.overlays import attach_overlays
from agentrl.seeds import mix_seed

TRUNCATED = ("token_budget", "max_turns", "truncated")
"""Stop reasons of episodes cut by a budget (trained unless ``rollout.train_on_truncated`` is off)."""


@dataclass
class PolicyStats:
    """π_old's log-prob and entropy of every target token of a batch, [B, T] each. ``pending``: not
    computed before the update; the gradient pass fills them (``Learner.policy_stats``)."""

    logp: torch.Tensor
    entropy: torch.Tensor
    pending: bool = False


class Learner:
    """The policy's side of training. ``model`` is trained in place (the caller keeps a reference to
    it for weight sync and checkpoints)."""

    def __init__(
        self,
        cfg: Config,
        model: torch.nn.Module,
        pad_id: int,
        rank: int = 0,
        world: int = 1,
        log: Callable[[str], None] = print,
    ) -> None:
        self.cfg, self.model, self.pad_id, self.rank, self.world = cfg, model, pad_id, rank, world
        self.device = next(model.parameters()).device  # every batch tensor follows the policy
        self.step = 0
        self.dp_model = ddp.wrap(model, world)  # the model itself on one process
        # shared-prompt forward (agentrl.forward): one process only (DDP expects one forward per
        # backward) and not with gradient checkpointing (which turns the KV cache off)
        self.share_prefix = cfg.trainer.share_prefix and world == 1 and not cfg.model.gradient_checkpointing
        self.fuse_old_logprobs = True  # see policy_stats(); tests turn it off to compare both paths
        t = cfg.trainer
        trainable = [p for p in model.parameters() if p.requires_grad]
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
        self.weighting = weighting_name(cfg)
        self.weighting_state: Any = None

    def _reference_model(self, log: Callable[[str], None]) -> torch.nn.Module:
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
        return build_batch(episodes, zeros, multipliers, pad_id=self.pad_id).to(self.device)

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
            rewards = rewards - a.kl_coef * per_episode.cpu()
            out["kl/reward_penalty_mean"] = float(a.kl_coef * per_episode.mean())
        groups = [e.group for e in batch.episodes]
        advantages = alg.compute_advantages(a.advantage, rewards, groups).to(batch.device)
        out["advantages/nonzero_frac"] = float((advantages != 0).float().mean())  # 0: nothing to learn
        return advantages, out

    def token_weights(
        self, batch: Batch, stats: PolicyStats, plan: list[list[torch.Tensor]]
    ) -> alg.TokenWeights:
        """The method's token weights over the whole batch, from its record: its settings and this
        step's context (seed, the micro-batches the update runs, last step's state)."""
        record = alg.WEIGHTINGS[self.weighting]
        step = alg.StepContext(
            seed=mix_seed(self.cfg.run.seed, self.step, 29),  # a fresh draw every step, the same on resume
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
        rng = torch.Generator().manual_seed(mix_seed(self.cfg.run.seed, self.step, 17))
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

    # -- checkpoints ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The optimizer and the weighting's state (the model is saved by the caller)."""
        state = self.weighting_state
        return {
            "optimizer": self.optimizer.state_dict(),
            "weighting": self.weighting,
            "weighting_state": state.to_dict() if hasattr(state, "to_dict") else state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict``'s output; the weighting's state through its record's state class."""
        self.optimizer.load_state_dict(state["optimizer"])
        record = alg.WEIGHTINGS[self.weighting]
        saved = state.get("weighting_state")
        if saved is not None and record.state is not None and state.get("weighting") == self.weighting:
            self.weighting_state = record.state.from_dict(saved)  # type: ignore[attr-defined]


def _weighted(pairs: list[tuple[float, float]]) -> float:
    total = sum(n for _, n in pairs)
    return sum(v * n for v, n in pairs) / total if total else float("nan")
