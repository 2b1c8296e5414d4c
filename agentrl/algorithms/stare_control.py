"""STARE's controllers: the paper's target-entropy gate, its adaptive rule, and a PI controller.

The caller keeps a ``StareState`` across steps and checkpoints it (``to_dict``/``from_dict``).
Each step, ``stare_weights`` calls ``update_stare_state`` with the batch's token-mean entropy H̄_k
*before* computing weights, so the weights of step k use the gate and W/M after seeing H̄_k (as in
the released code's ``STAREController.update``, which the trainer calls before the actor update).

Laws (``StareController.law``):
- ``gate`` (paper §4, default): g_k = [H̄_k < H_tgt]; W, M, P fixed.
- ``adaptive`` (paper §4.4): the gate, plus every step
  W ← clip(W + α·sign(H_tgt - H̄_k), 1, W_max), M ← clip(M - α·sign(H_tgt - H̄_k), M_min, 1).
- ``critical`` (agentrl's addition): the gate, and while it is on W (and M for C2) are set every step
  from the batch's own first-order entropy balance so that its first-order entropy change is
  +margin·Λ (``stare_balance.critical_weights``, bounded by ``w_max`` and ``m_min``).
- ``pi`` (agentrl's addition, not in the paper): a proportional-integral controller on the relative
  error e_k = (H_tgt - H̄_k)/H_tgt drives one strength u ∈ [u_min, 1]:
      I_k = clip(I_{k-1} + k_i·e_k, u_min, 1)          (clamped integrator = anti-windup)
      u_k = clip(k_p·e_k + I_k, u_min, 1)
      W = W_min + u·(W_max - W_min),  M = M_max - u·(M_max - M_min),  P = P + max(u, 0)·(P_max - P)
  (for u < 0 the roles mirror: W = M_max - |u|(M_max - M_min), M = W_min + |u|(W_max - W_min);
  weights stay > 0). W_min = M_max = 1 (default) makes u the fraction of full strength; W_min > 1
  or M_max < 1 make the weakest reweighting the PI applies (at any u > 0) that strength, e.g. the
  paper's W 1.1 / M 0.9. Reweighting is on whenever u_k ≠ 0 (there is no separate gate). With u_min = 0 (default) the
  controller never pushes entropy down, like the paper's gate; u_min < 0 lets it (W < 1, M > 1)
  when entropy overshoots the target. The relative error makes the gains independent of the
  entropy scale. The integral finds the standing strength that balances the entropy drift, which
  the gate (on/off at fixed strength) and the adaptive rule (a fixed step α, limited by W_max)
  cannot, so it can sit at the target rather than oscillate below it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from typing import Any


@dataclass(frozen=True)
class StareController:
    """Settings (configuration, not state). Defaults: the paper's 7B values with the gate law."""

    law: str = "gate"
    w: float = 1.1
    """Initial W (gate/adaptive): weight on L+, the high-surprisal A>0 tokens."""
    m: float = 0.9
    """Initial M (gate/adaptive): weight on L-, the high-surprisal A<0 tokens (variant C2)."""
    p: float = 0.1
    """Selection fraction P of T+ and T-."""
    alpha: float = 0.01
    """Adaptive step (paper: 0.01)."""
    w_max: float = 1.5
    """Upper bound of W (adaptive and pi)."""
    m_min: float = 0.5
    """Lower bound of M (adaptive and pi)."""
    w_min: float = 1.0
    """PI: W at the smallest positive strength (W moves from ``w_min`` to ``w_max`` as u goes 0 -> 1)."""
    m_max: float = 1.0
    """PI: M at the smallest positive strength (M moves from ``m_max`` to ``m_min`` as u goes 0 -> 1)."""
    kp: float = 2.0
    """PI proportional gain on the relative entropy error (measured in bench/entropy_lab.py)."""
    ki: float = 0.2
    """PI integral gain per step on the relative entropy error (measured in bench/entropy_lab.py)."""
    u_min: float = 0.0
    """PI lower bound of the strength u, in [-1, 0] (0: never push entropy down; -1: symmetric)."""

    def __post_init__(self) -> None:
        if not -1.0 <= self.u_min <= 0.0:
            raise ValueError(f"u_min must be in [-1, 0], got {self.u_min}")
        if not 1.0 <= self.w_min <= self.w_max or not 0.0 <= self.m_min <= self.m_max <= 1.0:
            raise ValueError(
                "need 1 <= w_min <= w_max and 0 <= m_min <= m_max <= 1, got "
                f"w_min={self.w_min}, w_max={self.w_max}, m_min={self.m_min}, m_max={self.m_max}"
            )

    p_max: float | None = None
    """PI: P grows from ``p`` to ``p_max`` with u (None: P fixed)."""
    margin: float = 0.25
    """Critical: the first-order entropy change the weights aim at, as a multiple of the batch's drive Λ."""


@dataclass
class StareState:
    """What a STARE run carries from step to step; checkpoint it with ``to_dict``."""

    w: float
    m: float
    p: float
    gate_on: bool = False
    integral: float = 0.0
    strength: float = 0.0
    steps: int = 0
    last_entropy: float = math.nan
    target: float | None = None
    """H_tgt fixed at the first step when the target is relative (``target_scale``); None otherwise."""

    @staticmethod
    def initial(controller: StareController) -> StareState:
        return StareState(w=controller.w, m=controller.m, p=controller.p)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> StareState:
        names = {f.name for f in fields(StareState)}
        return StareState(**{k: v for k, v in d.items() if k in names})


def _clip(x: float, lo: float, hi: float) -> float:
    return min(max(x, lo), hi)


def gate_law(state: StareState, mean_entropy: float, target: float, ctl: StareController) -> StareState:
    """Paper §4 step 2: g_k = [H̄_k < H_tgt] (strict); W, M, P unchanged."""
    return replace(state, gate_on=mean_entropy < target)


def adaptive_law(state: StareState, mean_entropy: float, target: float, ctl: StareController) -> StareState:
    """Paper §4.4: the gate, and W/M move by ±α every step (whether or not the gate is on)."""
    sign = math.copysign(1.0, target - mean_entropy) if target != mean_entropy else 0.0
    return replace(
        state,
        gate_on=mean_entropy < target,
        w=_clip(state.w + ctl.alpha * sign, 1.0, ctl.w_max),
        m=_clip(state.m - ctl.alpha * sign, ctl.m_min, 1.0),
    )


def pi_law(state: StareState, mean_entropy: float, target: float, ctl: StareController) -> StareState:
    """PI control of the strength u on e = (H_tgt - H̄)/H_tgt, with a clamped integrator."""
    error = (target - mean_entropy) / max(abs(target), 1e-8)
    integral = _clip(state.integral + ctl.ki * error, ctl.u_min, 1.0)
    u = _clip(ctl.kp * error + integral, ctl.u_min, 1.0)
    w, m = strength_to_weights(u, ctl)
    p = ctl.p if ctl.p_max is None else ctl.p + max(u, 0.0) * (ctl.p_max - ctl.p)
    return replace(state, gate_on=u != 0.0, integral=integral, strength=u, w=w, m=m, p=p)


def strength_to_weights(u: float, ctl: StareController) -> tuple[float, float]:
    """u ∈ (0, 1] -> (W, M) = (W_min + u(W_max - W_min), M_max - u(M_max - M_min)); u = 0 -> (1, 1)
    (off); u < 0 mirrors the roles (W shrinks from M_max towards M_min, M grows from W_min towards
    W_max), so weights stay positive."""
    if u == 0:
        return 1.0, 1.0
    if u > 0:
        return ctl.w_min + u * (ctl.w_max - ctl.w_min), ctl.m_max - u * (ctl.m_max - ctl.m_min)
    return ctl.m_max + u * (ctl.m_max - ctl.m_min), ctl.w_min - u * (ctl.w_max - ctl.w_min)


CONTROL_LAWS: dict[str, Callable[[StareState, float, float, StareController], StareState]] = {
    "gate": gate_law,
    "adaptive": adaptive_law,
    "pi": pi_law,
    "critical": gate_law,  # the gate here; W and M from the batch's balance (``stare_balance``) in stare_weights
}


def update_stare_state(
    state: StareState, mean_entropy: float, target: float, controller: StareController
) -> StareState:
    """One control step. A non-finite entropy leaves the state unchanged (as the released code)."""
    if controller.law not in CONTROL_LAWS:
        raise ValueError(
            f"unknown STARE control law {controller.law!r}; choose one of {sorted(CONTROL_LAWS)}"
        )
    if not math.isfinite(mean_entropy):
        return state
    new = CONTROL_LAWS[controller.law](state, mean_entropy, target, controller)
    return replace(new, steps=state.steps + 1, last_entropy=mean_entropy)
