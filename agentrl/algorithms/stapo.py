"""STAPO: silence spurious tokens (arXiv 2602.15620; docs/algorithms.md, "Token weightings").

A policy token is dropped when A > 0, π(y_t) < τ_p and H_t < the q-quantile of H over the batch's
policy tokens. Dropped tokens leave the denominator too (Σ I·m·L / Σ I·m), so STAPO returns a
reduced ``mask``; the trainer computes the loss normaliser from it.

Departure: π is the pre-update π_old (identical to the current π when the batch takes one optimizer
step; see ``token_weights``), and the quantile is over the whole batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from agentrl.algorithms.masked import masked_quantile
from agentrl.algorithms.registry import StepContext, TokenWeighting, register_weighting
from agentrl.algorithms.token_weights import TokenWeights, WeightingInputs
from agentrl.dataclass_tree import knob


def stapo_weights(
    inputs: WeightingInputs, *, prob_threshold: float = 0.002, entropy_quantile: float = 0.8
) -> TokenWeights:
    """Drop spurious tokens from the loss mask; weights stay 1."""
    m = inputs.mask
    h_q = masked_quantile(inputs.entropy, m, entropy_quantile)
    if math.isnan(h_q) or prob_threshold <= 0:  # τ_p = 0: no probability is below it, nothing is dropped
        spurious = torch.zeros_like(m)
    else:
        low_prob = inputs.logp_old < math.log(prob_threshold)
        spurious = m & (inputs.advantages > 0) & low_prob & (inputs.entropy < h_q)
    n_valid = int(m.sum())
    stats = {
        "drop_frac": float(spurious.sum()) / max(n_valid, 1),
        "n_dropped": float(spurious.sum()),
        "entropy_threshold": h_q if not math.isnan(h_q) else 0.0,
    }
    return TokenWeights(weights=torch.ones_like(inputs.logp_old), mask=m & ~spurious, stats=stats)


# -- the record ----------------------------------------------------------------------------------
@dataclass
class StapoConfig:
    tau_p: float = knob(0.002, ge=0, le=1)
    """Drop positive-advantage tokens whose probability is below this..."""
    entropy_quantile: float = knob(0.8, ge=0, le=1)
    """...and whose entropy is below this quantile of the batch's entropy."""


def stapo_arguments(s: StapoConfig, step: StepContext) -> dict[str, Any]:
    return {"prob_threshold": s.tau_p, "entropy_quantile": s.entropy_quantile}


STAPO = register_weighting(
    TokenWeighting("stapo", stapo_weights, settings=StapoConfig, arguments=stapo_arguments)
)
