"""Statistics over the loss mask only.

Every quantity in ``agentrl.algorithms`` is computed over tokens with ``mask == 1`` (docs/algorithms.md, "Policy loss":
the mask is the single source of truth). These helpers gather the valid tokens first, so values at
masked positions (prompt, tool output, padding) can never reach a mean, quantile or top-k.
``torch.quantile`` is never used: it refuses inputs above 2^24 elements; ``kthvalue``/``topk`` do not.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def as_bool_mask(mask: Tensor) -> Tensor:
    """A float or bool mask as bool (``> 0``)."""
    return mask > 0 if mask.dtype != torch.bool else mask


def masked_sum(x: Tensor, mask: Tensor) -> Tensor:
    """Σ x over mask = 1 (``where``, not a product, so NaN/inf at masked positions cannot leak)."""
    return torch.where(as_bool_mask(mask), x, torch.zeros_like(x)).sum()


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of x over mask = 1; 0 when the mask is empty."""
    count = as_bool_mask(mask).sum()
    return masked_sum(x, mask) / count.clamp_min(1)


def masked_quantile(x: Tensor, mask: Tensor, q: float) -> float:
    """The q-quantile of x over mask = 1, with torch.quantile's linear interpolation, via kthvalue.

    Returns nan when the mask is empty.
    """
    values = x[as_bool_mask(mask)].detach().float().reshape(-1)
    n = values.numel()
    if n == 0:
        return math.nan
    pos = q * (n - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    v_lo = torch.kthvalue(values, lo + 1).values.item()
    v_hi = v_lo if hi == lo else torch.kthvalue(values, hi + 1).values.item()
    return v_lo + (pos - lo) * (v_hi - v_lo)


def topk_mask(scores: Tensor, candidates: Tensor, k: int) -> Tensor:
    """Bool mask of the k candidates with the highest score (ties broken by position, as topk does).

    Non-candidates never compete: only the candidates' scores are passed to ``topk``.
    """
    candidates = as_bool_mask(candidates)
    selected = torch.zeros_like(candidates)
    k = min(k, int(candidates.sum()))
    if k <= 0:
        return selected
    flat_idx = candidates.reshape(-1).nonzero().squeeze(-1)  # [n_candidates]
    top = torch.topk(scores.reshape(-1)[flat_idx].detach(), k=k, largest=True).indices
    selected.reshape(-1)[flat_idx[top]] = True
    return selected
