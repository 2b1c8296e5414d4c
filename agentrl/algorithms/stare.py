"""STARE: surprisal-guided token-level advantage reweighting (arXiv 2606.19236; ALGORITHMS.md §4).

Per step: H̄ = token-mean entropy over m = 1 of the whole batch; the controller (``stare_control``)
turns H̄ into a gate and W/M/P; T± = {m = 1, A ≷ 0}; L± = the k± = min(|T±|, max(1, ⌈P·|T±|⌉))
highest-surprisal (s = -logp_old) tokens of T±; ω = 1, and if the gate is on ω[L+] = W and, for
variant C2, ω[L-] = M. Tokens with A = 0 are never selected. The loss is Agg(ω ⊙ L_dualclip, m).

Departures from the released code (hp-luo/STARE, ``compute_stare_token_weights``):
- Scope ``batch`` (default) ranks over the whole training batch, as the paper says; the released
  code ranks within each GPU micro-batch. Scope ``micro`` reproduces that: pass ``row_groups``
  (the micro-batches' row indices) or ``micro_batch_size``.
- The mask is the trainer's loss mask (policy tokens only), not one rebuilt from the attention
  mask, so tool output never enters the ranking.
- ⌈P·n⌉ is computed as ceil(P·n - 1e-9) so that float error (0.1·30 = 3.0000000000000004) does
  not add a token; the released code uses int(P·n + 0.999999), which agrees except within 1e-6.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from agentrl.algorithms.masked import masked_mean, topk_mask
from agentrl.algorithms.stare_control import StareController, StareState, update_stare_state
from agentrl.algorithms.token_weights import TokenWeights, WeightingInputs

VARIANTS = ("O1", "C2")
SCOPES = ("batch", "micro")


def selection_size(n_candidates: int, top_ratio: float) -> int:
    """k = min(n, max(1, ⌈P·n⌉)); 0 when there is no candidate or P ≤ 0."""
    if n_candidates == 0 or top_ratio <= 0:
        return 0
    return min(n_candidates, max(1, math.ceil(top_ratio * n_candidates - 1e-9)))


def top_surprisal(surprisal: Tensor, candidates: Tensor, top_ratio: float) -> Tensor:
    """Bool mask of the ⌈P·n⌉ highest-surprisal candidates."""
    return topk_mask(surprisal, candidates, selection_size(int(candidates.sum()), top_ratio))


def _row_groups(batch_size: int, scope: str, row_groups, micro_batch_size) -> list[Tensor]:
    if scope not in SCOPES:
        raise ValueError(f"unknown STARE scope {scope!r}; choose one of {SCOPES}")
    if scope == "batch":
        return [torch.arange(batch_size)]
    if row_groups is not None:
        return [torch.as_tensor(list(g), dtype=torch.long) for g in row_groups]
    if micro_batch_size is None:
        raise ValueError("STARE scope 'micro' needs row_groups or micro_batch_size")
    return list(torch.arange(batch_size).split(micro_batch_size))


def stare_selection(
    inputs: WeightingInputs, top_ratio: float, groups: Sequence[Tensor]
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(L+, L-, T+, T-) as bool [B, T]; the top-P ranking runs within each row group."""
    surprisal = -inputs.logp_old
    t_pos = inputs.mask & (inputs.advantages > 0)
    t_neg = inputs.mask & (inputs.advantages < 0)
    l_pos, l_neg = torch.zeros_like(t_pos), torch.zeros_like(t_neg)
    for rows in groups:
        l_pos[rows] = top_surprisal(surprisal[rows], t_pos[rows], top_ratio)
        l_neg[rows] = top_surprisal(surprisal[rows], t_neg[rows], top_ratio)
    return l_pos, l_neg, t_pos, t_neg


def stare_weights(
    inputs: WeightingInputs,
    *,
    variant: str = "O1",
    target_entropy: float = 0.3,
    controller: StareController | None = None,
    state: StareState | None = None,
    scope: str = "batch",
    row_groups: Sequence[Sequence[int]] | None = None,
    micro_batch_size: int | None = None,
) -> TokenWeights:
    """STARE weights for the whole batch; ``TokenWeights.state`` is the controller's new state.

    ``variant`` defaults to O1, the released code's and its README's 7B default. ``controller`` holds
    the law and its settings (default: the paper's gate with W = 1.1, M = 0.9, P = 0.1); ``state`` is what the caller kept from the previous step (None: start
    from ``StareState.initial(controller)``).
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown STARE variant {variant!r}; choose one of {VARIANTS}")
    controller = controller or StareController()
    state = state if state is not None else StareState.initial(controller)
    # float64: an exact gate. No policy token at all (every kept episode void or truncated): the mean
    # is undefined, so NaN, and the controller skips this step as the released code does (a 0 would
    # read as "entropy collapsed" and switch reweighting on at full strength).
    mean_entropy = float(masked_mean(inputs.entropy.double(), inputs.mask)) if inputs.mask.any() else math.nan
    state = update_stare_state(state, mean_entropy, target_entropy, controller)

    groups = _row_groups(inputs.mask.shape[0], scope, row_groups, micro_batch_size)
    l_pos, l_neg, t_pos, t_neg = stare_selection(inputs, state.p, groups)
    if variant == "O1":
        l_neg = torch.zeros_like(l_neg)
    weights = torch.ones_like(inputs.logp_old)
    if state.gate_on:
        weights = torch.where(l_pos, torch.full_like(weights, state.w), weights)
        weights = torch.where(l_neg, torch.full_like(weights, state.m), weights)
    stats = {
        "gate_on": float(state.gate_on),
        "entropy_mean": mean_entropy,
        "target_entropy": target_entropy,
        "n_pos": float(t_pos.sum()),
        "n_neg": float(t_neg.sum()),
        "n_sel_pos": float(l_pos.sum()),
        "n_sel_neg": float(l_neg.sum()),
        "w": state.w,
        "m": state.m,
        "p": state.p,
        "strength": state.strength,
        "mean_weight": float(masked_mean(weights, inputs.mask)),
    }
    return TokenWeights(weights=weights, mask=inputs.mask, stats=stats, state=state)
