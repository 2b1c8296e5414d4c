"""The clipped policy-gradient surrogate, KL to a reference, entropy bonus and loss aggregation.

ALGORITHMS.md §0–§2. Every function is pure: tensors and numbers in, a tensor (and detached float
stats) out. Shapes: per-token tensors are [B, T]; ``mask`` is 1 only on policy tokens.

Gradient accumulation: the aggregation divides a per-micro-batch *numerator* by a ``normaliser``
that the caller computes once for the WHOLE training batch with ``loss_normaliser``. Summing the
micro-batch losses then gives exactly the full-batch loss (and gradient) in every mode.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from agentrl.algorithms.masked import as_bool_mask, masked_mean, masked_sum

LOG_RATIO_CLAMP = 20.0
K3_CLAMP = 10.0


def _seq_has_tokens(mask: Tensor) -> Tensor:
    return as_bool_mask(mask).any(dim=-1)  # [B]


def _token_sum(x: Tensor, mask: Tensor) -> Tensor:
    return masked_sum(x, mask)


def _seq_token_mean_sum(x: Tensor, mask: Tensor) -> Tensor:
    """Σ over sequences with ≥1 policy token of (mean over that sequence's policy tokens)."""
    m = as_bool_mask(mask)
    per_seq = torch.where(m, x, torch.zeros_like(x)).sum(-1) / m.sum(-1).clamp_min(1)  # [B]
    return per_seq.sum()


AGG_NUMERATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    # Σ m·X / (Σ m over the whole batch): every policy token weighs the same, whatever its episode/turn.
    "token-mean": _token_sum,
    # mean over each sequence's tokens, then mean over sequences: every episode weighs the same.
    "seq-mean-token-mean": _seq_token_mean_sum,
    # sum over each sequence's tokens, then mean over sequences: long episodes weigh more.
    "seq-mean-token-sum": _token_sum,
    # Dr. GRPO: Σ m·X / (number of sequences × a constant max length).
    "seq-mean-token-sum-norm": _token_sum,
}
AGG_MODES = tuple(AGG_NUMERATORS)


def loss_normaliser(mask: Tensor, agg_mode: str, max_len: int | None = None) -> float:
    """The denominator of ``agg_mode`` for the WHOLE training batch (pass its full mask [B, T]).

    Sequences with no policy token (a void-turn episode, whose mask is all zero) are not counted in
    the seq-* modes, so they do not dilute the others. ``max_len`` is Dr. GRPO's constant (the
    configured maximum response length); it defaults to T.
    """
    if agg_mode not in AGG_NUMERATORS:
        raise ValueError(f"unknown aggregation {agg_mode!r}; choose one of {AGG_MODES}")
    if agg_mode == "token-mean":
        return float(as_bool_mask(mask).sum())
    n_seq = float(_seq_has_tokens(mask).sum())
    if agg_mode == "seq-mean-token-sum-norm":
        return n_seq * float(max_len if max_len is not None else mask.shape[-1])
    return n_seq


def aggregate(x: Tensor, mask: Tensor, agg_mode: str, normaliser: float) -> Tensor:
    """Scalar Agg(X, m): the mode's numerator over this (micro-)batch / the whole-batch normaliser."""
    if agg_mode not in AGG_NUMERATORS:
        raise ValueError(f"unknown aggregation {agg_mode!r}; choose one of {AGG_MODES}")
    return AGG_NUMERATORS[agg_mode](x, mask) / max(normaliser, 1.0)


def importance_ratio(logp: Tensor, logp_old: Tensor) -> Tensor:
    """r = exp(clamp(logp - logp_old, -20, 20))."""
    return torch.exp(torch.clamp(logp - logp_old, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def clipped_surrogate(
    ratio: Tensor, advantages: Tensor, clip_low: float, clip_high: float, dual_clip: float | None
) -> Tensor:
    """Per-token loss max(-A·r, -A·clip(r, 1-ε_low, 1+ε_high)); for A < 0 capped at -A·c (dual clip).

    Clip-higher: DAPO arXiv 2503.14476; dual clip: arXiv 1912.09729 (c > 1, None disables it).
    """
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    if dual_clip is not None:
        loss = torch.where(advantages < 0, torch.minimum(loss, -advantages * dual_clip), loss)
    return loss


def k3_kl(logp: Tensor, logp_ref: Tensor) -> Tensor:
    """k3 estimator of KL(πθ || π_ref): exp(logp_ref - logp) - (logp_ref - logp) - 1, clamped to ±10."""
    d = logp_ref - logp
    return torch.clamp(torch.exp(d) - d - 1.0, -K3_CLAMP, K3_CLAMP)


def policy_loss(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    normaliser: float,
    agg_mode: str = "token-mean",
    weights: Tensor | None = None,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float | None = 3.0,
    clip: bool = True,
    logp_ref: Tensor | None = None,
    kl_coef: float = 0.0,
    entropy: Tensor | None = None,
    entropy_coef: float = 0.0,
    abs_kl_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Loss = Agg(ω ⊙ L_dualclip + abs_kl ⊙ |logp - logp_old|) + β·Agg(k3) - β_H·Agg(H).

    Args:
        logp, logp_old: [B, T] current (with grad) and pre-update log-probs of the taken tokens.
        advantages: [B] (broadcast) or [B, T].
        mask: [B, T] loss mask (1 on policy tokens; STAPO's ``TokenWeights.mask`` if that is on).
        normaliser: ``loss_normaliser(whole_batch_mask, agg_mode, max_len)``; the same number for
            every micro-batch, so the micro-batch losses sum to the full-batch loss.
        weights: [B, T] per-token weights ω (a ``TokenWeights.weights`` slice); multiply the
            numerator only. None means ω ≡ 1 (plain GRPO-ds).
        clip: False drops the ratio clip and the dual clip (KL-Cov trains on -A·r).
        logp_ref, kl_coef: k3 KL to a reference policy (GRPO's optional KL loss).
        entropy, entropy_coef: current-policy entropy [B, T] (with grad) for an entropy bonus.
        abs_kl_weights: [B, T] KL-Cov's β on its selected tokens (0 elsewhere).

    Returns the scalar loss and detached stats over this micro-batch's policy tokens:
    ``pg_loss``, ``clip_frac_low`` (A<0, r<1-ε_low), ``clip_frac_high`` (A>0, r>1+ε_high),
    ``dual_clip_frac``, ``approx_kl`` (k3 of π_old vs πθ), ``ratio_mean``, ``n_tokens``, and
    ``kl_ref`` / ``entropy`` when given. Means are over this micro-batch; weight them by
    ``n_tokens`` to combine micro-batches.
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1).expand_as(logp)  # [B] -> [B, T]
    advantages = advantages.to(logp.dtype)
    ratio = importance_ratio(logp, logp_old)
    if clip:
        per_token = clipped_surrogate(ratio, advantages, clip_low, clip_high, dual_clip)
    else:
        per_token = -advantages * ratio
    if weights is not None:
        per_token = per_token * weights
    if abs_kl_weights is not None:
        per_token = per_token + abs_kl_weights * (logp - logp_old).abs()
    pg = aggregate(per_token, mask, agg_mode, normaliser)
    loss = pg
    with torch.no_grad():
        r = ratio.detach()
        stats = {
            "pg_loss": float(pg.detach()),
            "clip_frac_low": float(masked_mean(((advantages < 0) & (r < 1 - clip_low)).float(), mask)),
            "clip_frac_high": float(masked_mean(((advantages > 0) & (r > 1 + clip_high)).float(), mask)),
            "dual_clip_frac": float(
                masked_mean(((advantages < 0) & (r > (dual_clip or float("inf")))).float(), mask)
            ),
            "approx_kl": float(masked_mean(k3_kl(logp.detach(), logp_old), mask)),
            "ratio_mean": float(masked_mean(r, mask)),
            "n_tokens": float(as_bool_mask(mask).sum()),
        }
    if logp_ref is not None and kl_coef != 0.0:
        kl = k3_kl(logp, logp_ref)
        loss = loss + kl_coef * aggregate(kl, mask, agg_mode, normaliser)
        stats["kl_ref"] = float(masked_mean(kl.detach(), mask))
    if entropy is not None:
        if entropy_coef != 0.0:
            loss = loss - entropy_coef * aggregate(entropy, mask, agg_mode, normaliser)
        stats["entropy"] = float(masked_mean(entropy.detach(), mask))
    return loss, stats
