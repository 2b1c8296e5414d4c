"""STEER: token weights that shrink where the estimated entropy change is large (arXiv 2510.10150).

Ω = (A / π_old) · x(1-x) · (log x + H), x = clamp(π, 1e-8, 1-1e-8), π_old clamped to [1e-8, 1],
non-finite Ω → 0, a = |Ω|; weights over the policy tokens (a_min/a_max over them only):
- ``linear``: w = clamp(w_max - (a - a_min)(w_max - w_min)/(a_max - a_min), w_min, w_max); the
  midpoint (w_min + w_max)/2 when a_max = a_min.
- ``exp``: k = -ln(w_min) / max(a_max, 0.02); w = clamp(exp(-k·a), w_min, 1).

This is the released code's form (zz-haooo/STEER, ``compute_token_weights``). Compared with the
first-order own-logit entropy change of a step on -A·π/π_old, which is
-η·(A/π_old)·x²(1-x)(log x + H) (∂π_a/∂z_a = x(1-x), ∂H/∂z_a = -x(log x + H)), the code's Ω has
one power of x fewer; docs/algorithms.md, "Token weightings" describes the same mismatch as "one factor of x more" in
its own convention. We implement the code's form either way, so weights match the released method.

Departures: x is the pre-update π_old (see ``token_weights``: identical to the released code's
current π when the batch takes one optimizer step), so Ω = A(1-x)(log x + H_old); a_min/a_max are
taken over the whole batch rather than one micro-batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from agentrl.algorithms.registry import StepContext, TokenWeighting, register_weighting
from agentrl.algorithms.token_weights import TokenWeights, WeightingInputs
from agentrl.dataclass_tree import knob

PROB_EPS = 1e-8


def steer_omega(logp: Tensor, logp_old: Tensor, entropy: Tensor, advantages: Tensor) -> Tensor:
    """Ω [B, T] with non-finite values set to 0."""
    x = torch.clamp(torch.exp(logp), PROB_EPS, 1.0 - PROB_EPS)
    p_old = torch.clamp(torch.exp(logp_old), PROB_EPS, 1.0)
    omega = (advantages / p_old) * x * (1.0 - x) * (torch.log(x) + entropy)
    return torch.where(torch.isfinite(omega), omega, torch.zeros_like(omega))


def _linear_map(a: Tensor, w_min: float, w_max: float) -> Tensor:
    a_min, a_max = a.min(), a.max()
    if a_max <= a_min:
        return torch.full_like(a, (w_min + w_max) / 2)
    return torch.clamp(w_max - (a - a_min) * (w_max - w_min) / (a_max - a_min), w_min, w_max)


def _exp_map(a: Tensor, w_min: float, w_max: float) -> Tensor:
    k = -math.log(w_min) / max(float(a.max()), 0.02)
    return torch.clamp(torch.exp(-k * a), w_min, 1.0)


STEER_MAPS: dict[str, Callable[[Tensor, float, float], Tensor]] = {"linear": _linear_map, "exp": _exp_map}


def steer_weights(
    inputs: WeightingInputs, *, mode: str = "linear", w_min: float = 0.8, w_max: float = 1.2
) -> TokenWeights:
    """STEER weights (1 at masked positions, which the loss ignores anyway)."""
    if mode not in STEER_MAPS:
        raise ValueError(f"unknown STEER mode {mode!r}; choose one of {sorted(STEER_MAPS)}")
    weights = torch.ones_like(inputs.logp_old)
    m = inputs.mask
    if m.any():
        omega = steer_omega(inputs.logp_old, inputs.logp_old, inputs.entropy, inputs.advantages)
        weights[m] = STEER_MAPS[mode](omega[m].abs(), w_min, w_max)
    valid = weights[m]
    stats = {
        "mean_weight": float(valid.mean()) if valid.numel() else 1.0,
        "min_weight": float(valid.min()) if valid.numel() else 1.0,
        "max_weight": float(valid.max()) if valid.numel() else 1.0,
    }
    return TokenWeights(weights=weights, mask=m, stats=stats)


# -- the record ----------------------------------------------------------------------------------
@dataclass
class SteerConfig:
    mode: Literal["linear", "exp"] = "linear"
    """How weights shrink with the entropy-change estimate |Ω|."""
    w_min: float = knob(0.8, gt=0, le=1)
    """Smallest token weight."""
    w_max: float = knob(1.2, ge=1)
    """Largest token weight (linear mode)."""


def steer_arguments(s: SteerConfig, step: StepContext) -> dict[str, Any]:
    return {"mode": s.mode, "w_min": s.w_min, "w_max": s.w_max}


STEER = register_weighting(
    TokenWeighting("steer", steer_weights, settings=SteerConfig, arguments=steer_arguments)
)
