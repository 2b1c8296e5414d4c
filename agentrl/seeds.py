"""Seeds: every random draw of a run derives from ``run.seed`` and where it happens (step, round,
purpose), so a seeded run reproduces and a step re-run after a resume draws what it drew before."""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def mix_seed(*xs: int) -> int:
    """A seed in [0, 2^31) from several integers (FNV-style mixing): ``mix_seed(run_seed, step, k)``."""
    h = 1469598103934665603
    for x in xs:
        h = ((h ^ (x & 0xFFFFFFFF)) * 1099511628211) % 2**61
    return h % 2**31
