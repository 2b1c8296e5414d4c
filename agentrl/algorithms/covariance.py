"""Clip-Cov and KL-Cov: act on the tokens with the largest advantage/log-prob covariance.

Cui et al., "The Entropy Mechanism of RL for Reasoning LMs" (arXiv 2505.22617; docs/algorithms.md, "Token weightings").
c_t = (A_t - mean A)(logp_t - mean logp), means over the policy tokens of the whole batch.
- Clip-Cov: among tokens with lb < c_t < ub, pick max(1, ⌊r_c·N⌋) at random and zero their loss
  (weight 0; the denominator keeps them, as the released code does).
- KL-Cov: the top max(1, ⌊k·N⌋) tokens by c_t get β·|logp - logp_old| added to their loss, and the
  ratio clip is off everywhere (the released code trains on -A·r).
N = number of policy tokens in the batch.

Departures (see ``token_weights``): logp is the pre-update logp_old; "not already clipped" is
vacuous before the update (r = 1 everywhere), so every token is eligible; selection and the random
draw are over the whole batch rather than per micro-batch. Pass a seeded ``generator`` for
reproducible Clip-Cov draws.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from agentrl.algorithms.masked import masked_mean, topk_mask
from agentrl.algorithms.registry import GRPO_DS, StepContext, TokenWeighting, UpdateShape, register_weighting
from agentrl.algorithms.token_weights import TokenWeights, WeightingInputs
from agentrl.dataclass_tree import knob


def token_covariance(inputs: WeightingInputs) -> Tensor:
    """c_t [B, T] (0 at masked positions)."""
    m = inputs.mask
    a_c = inputs.advantages - masked_mean(inputs.advantages, m)
    l_c = inputs.logp_old - masked_mean(inputs.logp_old, m)
    return torch.where(m, a_c * l_c, torch.zeros_like(a_c))


def clip_cov_weights(
    inputs: WeightingInputs,
    *,
    ratio: float = 2e-4,
    lower: float = 1.0,
    upper: float = 5.0,
    generator: torch.Generator | None = None,
) -> TokenWeights:
    """Weight 0 on max(1, ⌊ratio·N⌋) random tokens with lower < c_t < upper."""
    m = inputs.mask
    cov = token_covariance(inputs)
    eligible = (m & (cov > lower) & (cov < upper)).reshape(-1).nonzero().squeeze(-1)  # [n_eligible]
    n_pick = min(max(1, int(ratio * int(m.sum()))), eligible.numel())
    picked = eligible[torch.randperm(eligible.numel(), generator=generator)[:n_pick]]
    weights = torch.ones_like(inputs.logp_old)
    weights.reshape(-1)[picked] = 0.0
    stats = {
        "n_eligible": float(eligible.numel()),
        "n_clipped": float(n_pick),
        "clip_frac": n_pick / max(int(m.sum()), 1),
        "cov_mean": float(masked_mean(cov, m)),
    }
    return TokenWeights(weights=weights, mask=m, stats=stats)


def kl_cov_weights(inputs: WeightingInputs, *, ratio: float = 2e-3, beta: float = 1.0) -> TokenWeights:
    """β·|logp - logp_old| on the top max(1, ⌊ratio·N⌋) tokens by c_t; no ratio clip."""
    m = inputs.mask
    cov = token_covariance(inputs)
    n_valid = int(m.sum())
    selected = topk_mask(cov, m, max(1, int(ratio * n_valid)) if n_valid else 0)
    stats = {
        "n_penalised": float(selected.sum()),
        "penalised_frac": float(selected.sum()) / max(n_valid, 1),
        "cov_mean": float(masked_mean(cov, m)),
    }
    return TokenWeights(
        weights=torch.ones_like(inputs.logp_old),
        mask=m,
        abs_kl_weights=beta * selected.float(),
        clip=False,
        stats=stats,
    )


# -- the records ---------------------------------------------------------------------------------
@dataclass
class ClipCovConfig:
    ratio: float = knob(2e-4, gt=0, le=1)
    """Fraction of tokens whose gradient is cut (at least one)."""
    lb: float = 1.0
    """Lower bound on the centred covariance for a token to be a candidate."""
    ub: float = 5.0
    """Upper bound on the centred covariance for a token to be a candidate."""


@dataclass
class KLCovConfig:
    ratio: float = knob(2e-3, gt=0, le=1)
    """Fraction of tokens (top by covariance) that get the KL penalty."""
    coef: float = knob(1.0, ge=0)
    """β, the coefficient of |logp − logp_old| on those tokens."""


def clip_cov_arguments(s: ClipCovConfig, step: StepContext) -> dict[str, Any]:
    """A generator seeded from the step: a fresh draw every step, the same one after a resume."""
    generator = torch.Generator().manual_seed(step.seed)
    return {"ratio": s.ratio, "lower": s.lb, "upper": s.ub, "generator": generator}


def clip_cov_checks(s: ClipCovConfig, trainer: UpdateShape) -> Iterator[tuple[str, str]]:
    if s.lb > s.ub:
        yield (
            "algorithm.clip_cov.lb",
            f"algorithm.clip_cov.lb={s.lb} must not exceed algorithm.clip_cov.ub={s.ub}",
        )


def kl_cov_arguments(s: KLCovConfig, step: StepContext) -> dict[str, Any]:
    return {"ratio": s.ratio, "beta": s.coef}


CLIP_COV = register_weighting(
    TokenWeighting(
        "clip_cov",
        clip_cov_weights,
        settings=ClipCovConfig,
        arguments=clip_cov_arguments,
        check=clip_cov_checks,
    )
)
KL_COV = register_weighting(
    TokenWeighting(
        "kl_cov",
        kl_cov_weights,
        settings=KLCovConfig,
        arguments=kl_cov_arguments,
        preset={**GRPO_DS, "ratio_clip": False},  # the released code trains on the unclipped -A·r
    )
)
