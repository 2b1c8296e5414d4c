"""Held-out rows: one set of rows split into training and test rows by a seeded permutation."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class HeldOut:
    """One set of rows serving both splits (one file without ``{split}``, or a hub dataset whose
    train and test splits are the same): a permutation seeded by ``seed`` puts ``fraction`` of the
    rows (at least one) in ``test`` and the rest in ``train``; ``side`` is the split wanted. Rows of
    ``test`` whose prompt also appears in ``train`` (duplicates in the file) are left out of it."""

    side: str
    fraction: float
    seed: int = 0

    def sides(self, n: int) -> tuple[list[int], list[int]]:
        """The row numbers of (train, test), each in file order."""
        if self.fraction <= 0:
            return list(range(n)), []
        n_test = max(1, round(self.fraction * n))
        if n_test >= n:
            raise ValueError(
                f"{n} row(s) cannot be split into training and held-out rows with data.test_fraction="
                f"{self.fraction:g}: add rows, or give the held-out rows their own file (data.test_path)"
            )
        order = list(range(n))
        random.Random(f"heldout-{self.seed}").shuffle(order)
        return sorted(order[n_test:]), sorted(order[:n_test])
