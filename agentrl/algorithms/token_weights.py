"""The inputs and outputs shared by every token-weighting method.

A weighting runs ONCE per training step, on the WHOLE batch, before the update, on detached
values (``WeightingInputs``). It returns a ``TokenWeights``; the trainer slices it per micro-batch
(``tw.rows(index)``) and hands the pieces to ``losses.policy_loss``.

Where a method's released code reads the *current* policy (STEER's x, STAPO's πθ, Clip-Cov's "not
already clipped", the covariance's logp in Clip-Cov/KL-Cov), agentrl selects on ``logp_old`` before
the update. With one optimizer step per rollout batch (agentrl's default: micro-batches accumulate
into one step) the current policy equals π_old at every micro-batch, so the pre-update selection is
identical to the released code's, and it is free of micro-batch boundaries. With several mini-batch
steps per rollout batch it departs: later mini-batches keep the selection made before the first
step. The one term that needs the current policy with gradient, KL-Cov's β·|logp - logp_old|, is
evaluated per micro-batch inside ``policy_loss`` on the tokens selected here (``abs_kl_weights``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor


@dataclass(frozen=True)
class WeightingInputs:
    """Whole-batch, detached, pre-update tensors, all [B, T] (advantages broadcast per token)."""

    logp_old: Tensor
    entropy: Tensor
    advantages: Tensor
    mask: Tensor
    phi: Tensor | None = None
    """Each token's first-order entropy coefficient φ under π_old (``entropy_theory``), from the same
    pass; only for a weighting whose record asks for it (``TokenWeighting.needs_phi``)."""
    share: Tensor | None = None
    """How much each token counts in the loss aggregation's numerator (``losses.token_shares``)."""

    @staticmethod
    def build(
        logp_old: Tensor,
        entropy: Tensor,
        advantages: Tensor,
        mask: Tensor,
        phi: Tensor | None = None,
        share: Tensor | None = None,
    ) -> WeightingInputs:
        """Detach everything, broadcast advantages [B] -> [B, T], make the mask bool."""
        adv = advantages.detach().float()
        if adv.dim() == 1:
            adv = adv.unsqueeze(-1).expand_as(logp_old)  # [B] -> [B, T]
        m = mask.detach()
        return WeightingInputs(
            logp_old=logp_old.detach().float(),
            entropy=entropy.detach().float(),
            advantages=adv,
            mask=m if m.dtype == torch.bool else m > 0,
            phi=None if phi is None else phi.detach().float(),
            share=None if share is None else share.detach().float(),
        )


@dataclass(frozen=True)
class TokenWeights:
    """What a weighting returns. Pass to ``policy_loss`` as ``weights=``, ``mask=``,
    ``abs_kl_weights=``, ``clip=``; compute the loss normaliser from ``mask``."""

    weights: Tensor
    """[B, T] ω multiplying each token's loss (numerator only; 1 = unchanged, 0 = no gradient)."""
    mask: Tensor
    """[B, T] bool loss mask to train on: the input mask, minus tokens a method drops *from the
    denominator too* (STAPO). Compute ``loss_normaliser`` from this mask."""
    abs_kl_weights: Tensor | None = None
    """[B, T] KL-Cov's β on its selected tokens (0 elsewhere), or None."""
    clip: bool = True
    """False for KL-Cov, which trains on the unclipped -A·r."""
    stats: dict[str, float] = field(default_factory=dict)
    """Detached statistics for logging (floats)."""
    state: Any = None
    """New controller state (STARE), to keep and checkpoint; None for stateless methods."""

    def rows(self, index: slice | Tensor | list[int]) -> TokenWeights:
        """The micro-batch slice (rows ``index``) of every per-token tensor."""
        akl = None if self.abs_kl_weights is None else self.abs_kl_weights[index]
        return replace(self, weights=self.weights[index], mask=self.mask[index], abs_kl_weights=akl)


def unit_weights(inputs: WeightingInputs) -> TokenWeights:
    """ω ≡ 1 (no reweighting): the plain clipped surrogate, GRPO-ds with DAPO's loss."""
    return TokenWeights(weights=torch.ones_like(inputs.logp_old), mask=inputs.mask, stats={})
