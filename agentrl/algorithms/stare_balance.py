"""The batch's first-order entropy balance under STARE's weights, and the weights that set its sign
(docs/algorithms.md, "The entropy balance and the critical weight").

A policy-gradient step at π = π_old moves the logits of token t's position by η·c_t·ω_t·A_t·(e_a − π)
in the tabular (one-softmax-per-position) picture, and changes its entropy to first order by
−η·c_t·ω_t·A_t·φ_t (``entropy_theory``; c_t is the token's share in the loss aggregation,
``losses.token_shares``). Summed over the trained tokens, with ω = 1 except W on L+ and M on L−:

    ΔH / η ≈ −Λ + (W − 1)·Γ+ + (1 − M)·Γ−,
    Λ  = Σ_{m=1}  c·A·φ     the batch's net entropy drive (> 0: entropy falls with ω ≡ 1),
    Γ+ = −Σ_{L+}  c·A·φ     what one unit of extra weight on L+ raises entropy by,
    Γ− =  Σ_{L−}  c·A·φ     what one unit of damping on L− raises entropy by.

The sign of ΔH flips at the critical weight W*_tab = 1 + Λ/Γ+ (O1; the paper's near-criticality
result, W* − 1 = O(1/T)), and for C2 moving W and M symmetrically (W − 1 = 1 − M, as the paper's
1.1 / 0.9) at W*_C2 = 1 + Λ/(Γ+ + Γ−). This is the tabular quantity: the network shares parameters
across positions, which ``bench/critical_weight.py`` measures against it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class Balance:
    """Λ, Γ+ and Γ− of one batch (sums over tokens; see the module's docstring)."""

    drive: float
    """Λ = Σ c·A·φ over every trained token."""
    gain_pos: float
    """Γ+ = −Σ_{L+} c·A·φ."""
    gain_neg: float
    """Γ− = Σ_{L−} c·A·φ (L− as selected, also under O1, which does not reweight it)."""
    lowering_frac: float
    """Share of L+ whose φ > 0: boosting them lowers entropy (NaN when L+ is empty)."""

    def change(self, w: float, m: float) -> float:
        """First-order ΔH / η at weights W on L+ and M on L−."""
        return -self.drive + (w - 1.0) * self.gain_pos + (1.0 - m) * self.gain_neg

    @property
    def w_star(self) -> float:
        """W*_tab = 1 + Λ/Γ+ (O1); when Γ+ ≤ 0: inf if Λ > 0 (no W raises entropy), else NaN."""
        return _critical(self.drive, self.gain_pos)

    @property
    def w_star_c2(self) -> float:
        """C2's W* with W − 1 = 1 − M: 1 + Λ/(Γ+ + Γ−)."""
        return _critical(self.drive, self.gain_pos + self.gain_neg)

    def stats(self) -> dict[str, float]:
        return {
            "lambda": self.drive,
            "gamma_pos": self.gain_pos,
            "gamma_neg": self.gain_neg,
            "w_star": self.w_star,
            "w_star_c2": self.w_star_c2,
            "lpos_lowering_frac": self.lowering_frac,
        }


def _critical(drive: float, gain: float) -> float:
    if gain > 0:
        return 1.0 + drive / gain
    return math.inf if drive > 0 else math.nan  # no lever against a falling entropy; or no flip point


def entropy_balance(phi: Tensor, advantages: Tensor, share: Tensor, l_pos: Tensor, l_neg: Tensor) -> Balance:
    """The balance from per-token φ, A (broadcast), aggregation shares c (0 off the loss mask), and
    the selected sets L+ / L− (bool), all [B, T]; sums in float64."""
    drive = (share.double() * advantages.double() * phi.double()).nan_to_num(0.0)
    lowering = phi[l_pos] > 0
    return Balance(
        drive=float(drive.sum()),
        gain_pos=-float(drive[l_pos].sum()),
        gain_neg=float(drive[l_neg].sum()),
        lowering_frac=float(lowering.double().mean()) if lowering.numel() else math.nan,
    )


def critical_weights(
    balance: Balance, variant: str, margin: float, w_max: float, m_min: float
) -> tuple[float, float]:
    """(W, M) that make the first-order change +margin·Λ (entropy rises by ``margin`` times what it
    would have fallen by at ω ≡ 1), within 1 ≤ W ≤ ``w_max`` and ``m_min`` ≤ M ≤ 1.

    O1: W = 1 + (1 + margin)·Λ/Γ+. C2: W − 1 = 1 − M = (1 + margin)·Λ/(Γ+ + Γ−); when M reaches
    ``m_min``, W carries the rest. A lever whose gain is ≤ 0 is not used (moving it would lower
    entropy); Λ ≤ 0 (entropy already rises to first order) gives (1, 1)."""
    need = (1.0 + margin) * balance.drive
    if not need > 0:
        return 1.0, 1.0
    g_pos, g_neg = max(balance.gain_pos, 0.0), max(balance.gain_neg, 0.0) if variant == "C2" else 0.0
    if g_pos + g_neg <= 0:
        return 1.0, 1.0
    delta = need / (g_pos + g_neg)
    m = max(1.0 - delta, m_min) if g_neg > 0 else 1.0
    rest = need - (1.0 - m) * g_neg
    w = 1.0 + rest / g_pos if g_pos > 0 else 1.0
    return min(max(w, 1.0), w_max), m
