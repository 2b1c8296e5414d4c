"""High-entropy minority tokens ("80/20", arXiv 2506.01939; docs/algorithms.md, "Token weightings").

Keep the gradient only where H_t ≥ the (1-ρ) quantile of H over the batch's policy tokens (linear
interpolation, as the released code's torch.quantile; computed here with kthvalue). The
denominator is unchanged: the other tokens get weight 0 but stay in the mask.
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


def high_entropy_weights(inputs: WeightingInputs, *, rho: float = 0.2) -> TokenWeights:
    """Weight 1 on the top-ρ entropy tokens, 0 on the rest of the policy tokens."""
    m = inputs.mask
    threshold = masked_quantile(inputs.entropy, m, 1.0 - rho)
    if math.isnan(threshold):
        keep = torch.zeros_like(m)
    else:
        keep = m & (inputs.entropy >= threshold)
    weights = torch.where(m & ~keep, torch.zeros_like(inputs.logp_old), torch.ones_like(inputs.logp_old))
    stats = {
        "keep_frac": float(keep.sum()) / max(int(m.sum()), 1),
        "entropy_threshold": threshold if not math.isnan(threshold) else 0.0,
    }
    return TokenWeights(weights=weights, mask=m, stats=stats)


# -- the record ----------------------------------------------------------------------------------
@dataclass
class HighEntropyConfig:
    rho: float = knob(0.2, gt=0, le=1)
    """Fraction of tokens (highest entropy) that keep their gradient."""


def high_entropy_arguments(s: HighEntropyConfig, step: StepContext) -> dict[str, Any]:
    return {"rho": s.rho}


HIGH_ENTROPY = register_weighting(
    TokenWeighting(
        "high_entropy", high_entropy_weights, settings=HighEntropyConfig, arguments=high_entropy_arguments
    )
)
