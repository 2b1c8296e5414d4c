"""Task sampling: epochs over the training tasks in a seeded order, resumable from a checkpoint."""

from __future__ import annotations

import random
from collections.abc import Sequence

from agentrl.env import Task


class TaskSampler:
    """Epochs over the task list in a seeded order; its position is checkpointed."""

    def __init__(self, tasks: Sequence[Task], seed: int) -> None:
        if not tasks:
            raise ValueError("no training tasks")
        self.tasks, self.seed = list(tasks), seed
        self.epoch, self.pos = 0, 0
        self._order = self._perm()

    def _perm(self) -> list[int]:
        order = list(range(len(self.tasks)))
        random.Random(f"{self.seed}-{self.epoch}").shuffle(order)
        return order

    def next(self, n: int) -> list[Task]:
        out: list[Task] = []
        while len(out) < n:
            if self.pos == len(self._order):
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._perm()
            out.append(self.tasks[self._order[self.pos]])
            self.pos += 1
        return out

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load(self, state: dict[str, int]) -> None:
        """Restore a checkpoint's position. A position past the end of this task list (a resume
        with ``--force`` onto fewer tasks) starts the next epoch."""
        self.epoch, self.pos = state["epoch"], state["pos"]
        if self.pos > len(self.tasks):
            self.epoch, self.pos = self.epoch + 1, 0
        self._order = self._perm()
