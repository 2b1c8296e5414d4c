"""Random token-weighting inputs for the algorithm tests."""

from __future__ import annotations

import torch

from agentrl.algorithms import WeightingInputs


def random_inputs(seed=0, b=8, t=24, mean_entropy=0.1) -> WeightingInputs:
    g = torch.Generator().manual_seed(seed)
    logp_old = -3 * torch.rand(b, t, generator=g)
    entropy = 2 * mean_entropy * torch.rand(b, t, generator=g)
    adv = torch.randn(b, generator=g)
    adv[2] = 0.0
    lengths = torch.randint(4, t + 1, (b,), generator=g)
    mask = torch.arange(t)[None] < lengths[:, None]
    mask[0, 3:6] = False  # tool output inside a response
    return WeightingInputs.build(logp_old, entropy, adv, mask)


def perturb_masked(inputs: WeightingInputs, seed: int) -> WeightingInputs:
    g = torch.Generator().manual_seed(seed)
    off = ~inputs.mask
    noise = 10 * torch.randn(inputs.mask.shape, generator=g)
    return WeightingInputs(
        logp_old=torch.where(off, inputs.logp_old + noise.abs(), inputs.logp_old)
        - torch.where(off, 50.0, 0.0),
        entropy=torch.where(off, noise.abs() * 100, inputs.entropy),
        advantages=torch.where(off, noise, inputs.advantages),
        mask=inputs.mask,
    )
