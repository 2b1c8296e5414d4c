"""The trainer's data plumbing: episodes -> padded tensors, forward passes for token statistics,
per-token overlays for transcripts, step metrics, task sampling, evaluation, and the mapping from
config to token-weighting parameters (the one place a method's knobs are read from the config).

Alignment: for an episode of n tokens, position t of the [B, T-1] tensors describes token t+1
(predicted from tokens 0..t). ``mask`` is the episode's role-derived loss mask shifted the same way,
times the episode's multiplier (0 for void-turn or untrained truncated episodes).
"""

from __future__ import annotations

import math
import random
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from agentrl import algorithms as alg
from agentrl.env import Task
from agentrl.episode import Episode
from agentrl.forward import first_loss_column, prefix_plan, suffix_logits


@dataclass
class Batch:
    episodes: list[Episode]
    ids: Tensor  # [B, T] right-padded token ids
    lengths: Tensor  # [B] real lengths
    mask: Tensor  # [B, T-1] float loss mask (targets = ids[:, 1:])
    advantages: Tensor  # [B]
    engine_logp: Tensor  # [B, T-1] the engine's logprob of each target token (0 where none)
    has_engine_logp: Tensor  # [B, T-1] bool
    turn_start: Tensor  # [B, T-1] bool: first policy token of each turn

    @property
    def size(self) -> int:
        return self.ids.shape[0]

    def rows(self, idx: Tensor) -> Batch:
        """Rows ``idx``, trimmed to their longest sequence."""
        t = int(self.lengths[idx].max())
        return replace(
            self,
            episodes=[self.episodes[i] for i in idx.tolist()],
            ids=self.ids[idx, :t],
            lengths=self.lengths[idx],
            mask=self.mask[idx, : t - 1],
            advantages=self.advantages[idx],
            engine_logp=self.engine_logp[idx, : t - 1],
            has_engine_logp=self.has_engine_logp[idx, : t - 1],
            turn_start=self.turn_start[idx, : t - 1],
        )


def build_batch(
    episodes: Sequence[Episode], advantages: Tensor, multipliers: Sequence[float], pad_id: int
) -> Batch:
    B = len(episodes)
    T = max(len(e.token_ids()) for e in episodes)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    mask = torch.zeros((B, T - 1))
    elp = torch.zeros((B, T - 1))
    has = torch.zeros((B, T - 1), dtype=torch.bool)
    start = torch.zeros((B, T - 1), dtype=torch.bool)
    lengths = torch.zeros(B, dtype=torch.long)
    for i, (ep, mult) in enumerate(zip(episodes, multipliers)):
        toks = ep.token_ids()
        n = len(toks)
        lengths[i] = n
        ids[i, :n] = torch.tensor(toks)
        m = torch.tensor(ep.loss_mask()[1:], dtype=torch.float32)
        mask[i, : n - 1] = m * mult
        lp = ep.engine_logprobs()[1:]
        elp[i, : n - 1] = torch.tensor([x if x is not None else 0.0 for x in lp])
        has[i, : n - 1] = torch.tensor([x is not None for x in lp])
        pos = 0
        for seg in ep.segments:
            if seg.role == "policy" and seg.token_ids and pos > 0:
                start[i, pos - 1] = True
            pos += len(seg.token_ids)
    return Batch(list(episodes), ids, lengths, mask, advantages.float(), elp, has, start)


def batch_forward(
    model: torch.nn.Module,
    batch: Batch,
    micro_batch_size: int,
    temperature: float,
    grad: bool = False,
    bf16: bool = False,
    share_prefix: bool = True,
) -> tuple[Tensor, Tensor]:
    """Log-probs of the target tokens and full-vocabulary entropies, [B, T-1] each, in micro-batches
    (each trimmed to its own longest sequence). With ``grad`` the result carries gradient.

    ``share_prefix``: each distinct prompt prefix of a micro-batch is run once (``agentrl.forward``:
    the system prompt all rows share, or a group's whole prompt); the shared columns, all before the
    micro-batch's first policy token, are then left at 0 (prompt tokens: no loss,
    no metric or overlay reads them)."""
    B, T = batch.ids.shape
    logp = torch.zeros((B, T - 1))
    ent = torch.zeros((B, T - 1))
    parts = []
    for idx in torch.arange(B).split(micro_batch_size):
        t = int(batch.lengths[idx].max())
        ids = batch.ids[idx, :t]
        share, owners = 0, None
        if share_prefix:
            limit = min(  # never past a policy token: untrained rows (mask 0) keep their overlays
                first_loss_column(batch.mask[idx, : t - 1]),
                first_loss_column(batch.turn_start[idx, : t - 1]),
            )
            plan = prefix_plan(ids, batch.lengths[idx], limit=limit)
            share, owners = plan.share, plan.owners
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = suffix_logits(model, ids, share, owners)[:, :-1]  # [b, t-1-share, V]
        lp, h = alg.token_logprobs_and_entropy(logits, ids[:, share + 1 :], temperature)
        if grad:
            parts.append((idx, t, share, lp, h))
        else:
            logp[idx, share : t - 1] = lp.float()
            ent[idx, share : t - 1] = h.float()
    if grad:
        if len(parts) == 1 and parts[0][1] == T and parts[0][2] == 0:
            return parts[0][3], parts[0][4]
        pad = lambda x, s, t: torch.nn.functional.pad(x, (s, T - t))  # noqa: E731
        return (
            torch.cat([pad(p[3], p[2], p[1]) for p in parts]),
            torch.cat([pad(p[4], p[2], p[1]) for p in parts]),
        )
    return logp, ent


def attach_overlays(
    batch: Batch,
    logp_old: Tensor,
    logp_new: Tensor,
    entropy: Tensor,
    tw: alg.TokenWeights,
    clip_status: Tensor,
) -> None:
    """Per-token training overlays on each episode (docs/transcripts.md, format v1): aligned with
    ``episode.token_ids()``, None on tokens the policy did not write."""
    trained = batch.mask > 0
    selected = torch.zeros_like(logp_old)
    selected = torch.where(trained & (tw.weights > 1), 1.0, selected)
    selected = torch.where(trained & ((tw.weights < 1) | ~tw.mask), -1.0, selected)
    if tw.abs_kl_weights is not None:
        selected = torch.where(trained & (tw.abs_kl_weights > 0), 1.0, selected)
    cols = {
        "logp_old": logp_old,
        "logp_new": logp_new,
        "entropy": entropy,
        "weight": tw.weights,
        "selected": selected,
        "clipped": clip_status,
    }
    for i, ep in enumerate(batch.episodes):
        n = int(batch.lengths[i])
        policy = ep.loss_mask()
        adv = float(batch.advantages[i])
        ov: dict[str, list[float | None]] = {}
        for key, tensor in cols.items():
            row = tensor[i, : n - 1].tolist()
            values: list[float | None] = [None]
            values += [round(v, 5) if policy[t + 1] else None for t, v in enumerate(row)]
            ov[key] = values
        ov["advantage"] = [adv if p else None for p in policy]
        flags: list[float | None] = [None]
        flags += [float(trained[i, t]) if policy[t + 1] else None for t in range(n - 1)]
        ov["trained"] = flags
        ep.overlays = ov


def episode_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """Metrics over all episodes of the step (fresh rollouts, before any filter)."""
    ok = [e for e in episodes if not e.failed]
    out: dict[str, float] = {"episodes/count": float(len(episodes))}
    out["episodes/failed_frac"] = 1 - len(ok) / max(len(episodes), 1)
    for boundary, n in Counter(e.failure.boundary for e in episodes if e.failure).items():
        out[f"failures/{boundary}"] = float(n)
    for reason, n in Counter(e.stop_reason for e in episodes).items():
        out[f"stop/{reason}"] = n / len(episodes)
    if ok:
        out["reward/mean"] = sum(e.reward for e in ok) / len(ok)
        comps = defaultdict(list)
        for e in ok:
            for k, v in e.reward_components.items():
                comps[k].append(v)
        out.update({f"reward/{k}": sum(v) / len(v) for k, v in comps.items()})
        out["length/policy_tokens"] = sum(e.num_policy_tokens for e in ok) / len(ok)
        out["length/turns"] = sum(e.num_turns for e in ok) / len(ok)
        out["tools/calls"] = sum(e.metrics.get("tool_calls", 0) for e in ok) / len(ok)
        groups = defaultdict(list)
        for e in ok:
            groups[e.group].append(_correct(e))
        out["groups/all_correct"] = sum(all(g) for g in groups.values()) / len(groups)
        out["groups/all_wrong"] = sum(not any(g) for g in groups.values()) / len(groups)
    out["length/policy_tokens_total"] = float(sum(e.num_policy_tokens for e in episodes))
    surprisal = [-lp for e in episodes for s in e.segments if s.logprobs for lp in s.logprobs]
    if surprisal:
        # E[-log p(y)] over sampled tokens is the sampling distribution's entropy, averaged over the
        # positions visited: the entropy of fresh rollouts, with no extra forward pass.
        out["entropy/rollout"] = sum(surprisal) / len(surprisal)
    return out


def _correct(ep: Episode) -> bool:
    if "correct" in ep.reward_components:
        return ep.reward_components["correct"] > 0
    return ep.reward > 0


class TaskSampler:
    """Epochs over the task list in a seeded order; its position is checkpointed."""

    def __init__(self, tasks: Sequence[Task], seed: int) -> None:
        if not tasks:
            raise ValueError("no training tasks")
        self.tasks, self.seed = list(tasks), seed
        self.epoch, self.pos = 0, 0
        self._order = self._perm()

    def _perm(self) -> list[int]:
        order = list(range(len(self.tasks)))
        random.Random(f"{self.seed}-{self.epoch}").shuffle(order)
        return order

    def next(self, n: int) -> list[Task]:
        out: list[Task] = []
        while len(out) < n:
            if self.pos == len(self._order):
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._perm()
            out.append(self.tasks[self._order[self.pos]])
            self.pos += 1
        return out

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load(self, state: dict[str, int]) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]
        self._order = self._perm()


def weighting_params(
    cfg: Any, name: str, state: Any, *, seed: int, row_groups: Sequence[Tensor]
) -> dict[str, Any]:
    """Keyword arguments of the token weighting ``name``, read from the config in this one place.
    ``seed``: this step's seed for random selections (Clip-Cov); ``row_groups``: the micro-batches
    the update will run (STARE ``scope: micro`` ranks within each)."""
    a = cfg.algorithm
    if name == "stare":
        s = a.stare
        bounds = s.pi if s.controller == "pi" else s.adaptive
        controller = alg.StareController(
            law=s.controller,
            w=s.W,
            m=s.M,
            p=s.P,
            alpha=s.adaptive.alpha,
            w_max=bounds.W_max,
            m_min=bounds.M_min,
            w_min=s.pi.W_min if s.controller == "pi" else 1.0,
            m_max=s.pi.M_max if s.controller == "pi" else 1.0,
            kp=s.pi.kp,
            ki=s.pi.ki,
            p_max=s.pi.P_max if s.controller == "pi" else None,
        )
        return {
            "variant": s.variant,
            "target_entropy": s.target_entropy,
            "controller": controller,
            "state": state,
            "scope": s.scope,
            "row_groups": [g.tolist() for g in row_groups] if s.scope == "micro" else None,
        }
    if name == "steer":
        return {"mode": a.steer.mode, "w_min": a.steer.w_min, "w_max": a.steer.w_max}
    if name == "stapo":
        return {"prob_threshold": a.stapo.tau_p, "entropy_quantile": a.stapo.entropy_quantile}
    if name == "clip_cov":
        gen = torch.Generator().manual_seed(seed)
        return {"ratio": a.clip_cov.ratio, "lower": a.clip_cov.lb, "upper": a.clip_cov.ub, "generator": gen}
    if name == "kl_cov":
        return {"ratio": a.kl_cov.ratio, "beta": a.kl_cov.coef}
    if name == "high_entropy":
        return {"rho": a.high_entropy.rho}
    return {}


def evaluate(
    cfg: Any, engine: Any, tokenizer: Any, tasks: Sequence[Task], k: int | None = None
) -> tuple[dict[str, float], list[Episode]]:
    """mean@k (average correctness over k samples per task) and pass@k (any of k correct) on ``tasks``."""
    from agentrl import build
    from agentrl.runner import EpisodeRequest

    k = k or cfg.eval.k
    runner = build.build_runner(
        cfg, engine, tokenizer, seed=cfg.run.seed + 10_007, temperature=cfg.eval.temperature
    )
    try:
        reqs = [
            EpisodeRequest(t, seed=i * k + j, group=f"eval-{t.id}", episode_id=f"eval-{t.id}-{j}")
            for i, t in enumerate(tasks)
            for j in range(k)
        ]
        episodes = runner.run(reqs)
    finally:
        runner.close()
    by_task = defaultdict(list)
    for e in episodes:
        by_task[e.task_id].append(_correct(e) and not e.failed)
    mean_k = sum(sum(v) / len(v) for v in by_task.values()) / max(len(by_task), 1)
    pass_k = sum(any(v) for v in by_task.values()) / max(len(by_task), 1)
    rewards = [e.reward for e in episodes if not e.failed]
    metrics = {
        "eval/mean@k": mean_k,
        "eval/pass@k": pass_k,
        "eval/k": float(k),
        "eval/tasks": float(len(by_task)),
        "eval/reward": sum(rewards) / len(rewards) if rewards else math.nan,
        "eval/failed_frac": sum(e.failed for e in episodes) / max(len(episodes), 1),
    }
    return metrics, episodes
