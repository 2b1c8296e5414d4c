"""The methods without a token weighting: GRPO, Dr. GRPO, RLOO and DAPO (docs/algorithms.md, "Advantages", "Policy loss"), and
the plain weighting ``none`` (ω ≡ 1) they train with. Each token weighting registers its own method
in its module (``stare``, ``steer``, ``stapo``, ``clip_cov``, ``kl_cov``, ``high_entropy``)."""

from __future__ import annotations

from agentrl.algorithms.registry import (
    GRPO,
    GRPO_DS,
    Method,
    TokenWeighting,
    register_method,
    register_weighting,
)
from agentrl.algorithms.token_weights import unit_weights

register_weighting(TokenWeighting("none", unit_weights), method=False)
for _method in (
    Method("grpo", GRPO),
    Method("dr_grpo", {**GRPO, "advantage": "dr_grpo", "loss_agg": "seq-mean-token-sum-norm"}),
    Method("rloo", {**GRPO, "advantage": "rloo"}),
    Method("dapo", {**GRPO_DS, "overlong.enabled": True}),
):
    register_method(_method)
