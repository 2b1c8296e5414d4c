"""Sequence advantages from per-episode rewards and group ids (docs/algorithms.md, "Advantages").

A group is the set of responses to one prompt. Each function takes rewards [B] and group ids [B]
and returns advantages [B]; the trainer broadcasts them over the policy tokens of each episode.
Void-turn episodes stay in their group here (SimpleTIR keeps them in the group statistics; their
loss mask is zeroed by ``filters.void_turn_multipliers``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from agentrl.algorithms.registry import ADVANTAGES, AdvantageEstimator, register_advantage

GROUP_STD_EPS = 1e-6


def group_index(group_ids: Sequence[Any] | Tensor) -> Tensor:
    """Group ids (any hashables, or a LongTensor) as dense ints 0..n_groups-1, [B]."""
    ids = group_ids.tolist() if isinstance(group_ids, Tensor) else list(group_ids)
    dense: dict[Any, int] = {}
    return torch.tensor([dense.setdefault(g, len(dense)) for g in ids], dtype=torch.long)


def _group_sums(values: Tensor, index: Tensor) -> tuple[Tensor, Tensor]:
    """Per-row group sum and group size, both [B]."""
    n_groups = int(index.max()) + 1 if index.numel() else 0
    sums = torch.zeros(n_groups, dtype=values.dtype).index_add_(0, index, values)
    sizes = torch.zeros(n_groups, dtype=values.dtype).index_add_(0, index, torch.ones_like(values))
    return sums[index], sizes[index]


def _rewards(rewards: Sequence[float] | Tensor) -> Tensor:
    return torch.as_tensor(rewards, dtype=torch.float64).reshape(-1)


def grpo_advantages(rewards: Sequence[float] | Tensor, group_ids: Sequence[Any] | Tensor) -> Tensor:
    """GRPO (arXiv 2402.03300): A_i = (R_i - mean_g R) / (std_g R + 1e-6), unbiased std.

    A group of one has no baseline and gets A = 0 (its unbiased std is undefined).
    """
    r = _rewards(rewards)
    index = group_index(group_ids)
    sums, sizes = _group_sums(r, index)
    centred = r - sums / sizes
    sq_sums, _ = _group_sums(centred**2, index)
    std = torch.sqrt(sq_sums / (sizes - 1).clamp_min(1))
    adv = centred / (std + GROUP_STD_EPS)
    return torch.where(sizes > 1, adv, torch.zeros_like(adv)).float()


def dr_grpo_advantages(rewards: Sequence[float] | Tensor, group_ids: Sequence[Any] | Tensor) -> Tensor:
    """Dr. GRPO (arXiv 2503.20783): A_i = R_i - mean_g R, no std division (pair it with
    aggregation ``seq-mean-token-sum-norm``). A group of one gets A = 0 automatically."""
    r = _rewards(rewards)
    sums, sizes = _group_sums(r, group_index(group_ids))
    return (r - sums / sizes).float()


def rloo_advantages(rewards: Sequence[float] | Tensor, group_ids: Sequence[Any] | Tensor) -> Tensor:
    """RLOO: A_i = R_i - mean_{j != i, j in g} R_j = G/(G-1)·(R_i - mean_g R). A group of one gets 0."""
    r = _rewards(rewards)
    sums, sizes = _group_sums(r, group_index(group_ids))
    leave_one_out = (sums - r) / (sizes - 1).clamp_min(1)
    return torch.where(sizes > 1, r - leave_one_out, torch.zeros_like(r)).float()


for _estimator in (grpo_advantages, dr_grpo_advantages, rloo_advantages):
    register_advantage(AdvantageEstimator(_estimator.__name__.removesuffix("_advantages"), _estimator))


def compute_advantages(
    name: str, rewards: Sequence[float] | Tensor, group_ids: Sequence[Any] | Tensor
) -> Tensor:
    """Advantages [B] (float32) by estimator name (``ADVANTAGES``: ``grpo``, ``dr_grpo``, ``rloo``...)."""
    if name not in ADVANTAGES:
        raise ValueError(f"unknown advantage estimator {name!r}; choose one of {sorted(ADVANTAGES)}")
    return ADVANTAGES[name].compute(rewards, group_ids)
