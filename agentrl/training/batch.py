"""A training batch: episodes as padded tensors, and the forward pass that gives every target token's
log-prob and entropy.

Alignment: for an episode of n tokens, position t of the [B, T-1] tensors describes token t+1
(predicted from tokens 0..t). ``mask`` is the episode's role-derived loss mask shifted the same way,
times the episode's multiplier (0 for void-turn or untrained truncated episodes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from agentrl import algorithms as alg
from agentrl.episode import Episode
from agentrl.training.forward import first_loss_column, hidden_states_out, prefix_plan, suffix_logits
from agentrl.training.metrics import answer_flags


@dataclass
class Batch:
    episodes: list[Episode]
    """One per row: an episode, or one sample of a split episode (``Episode.sample_views``)."""
    ids: Tensor  # [B, T] right-padded token ids
    lengths: Tensor  # [B] real lengths; on the CPU wherever the batch is (they decide slicing)
    mask: Tensor  # [B, T-1] float loss mask (targets = ids[:, 1:])
    advantages: Tensor  # [B]
    engine_logp: Tensor  # [B, T-1] the engine's logprob of each target token (0 where none)
    has_engine_logp: Tensor  # [B, T-1] bool
    turn_start: Tensor  # [B, T-1] bool: first policy token of each turn
    parents: list[Episode] | None = None
    """The episode each row comes from (the row's own episode unless it was split into samples)."""
    answer: Tensor | None = None
    """[B, T-1] bool: policy tokens up to their turn's answer end (``metrics.answer_flags``); None
    when no row's environment records where its answers end."""

    def parent_rows(self) -> tuple[list[Episode], Tensor]:
        """The distinct episodes of the batch, in order, and the index of each row's episode [B]:
        a split episode counts once in group statistics, whatever its number of samples."""
        parents = self.parents or self.episodes
        order: dict[int, int] = {}
        distinct: list[Episode] = []
        for ep in parents:
            if id(ep) not in order:
                order[id(ep)] = len(distinct)
                distinct.append(ep)
        return distinct, torch.tensor([order[id(ep)] for ep in parents], dtype=torch.long)

    @property
    def size(self) -> int:
        return self.ids.shape[0]

    @property
    def device(self) -> torch.device:
        return self.ids.device

    def to(self, device: torch.device | str) -> Batch:
        """The batch on ``device`` (the policy's): the one place a batch changes device. ``lengths``
        stay on the CPU: reading them (to trim micro-batches) then costs no device sync."""
        move = lambda t: t.to(device, non_blocking=True)  # noqa: E731
        return replace(
            self,
            ids=move(self.ids),
            mask=move(self.mask),
            advantages=move(self.advantages),
            engine_logp=move(self.engine_logp),
            has_engine_logp=move(self.has_engine_logp),
            turn_start=move(self.turn_start),
            answer=None if self.answer is None else move(self.answer),
        )

    def rows(self, idx: Tensor) -> Batch:
        """Rows ``idx``, trimmed to their longest sequence."""
        t = int(self.lengths[idx].max())
        return replace(
            self,
            episodes=[self.episodes[i] for i in idx.tolist()],
            parents=None if self.parents is None else [self.parents[i] for i in idx.tolist()],
            ids=self.ids[idx, :t],
            lengths=self.lengths[idx],
            mask=self.mask[idx, : t - 1],
            advantages=self.advantages[idx],
            engine_logp=self.engine_logp[idx, : t - 1],
            has_engine_logp=self.has_engine_logp[idx, : t - 1],
            turn_start=self.turn_start[idx, : t - 1],
            answer=None if self.answer is None else self.answer[idx, : t - 1],
        )


def build_batch(
    episodes: Sequence[Episode], advantages: Tensor, multipliers: Sequence[float], pad_id: int
) -> Batch:
    """One row per training sample: an episode split into samples (``Episode.sample_breaks``) gives
    one row per sample, each with the episode's advantage and multiplier."""
    views = [(v, ep, a, m) for ep, a, m in zip(episodes, advantages, multipliers) for v in ep.sample_views()]
    parents = [ep for _, ep, _, _ in views]
    advantages = torch.stack([a for _, _, a, _ in views]) if views else advantages
    multipliers = [m for _, _, _, m in views]
    episodes = [v for v, _, _, _ in views]
    B = len(episodes)
    T = max(len(e.token_ids()) for e in episodes)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    mask = torch.zeros((B, T - 1))
    elp = torch.zeros((B, T - 1))
    has = torch.zeros((B, T - 1), dtype=torch.bool)
    start = torch.zeros((B, T - 1), dtype=torch.bool)
    answer = torch.zeros((B, T - 1), dtype=torch.bool)
    any_answer = False
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
        flags = answer_flags(ep)
        if flags is not None:
            any_answer = True
            answer[i, : n - 1] = torch.tensor(flags[1:], dtype=torch.bool)
    return Batch(
        list(episodes),
        ids,
        lengths,
        mask,
        advantages.float(),
        elp,
        has,
        start,
        parents,
        answer if any_answer else None,
    )


def batch_forward(
    model: torch.nn.Module,
    batch: Batch,
    micro_batch_size: int,
    temperature: float,
    grad: bool = False,
    bf16: bool = False,
    share_prefix: bool = True,
    head: torch.nn.Linear | None = None,
    phi: bool = False,
) -> tuple[Tensor, ...]:
    """Log-probs of the target tokens and full-vocabulary entropies, [B, T-1] each, in micro-batches
    (each trimmed to its own longest sequence), on the batch's device (``Batch.to``: the model's;
    bf16 autocast for that device type). With ``grad`` the result carries gradient.

    ``share_prefix``: each distinct prompt prefix of a micro-batch is run once (``agentrl.training.forward``:
    the system prompt all rows share, or a group's whole prompt); the shared columns, all before the
    micro-batch's first policy token, are then left at 0 (prompt tokens: no loss,
    no metric or overlay reads them).

    ``head``: the model's output head (``forward.output_head``); the model then stops at its last
    hidden states and the head is applied a chunk of positions at a time, so the [b, t, V] logits never
    exist whole, in the forward or the backward (``trainer.chunked_head``).

    ``phi`` (no gradient only): a third tensor, each target token's first-order entropy coefficient φ
    (``alg.token_stats_with_phi``), from the same logits."""
    if phi and grad:
        raise ValueError("batch_forward: phi is computed in the no-gradient pass only")
    B, T = batch.ids.shape
    outs = [torch.zeros((B, T - 1), device=batch.device) for _ in range(3 if phi else 2)]
    autocast_device = batch.device.type if batch.device.type in ("cpu", "cuda") else "cpu"
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
        autocast = torch.autocast(autocast_device, dtype=torch.bfloat16, enabled=bf16)
        stats = _suffix_stats(model, ids, share, owners, temperature, head, autocast, phi)
        if grad:
            parts.append((idx, t, share, *stats))
        else:
            for out, x in zip(outs, stats):
                out[idx, share : t - 1] = x.float()
    if grad:
        if len(parts) == 1 and parts[0][1] == T and parts[0][2] == 0:
            return parts[0][3], parts[0][4]
        pad = lambda x, s, t: torch.nn.functional.pad(x, (s, T - t))  # noqa: E731
        return (
            torch.cat([pad(p[3], p[2], p[1]) for p in parts]),
            torch.cat([pad(p[4], p[2], p[1]) for p in parts]),
        )
    return tuple(outs)


def _suffix_stats(
    model: torch.nn.Module,
    ids: Tensor,
    share: int,
    owners: Tensor | None,
    temperature: float,
    head: torch.nn.Linear | None,
    autocast: Any,
    phi: bool = False,
) -> tuple[Tensor, ...]:
    """Log-probs and entropies [b, t-1-share] of ``ids``'s positions past ``share`` (and φ with
    ``phi``): from the whole logits (the model under ``autocast``, the log-softmax in fp32), or from
    the last hidden states with ``head`` applied in chunks (under ``autocast`` too, as the head is
    inside the model)."""
    targets = ids[:, share + 1 :]
    if head is None:
        with autocast:
            logits = suffix_logits(model, ids, share, owners)[:, :-1]  # [b, t-1-share, V]
        if phi:
            return alg.token_stats_with_phi(logits, targets, temperature)
        return alg.token_logprobs_and_entropy(logits, targets, temperature)
    with autocast, hidden_states_out(head):
        hidden = suffix_logits(model, ids, share, owners)[:, :-1]  # [b, t-1-share, D]
        if phi:
            return alg.token_stats_with_phi_from_hidden(
                hidden, head.weight, targets, temperature, lm_head_bias=head.bias
            )
        return alg.token_logprobs_and_entropy_from_hidden(
            hidden, head.weight, targets, temperature, lm_head_bias=head.bias
        )


def token_metrics(logp_old: torch.Tensor, entropy: torch.Tensor, batch: Batch) -> dict[str, float]:
    """Entropy over the training batch's policy tokens: token mean, at branching positions (top 10%
    by entropy, and the first token of each turn), and rollout/trainer logprob mismatch."""
    m = batch.mask > 0
    out: dict[str, float] = {}
    if not m.any():
        return out
    ent = entropy[m]
    out["entropy/mean"] = float(ent.mean())
    k = max(1, int(0.1 * ent.numel()))
    out["entropy/branching"] = float(ent.topk(k).values.mean())
    first = batch.turn_start & m
    if first.any():
        out["entropy/turn_start"] = float(entropy[first].mean())
    if batch.answer is not None and (answer := batch.answer & m).any():
        out["entropy/answer"] = float(entropy[answer].mean())  # up to the answer's end, the tail left out
    gap = (logp_old - batch.engine_logp).abs()[m & batch.has_engine_logp]
    if gap.numel():
        out["mismatch/abs_logp_mean"] = float(gap.mean())
        out["mismatch/abs_logp_max"] = float(gap.max())
    return out
