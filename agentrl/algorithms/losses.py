"""The clipped policy-gradient surrogate, KL to a reference, entropy bonus and loss aggregation.

docs/algorithms.md, "Policy loss". Every function is pure: tensors and numbers in, a tensor (and detached float
stats) out. Shapes: per-token tensors are [B, T]; ``mask`` is 1 only on policy tokens.

Gradient accumulation: the aggregation divides a per-micro-batch *numerator* by a ``normaliser``
that the caller computes once for the WHOLE training batch with ``loss_normaliser``. Summing the
micro-batch losses then gives exactly the full-batch loss (and gradient) in every mode.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from agentrl.algorithms.masked import as_bool_mask, masked_mean, masked_sum
from agentrl.algorithms.registry import AGGREGATIONS, LossAggregation, register_aggregation

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


def _token_count(mask: Tensor, max_len: int | None) -> float:
    return float(as_bool_mask(mask).sum())


def _sequence_count(mask: Tensor, max_len: int | None) -> float:
    """Sequences with at least one policy token (a void-turn episode's mask is all zero: not counted,
    so it does not dilute the others)."""
    return float(_seq_has_tokens(mask).sum())


def _sequences_times_max_len(mask: Tensor, max_len: int | None) -> float:
    """Dr. GRPO's constant: sequences × the configured maximum response length (default T)."""
    return _sequence_count(mask, max_len) * float(max_len if max_len is not None else mask.shape[-1])


for _agg in (
    LossAggregation(
        "token-mean", _token_sum, _token_count,
        "every policy token weighs the same, whatever its episode or turn",
    ),
    LossAggregation(
        "seq-mean-token-mean", _seq_token_mean_sum, _sequence_count,
        "mean over each sequence's tokens, then over sequences: every episode weighs the same",
    ),
    LossAggregation(
        "seq-mean-token-sum", _token_sum, _sequence_count,
        "sum over each sequence's tokens, then mean over sequences: long episodes weigh more",
    ),
    LossAggregation(
        "seq-mean-token-sum-norm", _token_sum, _sequences_times_max_len,
        "Dr. GRPO: the token sum over sequences × a constant maximum length",
    ),
):  # fmt: skip
    register_aggregation(_agg)


def loss_normaliser(mask: Tensor, agg_mode: str, max_len: int | None = None) -> float:
    """The denominator of ``agg_mode`` for the WHOLE training batch (pass its full mask [B, T]).
    ``max_len`` is Dr. GRPO's constant (the configured maximum response length; default T)."""
    return _aggregation(agg_mode).normaliser(mask, max_len)


def aggregate(x: Tensor, mask: Tensor, agg_mode: str, normaliser: float) -> Tensor:
    """Scalar Agg(X, m): the mode's numerator over this (micro-)batch / the whole-batch normaliser."""
    return _aggregation(agg_mode).numerator(x, mask) / max(normaliser, 1.0)


def token_shares(mask: Tensor, agg_mode: str) -> Tensor:
    """[B, T] float: how much each token's loss counts in ``agg_mode``'s numerator, ∂ numerator / ∂ x_t
    (1 for a token sum, 1/|sequence| for a sequence mean, 0 off the mask); the normaliser, one number
    for the batch, is left out. Read from the numerator itself, so a registered aggregation needs no
    formula of its own here."""
    x = torch.zeros(mask.shape, dtype=torch.float64, device=mask.device, requires_grad=True)
    with torch.enable_grad():
        (grad,) = torch.autograd.grad(_aggregation(agg_mode).numerator(x, mask), x)
    return grad.float()


def _aggregation(name: str) -> LossAggregation:
    if name not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {name!r}; choose one of {sorted(AGGREGATIONS)}")
    return AGGREGATIONS[name]


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


def k1_kl(logp: Tensor, logp_ref: Tensor) -> Tensor:
    """k1 estimator of KL(πθ || π_ref): logp - logp_ref (unbiased, high variance; verl ``kl``)."""
    return logp - logp_ref


def k2_kl(logp: Tensor, logp_ref: Tensor) -> Tensor:
    """k2 estimator: ½·(logp - logp_ref)² (verl ``mse``)."""
    return 0.5 * (logp - logp_ref).square()


def k3_kl(logp: Tensor, logp_ref: Tensor) -> Tensor:
    """k3 estimator of KL(πθ || π_ref) (GRPO's low-variance one, verl ``low_var_kl``): with
    d = clamp(logp_ref - logp, ±20), exp(d) - d - 1, clamped to ±10."""
    d = torch.clamp(logp_ref - logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.clamp(torch.exp(d) - d - 1.0, -K3_CLAMP, K3_CLAMP)


KL_ESTIMATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {"k1": k1_kl, "k2": k2_kl, "k3": k3_kl}
"""Per-token KL estimators to the reference policy, by name (``algorithm.kl_estimator``)."""


def kl_penalty(logp: Tensor, logp_ref: Tensor, estimator: str) -> Tensor:
    """Per-token KL(πθ || π_ref) [B, T] by estimator name (k1, k2, k3)."""
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {estimator!r}; choose one of {sorted(KL_ESTIMATORS)}")
    return KL_ESTIMATORS[estimator](logp, logp_ref)


CLIP_NONE, CLIP_LOW, CLIP_HIGH, CLIP_DUAL = 0.0, 1.0, 2.0, 3.0


def clip_status(
    ratio: Tensor, advantages: Tensor, clip_low: float, clip_high: float, dual_clip: float | None
) -> Tensor:
    """Per token, which clip binds: 0 none, 1 low (A<0, r<1-ε_low), 2 high (A>0, r>1+ε_high),
    3 dual (A<0, r>c)."""
    status = torch.full_like(ratio, CLIP_NONE)
    status = torch.where((advantages < 0) & (ratio < 1 - clip_low), CLIP_LOW, status)
    status = torch.where((advantages > 0) & (ratio > 1 + clip_high), CLIP_HIGH, status)
    if dual_clip is not None:
        status = torch.where((advantages < 0) & (ratio > dual_clip), CLIP_DUAL, status)
    return status


class PolicyLoss(NamedTuple):
    loss: Tensor
    """The scalar loss of this (micro-)batch, with gradient."""
    stats: dict[str, float]
    """Detached statistics over its policy tokens: ``pg_loss``, ``clip_frac_low`` (A<0, r<1-ε_low),
    ``clip_frac_high`` (A>0, r>1+ε_high), ``dual_clip_frac``, ``approx_kl`` (k3 of π_old vs πθ),
    ``ratio_mean``, ``n_tokens``, and ``kl_ref`` / ``entropy`` when given. ``pg_loss`` is this
    micro-batch's share of the batch's loss (its numerator over ``normaliser``): add the shares to
    combine micro-batches. The rest are means over this micro-batch; weight them by ``n_tokens`` to
    combine micro-batches. Empty with ``stats=False``."""
    clip_status: Tensor
    """[B, T] which clip binds at each token (``clip_status``): for overlays."""


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
    kl_estimator: str = "k3",
    entropy: Tensor | None = None,
    entropy_coef: float = 0.0,
    abs_kl_weights: Tensor | None = None,
    stats: bool = True,
) -> PolicyLoss:
    """Loss = Agg(ω ⊙ L_dualclip + abs_kl ⊙ |logp - logp_old|) + β·Agg(KL) - β_H·Agg(H).

    Args:
        logp, logp_old: [B, T] current (with grad) and pre-update log-probs of the taken tokens.
        advantages: [B] (broadcast) or [B, T].
        mask: [B, T] loss mask (1 on policy tokens; STAPO's ``TokenWeights.mask`` if that is on).
        normaliser: ``loss_normaliser(whole_batch_mask, agg_mode, max_len)``; the same number for
            every micro-batch, so the micro-batch losses sum to the full-batch loss.
        weights: [B, T] per-token weights ω (a ``TokenWeights.weights`` slice); multiply the
            numerator only. None means ω ≡ 1 (plain GRPO-ds).
        clip: False drops the ratio clip and the dual clip (KL-Cov trains on -A·r).
        logp_ref, kl_coef, kl_estimator: KL to a reference policy in the loss (GRPO's KL loss, verl's
            ``use_kl_loss``), aggregated like the policy loss; ``kl_estimator`` k1, k2 or k3.
        entropy, entropy_coef: current-policy entropy [B, T] (with grad) for an entropy bonus.
        abs_kl_weights: [B, T] KL-Cov's β on its selected tokens (0 elsewhere).
        stats: False skips the statistics (reading their values forces a device sync); the loss is
            the same.

    Returns ``PolicyLoss(loss, stats, clip_status)``; its fields say what the statistics are.
    """
    advantages = per_token_advantages(advantages, logp)
    ratio = importance_ratio(logp, logp_old)
    if clip:
        per_token = clipped_surrogate(ratio, advantages, clip_low, clip_high, dual_clip)
    else:
        per_token = -advantages * ratio
    if weights is not None:
        per_token = per_token * weights
    if abs_kl_weights is not None:
        per_token = per_token + abs_kl_weights * (logp - logp_old).abs()
    agg = functools.partial(aggregate, mask=mask, agg_mode=agg_mode, normaliser=normaliser)
    pg = agg(per_token)
    with torch.no_grad():
        status = clip_status(ratio.detach(), advantages, clip_low, clip_high, dual_clip)
        values = _surrogate_stats(pg, status, ratio, logp, logp_old, mask) if stats else {}
    loss = _regularised(
        pg, values, logp, mask, agg, (logp_ref, kl_coef, kl_estimator), (entropy, entropy_coef), stats
    )
    return PolicyLoss(loss, values, status)


def per_token_advantages(advantages: Tensor, logp: Tensor) -> Tensor:
    """Advantages given per sequence ([B]) or per token ([B, T]) as [B, T], in ``logp``'s dtype."""
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1).expand_as(logp)  # [B] -> [B, T]
    return advantages.to(logp.dtype)


def _regularised(
    loss: Tensor,
    values: dict[str, float],
    logp: Tensor,
    mask: Tensor,
    agg: Callable[[Tensor], Tensor],
    kl_terms: tuple[Tensor | None, float, str],
    entropy_terms: tuple[Tensor | None, float],
    stats: bool,
) -> Tensor:
    """``loss`` + β·Agg(KL to the reference) - β_H·Agg(H), each where given; their means join ``values``."""
    logp_ref, kl_coef, kl_estimator = kl_terms
    if logp_ref is not None and kl_coef != 0.0:
        kl = kl_penalty(logp, logp_ref, kl_estimator)
        loss = loss + kl_coef * agg(kl)
        if stats:
            values["kl_ref"] = float(masked_mean(kl.detach(), mask))
    entropy, entropy_coef = entropy_terms
    if entropy is not None:
        if entropy_coef != 0.0:
            loss = loss - entropy_coef * agg(entropy)
        if stats:
            values["entropy"] = float(masked_mean(entropy.detach(), mask))
    return loss


def _surrogate_stats(
    pg: Tensor, status: Tensor, ratio: Tensor, logp: Tensor, logp_old: Tensor, mask: Tensor
) -> dict[str, float]:
    """The clipped surrogate's statistics (``PolicyLoss.stats``), detached; reading them syncs the device."""
    return {
        "pg_loss": float(pg.detach()),
        "clip_frac_low": float(masked_mean((status == CLIP_LOW).float(), mask)),
        "clip_frac_high": float(masked_mean((status == CLIP_HIGH).float(), mask)),
        "dual_clip_frac": float(masked_mean((status == CLIP_DUAL).float(), mask)),
        "approx_kl": float(masked_mean(k3_kl(logp.detach(), logp_old), mask)),
        "ratio_mean": float(masked_mean(ratio.detach(), mask)),
        "n_tokens": float(as_bool_mask(mask).sum()),
    }
