"""Episode filters on plain per-episode lists (docs/algorithms.md, "Episode filters").

- ``dynamic_sampling_keep`` (DAPO, arXiv 2503.14476): drop every group whose rewards are all equal
  (it has zero advantage everywhere and only dilutes the batch); returns the kept indices.
- ``void_turn_multipliers`` (SimpleTIR, arXiv 2509.02479): episodes with a void turn stay in the
  group statistics (compute advantages over all episodes) but contribute no loss: multiply their
  loss mask by the returned 0.
- ``overlong_penalty`` (DAPO soft overlong punishment): the length penalty added to the reward.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence


def dynamic_sampling_keep(
    rewards: Sequence[float], group_ids: Sequence[Hashable], tolerance: float = 0.0
) -> list[int]:
    """Indices (in input order) of episodes whose group has max - min reward > ``tolerance``."""
    if len(rewards) != len(group_ids):
        raise ValueError(f"{len(rewards)} rewards but {len(group_ids)} group ids")
    lo: dict[Hashable, float] = {}
    hi: dict[Hashable, float] = {}
    for r, g in zip(rewards, group_ids):
        lo[g] = min(lo.get(g, r), r)
        hi[g] = max(hi.get(g, r), r)
    return [i for i, g in enumerate(group_ids) if hi[g] - lo[g] > tolerance]


def void_turn_multipliers(has_void_turn: Sequence[bool]) -> list[float]:
    """Per-episode loss-mask multiplier: 0.0 for an episode with a void turn, else 1.0."""
    return [0.0 if v else 1.0 for v in has_void_turn]


def overlong_penalty(lengths: Sequence[int], max_len: int, cache_len: int) -> list[float]:
    """R_len per episode: 0 up to L_max - L_cache, then -(L - (L_max - L_cache))/L_cache, -1 past L_max."""
    if cache_len <= 0 or cache_len > max_len:
        raise ValueError(f"need 0 < cache_len <= max_len, got cache_len={cache_len}, max_len={max_len}")
    start = max_len - cache_len
    return [-1.0 if n > max_len else min(0.0, -(n - start) / cache_len) for n in lengths]
