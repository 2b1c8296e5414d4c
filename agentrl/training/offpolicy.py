"""Off-policy guards for rollouts sampled by a different engine (or older weights) than the trainer's.

Two sources of mismatch: (1) the rollout engine's numerics differ from the trainer's forward (vLLM
kernels, bf16, batch-dependent rounding), so even with the same weights π_rollout ≠ π_old; (2) with
asynchronous rollouts an episode may have been sampled by weights some versions behind.

- ``tis_weights``: truncated importance sampling (Yao et al. 2025, "Your efficient RL framework
  secretly brings you off-policy RL training"): each policy token's policy-gradient term is multiplied
  by min(π_old(y)/π_rollout(y), C), a detached weight that corrects the sampling distribution while
  the cap C bounds the variance.
- ``MismatchMonitor``: the step's mean |log π_old − log π_rollout| is logged every step; a jump above
  ``factor`` × the running median of the previous steps is worth a warning (a weight sync that did
  not happen, a dtype change, a kernel bug).
- ``version_lag`` / ``too_stale``: how many weight versions behind an episode's oldest policy token
  is, and whether that exceeds ``rollout.max_staleness``.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import torch
from torch import Tensor

from agentrl.episode import Episode


def tis_weights(logp_old: Tensor, logp_rollout: Tensor, has_rollout: Tensor, cap: float) -> Tensor:
    """min(exp(logp_old − logp_rollout), cap) per token, 1 where the rollout gave no logprob.

    logp_old, logp_rollout: [B, T] float; has_rollout: [B, T] bool. Detached: the weight corrects the
    sampling distribution, it is not optimised."""
    ratio = torch.exp((logp_old - logp_rollout).detach()).clamp(max=cap)  # [B, T]
    return torch.where(has_rollout, ratio, torch.ones_like(ratio))


class MismatchMonitor:
    """Remembers the per-step mismatch and flags a jump over ``factor`` × the running median."""

    def __init__(self, factor: float = 3.0, min_history: int = 3, floor: float = 1e-3) -> None:
        self.factor, self.min_history, self.floor = factor, min_history, floor
        self.history: list[float] = []

    def update(self, value: float) -> str | None:
        """Record ``value``; return a warning message if it jumped, else None. ``floor`` keeps a
        run whose mismatch is ~0 (same engine, float32) from warning on rounding noise."""
        warning = None
        if len(self.history) >= self.min_history:
            median = statistics.median(self.history)
            if value > self.factor * max(median, self.floor):
                warning = (
                    f"rollout/trainer logprob mismatch jumped: {value:.4g} vs a running median of "
                    f"{median:.4g} (> {self.factor:g}×); check the weight sync and the engine dtype"
                )
        self.history.append(value)
        return warning


def version_lag(episode: Episode, current_version: int) -> int:
    """Weight versions between the trainer's current weights and the episode's oldest policy token."""
    versions = [
        s.weight_version for s in episode.segments if s.role == "policy" and s.weight_version is not None
    ]
    return current_version - min(versions) if versions else 0


def too_stale(episodes: Sequence[Episode], current_version: int, max_lag: int) -> list[bool]:
    """Per episode: does it lag more than ``max_lag`` versions (and so must not be trained on)?"""
    return [version_lag(e, current_version) > max_lag for e in episodes]


def versions_of(episode: Episode) -> set[int]:
    """The weight versions that sampled the episode's policy tokens (two or more: a partial rollout)."""
    return {s.weight_version for s in episode.segments if s.role == "policy" and s.weight_version is not None}


def staleness_metrics(episodes: Sequence[Episode], current_version: int) -> dict[str, float]:
    """The step's staleness: the largest and mean version lag, a histogram (``staleness/lag_<k>``:
    episodes whose oldest policy token is k versions behind) and the share of partial rollouts."""
    if not episodes:
        return {}
    lags = [version_lag(e, current_version) for e in episodes]
    out = {
        "offpolicy/version_lag_max": float(max(lags)),
        "offpolicy/version_lag_mean": sum(lags) / len(lags),
        "offpolicy/partial_frac": sum(len(versions_of(e)) > 1 for e in episodes) / len(episodes),
    }
    for k in sorted(set(lags)):
        out[f"staleness/lag_{k}"] = float(lags.count(k))
    return out
