"""The first-order entropy change of a softmax under a policy-gradient step (docs/algorithms.md, "First-order entropy change").

For logits z, π = softmax(z), H = -Σ π log π: ∂H/∂z_j = -π_j (log π_j + H). A step on the sampled
token a, Δz = η·A·(e_a - π), changes the entropy to first order by
    ΔH ≈ -η·A·φ_a,  φ_a = π_a (H - s_a) - E_{j~π}[π_j (H - s_j)],  s = -log π.
φ_a > 0 for low-surprisal tokens (s_a < s*, the critical surprisal slightly below H) and < 0 for
high-surprisal ones, giving the four quadrants (A ≷ 0 × s ≶ s*). Used by the tests and the lab.
"""

from __future__ import annotations

import torch
from torch import Tensor


def softmax_entropy(logits: Tensor) -> Tensor:
    """H of softmax(logits) over the last dim, float64 for finite-difference accuracy."""
    logp = torch.log_softmax(logits.double(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def entropy_phi(logits: Tensor, action: Tensor) -> Tensor:
    """φ_a for each row of logits [..., V] and sampled action ids [...]."""
    logp = torch.log_softmax(logits.double(), dim=-1)
    p = logp.exp()
    h = -(p * logp).sum(-1, keepdim=True)  # [..., 1]
    g = p * (h + logp)  # π_j (H - s_j), [..., V]
    return g.gather(-1, action.unsqueeze(-1)).squeeze(-1) - (p * g).sum(-1)


def first_order_entropy_change(logits: Tensor, action: Tensor, advantage: Tensor, lr: float) -> Tensor:
    """ΔH ≈ -η·A·φ_a."""
    return -lr * advantage.double() * entropy_phi(logits, action)


def exact_entropy_change(logits: Tensor, action: Tensor, advantage: Tensor, lr: float) -> Tensor:
    """H(z + η·A·(e_a - π)) - H(z), exactly (float64)."""
    z = logits.double()
    p = torch.softmax(z, dim=-1)
    e_a = torch.nn.functional.one_hot(action, z.shape[-1]).double()
    z_new = z + lr * advantage.double().unsqueeze(-1) * (e_a - p)
    return softmax_entropy(z_new) - softmax_entropy(z)
