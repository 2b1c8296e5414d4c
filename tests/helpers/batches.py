"""Seeded synthetic batches for the learner's tests and the sharding benchmark."""

from __future__ import annotations

import torch

from agentrl.episode import Episode, Segment
from agentrl.training.batch import Batch, build_batch


def synthetic_batch(vocab: int, n: int = 6, seed: int = 0) -> Batch:
    """A seeded batch of episodes of different lengths (prompt, policy, tool, policy) with engine
    logprobs and mixed-sign advantages: enough structure to exercise masks and padding."""
    g = torch.Generator().manual_seed(seed)
    eps = []
    for i in range(n):
        ep = Episode(id=f"e{i}", env="synthetic", task_id=f"t{i}", seed=i, group=f"g{i % 2}")

        def ids(k: int) -> list[int]:
            return torch.randint(5, vocab, (k,), generator=g).tolist()

        ep.add(Segment("prompt", 0, ids(4 + i), "p"))
        a = ids(3 + 2 * i)
        ep.add(Segment("policy", 0, a, "a", [-1.0 - 0.1 * j for j in range(len(a))], 0))
        ep.add(Segment("tool", 1, ids(2 + i % 3), "t"))
        b = ids(5 - i % 3)
        ep.add(Segment("policy", 1, b, "b", [-0.5] * len(b), 0))
        eps.append(ep)
    adv = torch.linspace(-1.0, 1.5, n)
    return build_batch(eps, adv, [1.0] * n, pad_id=0)
