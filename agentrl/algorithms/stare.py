"""STARE: surprisal-guided token-level advantage reweighting (arXiv 2606.19236; docs/algorithms.md, "Token weightings").

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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import torch
from torch import Tensor

from agentrl.algorithms.masked import masked_mean, topk_mask
from agentrl.algorithms.registry import StepContext, TokenWeighting, UpdateShape, register_weighting
from agentrl.algorithms.stare_balance import critical_weights, entropy_balance
from agentrl.algorithms.stare_control import StareController, StareState, update_stare_state
from agentrl.algorithms.token_weights import TokenWeights, WeightingInputs
from agentrl.dataclass_tree import knob

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
    target_scale: float | None = None,
    controller: StareController | None = None,
    state: StareState | None = None,
    scope: str = "batch",
    row_groups: Sequence[Sequence[int]] | None = None,
    micro_batch_size: int | None = None,
) -> TokenWeights:
    """STARE weights for the whole batch; ``TokenWeights.state`` is the controller's new state.

    ``variant`` defaults to O1, the released code's and its README's 7B default. ``controller`` holds
    the law and its settings (default: the paper's gate with W = 1.1, M = 0.9, P = 0.1); ``state`` is
    what the caller kept from the previous step (None: start from ``StareState.initial(controller)``).
    ``target_scale`` (agentrl's addition) makes H_tgt relative: ``target_scale`` × the first batch's
    H̄, measured once and kept in the state (``target_entropy`` is then not used).
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown STARE variant {variant!r}; choose one of {VARIANTS}")
    controller = controller or StareController()
    state = state if state is not None else StareState.initial(controller)
    # float64: an exact gate. No policy token at all (every kept episode void or truncated): the mean
    # is undefined, so NaN, and the controller skips this step as the released code does (a 0 would
    # read as "entropy collapsed" and switch reweighting on at full strength).
    mean_entropy = float(masked_mean(inputs.entropy.double(), inputs.mask)) if inputs.mask.any() else math.nan
    if target_scale is not None:  # H_tgt relative to the entropy the run starts with, fixed once
        if state.target is None and math.isfinite(mean_entropy):
            state = replace(state, target=target_scale * mean_entropy)
        target_entropy = math.nan if state.target is None else state.target
    state = update_stare_state(state, mean_entropy, target_entropy, controller)

    groups = _row_groups(inputs.mask.shape[0], scope, row_groups, micro_batch_size)
    l_pos, l_neg, t_pos, t_neg = stare_selection(inputs, state.p, groups)
    state, balance_stats = _balance_step(inputs, state, controller, variant, l_pos, l_neg)
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
        **balance_stats,
    }
    return TokenWeights(weights=weights, mask=inputs.mask, stats=stats, state=state)


def _balance_step(
    inputs: WeightingInputs, state: StareState, controller: StareController, variant: str, l_pos, l_neg
) -> tuple[StareState, dict[str, float]]:
    """The batch's entropy balance (``stare_balance``; L- as selected, also under O1) and, under the
    ``critical`` law, W and M from it. No φ in the inputs: no balance (an error under ``critical``)."""
    if inputs.phi is None or inputs.share is None:
        if controller.law == "critical":
            raise ValueError(
                "STARE controller 'critical' sets W from the batch's entropy balance: pass WeightingInputs "
                "with phi and share (the trainer does)"
            )
        return state, {}
    balance = entropy_balance(inputs.phi, inputs.advantages, inputs.share, l_pos, l_neg)
    if controller.law == "critical":
        w, m = critical_weights(balance, variant, controller.margin, controller.w_max, controller.m_min)
        state = replace(state, w=w, m=m)
    applied = (state.w, state.m if variant == "C2" else 1.0) if state.gate_on else (1.0, 1.0)
    return state, {**balance.stats(), "dH_first_order": balance.change(*applied)}


# -- the record: settings (``algorithm.stare``), how they become arguments, the rules ---------------
@dataclass
class AdaptiveConfig:
    alpha: float = knob(0.01, gt=0)
    """Step of W and M per training step: W += α·sign(H_tgt − H̄), M -= α·sign(H_tgt − H̄)."""
    W_max: float = knob(1.5, ge=1)
    """Upper limit of W (lower limit 1)."""
    M_min: float = knob(0.5, ge=0, le=1)
    """Lower limit of M (upper limit 1)."""


@dataclass
class PIConfig:
    kp: float = knob(2.0, ge=0)
    """Proportional gain on the relative entropy error (H_tgt − H̄)/H_tgt."""
    ki: float = knob(0.2, ge=0)
    """Integral gain on the accumulated relative error (with anti-windup at the bounds)."""
    W_min: float = knob(1.0, ge=1)
    """W at the smallest positive strength: W = W_min + u·(W_max − W_min) for strength u ∈ (0, 1] (weights are 1 at u = 0)."""
    W_max: float = knob(3.0, ge=1)
    """W at full strength (u = 1)."""
    M_min: float = knob(0.0, ge=0, le=1)
    """M at full strength (u = 1)."""
    M_max: float = knob(1.0, ge=0, le=1)
    """M at the smallest positive strength: M = M_max − u·(M_max − M_min)."""
    P_max: float | None = knob(None, gt=0, le=1)
    """P grows from ``stare.P`` to this with the strength: P = P + u·(P_max − P). None = P stays fixed."""


@dataclass
class CriticalConfig:
    margin: float = knob(0.25, ge=0)
    """The batch's first-order entropy change the weights aim at while the gate is on, as a multiple of its drive Λ: W = 1 + (1 + margin)·Λ/Γ+ (docs/algorithms.md, "The entropy balance and the critical weight")."""
    W_max: float = knob(10.0, ge=1)
    """Upper limit of W (lower limit 1)."""
    M_min: float = knob(0.5, ge=0, le=1)
    """Lower limit of M (C2; upper limit 1); past it W carries the rest."""


@dataclass
class StareConfig:
    variant: Literal["O1", "C2"] = "O1"
    """O1 boosts high-surprisal positive tokens only (the released code's 7B default); C2 also damps high-surprisal negative tokens."""
    target_entropy: float = knob(0.3, gt=0)
    """H_tgt in nats: reweighting is on while the batch's token-mean entropy is below it (unless ``target_scale`` is set)."""
    target_scale: float | None = knob(None, gt=0)
    """Relative target: H_tgt = this × the token-mean entropy of the run's first training batch (the warm start's), measured once and checkpointed; ``target_entropy`` is then not used. None = the fixed ``target_entropy``."""
    P: float = knob(0.1, gt=0, le=1)
    """Fraction of positive (and negative) tokens selected, by highest surprisal."""
    W: float = knob(1.1, ge=1)
    """Weight of selected positive tokens (paper: 1.1 for 7B; tiny models need ~2-3, docs/algorithms.md, "The entropy lab")."""
    M: float = knob(0.9, ge=0, le=1)
    """Weight of selected negative tokens (C2 only)."""
    scope: Literal["batch", "micro"] = "batch"
    """Rank tokens over the whole training batch (paper) or per micro-batch (released code)."""
    controller: Literal["gate", "adaptive", "pi", "critical"] = "gate"
    """How W and M are set: ``gate`` = fixed values while H̄ < H_tgt; ``adaptive`` = the paper's sign controller; ``pi`` = proportional-integral on the entropy error; ``critical`` = the gate, with W (and M) set each step from the batch's first-order entropy balance."""
    adaptive: AdaptiveConfig = field(default_factory=AdaptiveConfig)
    """Settings of the ``adaptive`` controller."""
    pi: PIConfig = field(default_factory=PIConfig)
    """Settings of the ``pi`` controller."""
    critical: CriticalConfig = field(default_factory=CriticalConfig)
    """Settings of the ``critical`` controller."""


def stare_arguments(s: StareConfig, step: StepContext) -> dict[str, Any]:
    """``algorithm.stare`` and this step's context as ``stare_weights`` keyword arguments."""
    pi = s.controller == "pi"
    w_max, m_min = s.adaptive.W_max, s.adaptive.M_min
    if pi:
        w_max, m_min = s.pi.W_max, s.pi.M_min
    elif s.controller == "critical":
        w_max, m_min = s.critical.W_max, s.critical.M_min
    controller = StareController(
        law=s.controller,
        w=s.W,
        m=s.M,
        p=s.P,
        alpha=s.adaptive.alpha,
        w_max=w_max,
        m_min=m_min,
        w_min=s.pi.W_min if pi else 1.0,
        m_max=s.pi.M_max if pi else 1.0,
        kp=s.pi.kp,
        ki=s.pi.ki,
        p_max=s.pi.P_max if pi else None,
        margin=s.critical.margin,
    )
    return {
        "variant": s.variant,
        "target_entropy": s.target_entropy,
        "target_scale": s.target_scale,
        "controller": controller,
        "state": step.state,
        "scope": s.scope,
        "row_groups": step.row_groups if s.scope == "micro" else None,
    }


def stare_checks(s: StareConfig, t: UpdateShape) -> Iterator[tuple[str, str]]:
    """Rules that tie ``algorithm.stare`` keys to each other and to the trainer's (``t``)."""
    if s.scope == "micro" and t.epochs_per_step > 1 and t.mini_batches_per_step > 1:
        yield (
            "algorithm.stare.scope",
            (
                "algorithm.stare.scope='micro' ranks within the micro-batches the update runs, but with "
                f"trainer.epochs_per_step={t.epochs_per_step} and trainer.mini_batches_per_step="
                f"{t.mini_batches_per_step} every epoch reshuffles them, so there is no single set of "
                "micro-batches to rank in: use scope 'batch', one epoch, or one mini-batch per step"
            ),
        )
    pairs = [("W_min", s.pi.W_min, "W_max", s.pi.W_max), ("M_min", s.pi.M_min, "M_max", s.pi.M_max)]
    pairs = [(f"algorithm.stare.pi.{a}", x, f"algorithm.stare.pi.{b}", y) for a, x, b, y in pairs]
    if s.controller == "pi" and s.pi.P_max is not None:
        pairs.append(("algorithm.stare.P", s.P, "algorithm.stare.pi.P_max", s.pi.P_max))
    if s.controller == "adaptive":
        pairs += [
            ("algorithm.stare.W", s.W, "algorithm.stare.adaptive.W_max", s.adaptive.W_max),
            ("algorithm.stare.adaptive.M_min", s.adaptive.M_min, "algorithm.stare.M", s.M),
        ]
    for low_key, low, high_key, high in pairs:
        if low > high:
            yield low_key, f"{low_key}={low} must not exceed {high_key}={high}"


STARE = register_weighting(
    TokenWeighting(
        "stare",
        stare_weights,
        settings=StareConfig,
        arguments=stare_arguments,
        state=StareState,
        check=stare_checks,
        needs_phi=True,
    )
)
