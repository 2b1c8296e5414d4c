"""Per-token training overlays on episodes (docs/transcripts.md, format v1): what the update saw and
did at every policy token, for the transcript viewer and replay."""

from __future__ import annotations

import torch
from torch import Tensor

from agentrl import algorithms as alg
from agentrl.training.batch import Batch


def attach_overlays(
    batch: Batch,
    logp_old: Tensor,
    logp_new: Tensor,
    entropy: Tensor,
    tw: alg.TokenWeights,
    clip_status: Tensor,
) -> None:
    """Per-token training overlays on each episode (docs/transcripts.md, format v1): aligned with
    ``episode.token_ids()``, None on tokens the policy did not write."""
    trained = batch.mask > 0
    selected = torch.zeros_like(logp_old)
    selected = torch.where(trained & (tw.weights > 1), 1.0, selected)
    selected = torch.where(trained & ((tw.weights < 1) | ~tw.mask), -1.0, selected)
    if tw.abs_kl_weights is not None:
        selected = torch.where(trained & (tw.abs_kl_weights > 0), 1.0, selected)
    cols = {
        "logp_old": logp_old,
        "logp_new": logp_new,
        "entropy": entropy,
        "weight": tw.weights,
        "selected": selected,
        "clipped": clip_status,
    }
    for i, ep in enumerate(batch.episodes):
        n = int(batch.lengths[i])
        policy = ep.loss_mask()
        adv = float(batch.advantages[i])
        ov: dict[str, list[float | None]] = {}
        for key, tensor in cols.items():
            row = tensor[i, : n - 1].tolist()
            values: list[float | None] = [None]
            values += [round(v, 5) if policy[t + 1] else None for t, v in enumerate(row)]
            ov[key] = values
        ov["advantage"] = [adv if p else None for p in policy]
        flags: list[float | None] = [None]
        flags += [float(trained[i, t]) for t in range(n - 1)]  # every token: the doctor's masking check
        ov["trained"] = flags
        ep.overlays = ov
    for parent in {id(p): p for p in batch.parents or ()}.values():
        if parent.sample_breaks:  # its samples were rows of their own: join their overlays in order
            parts = [v.overlays for v, p in zip(batch.episodes, batch.parents or ()) if p is parent]
            if all(o is not None for o in parts):
                parent.overlays = {k: [x for o in parts if o for x in o[k]] for k in parts[0] or {}}
