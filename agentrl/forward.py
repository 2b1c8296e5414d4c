"""Causal-LM forward passes that compute a prefix shared by every row only once.

Every episode of an environment starts with the same system prompt and tool schemas (often most of
the sequence: 230 of the calculator's 286 tokens), and no loss is ever taken on it. Run row by row,
a batch of B episodes pays for that prefix B times in the forward and again in the backward.
Here the common prefix is run once, with gradient, its key/value cache is repeated along the batch,
and only the suffixes are run as a batch on top of it. The logits of the suffix positions are the
same function of the weights as in a full forward (same positions, same causal attention), so
losses and gradients agree up to float rounding (tests/test_forward.py checks both).

Right padding stays harmless: pad tokens come after every real token of their row, so causal
attention never lets a real position see them (as in the full forward).
"""

from __future__ import annotations

import torch
from torch import Tensor


def shared_prefix_len(ids: Tensor, lengths: Tensor | None = None, limit: int | None = None) -> int:
    """Length of the longest prefix that every row of ``ids`` [B, T] shares, capped at ``limit``
    and kept strictly shorter than the shortest row (each row needs a suffix of its own)."""
    if ids.shape[0] == 0:
        return 0
    same = (ids == ids[:1]).all(dim=0)  # [T]
    n = int(same.long().cumprod(0).sum())
    shortest = int(lengths.min()) if lengths is not None else ids.shape[1]
    n = min(n, shortest - 1)
    if limit is not None:
        n = min(n, limit)
    return max(n, 0)


def first_loss_column(mask: Tensor) -> int:
    """The first column with a nonzero entry in any row of ``mask`` [B, T-1] (T-1 if none).
    Column j of an aligned mask is the target token j+1, predicted at position j."""
    any_col = (mask != 0).any(dim=0)
    nz = torch.nonzero(any_col)
    return int(nz[0]) if len(nz) else mask.shape[1]


def suffix_logits(model: torch.nn.Module, ids: Tensor, share: int) -> Tensor:
    """Logits [B, T - share, V] of the positions ``share..T-1`` of ``ids`` [B, T], running the
    first ``share`` tokens (identical in every row) once. ``share = 0`` is a plain forward."""
    if share <= 0:
        return model(input_ids=ids).logits
    B = ids.shape[0]
    prefix = model(input_ids=ids[:1, :share], use_cache=True)
    cache = prefix.past_key_values
    if cache is None:  # e.g. gradient checkpointing turns the cache off: fall back, still correct
        return model(input_ids=ids).logits[:, share:]
    if B > 1:
        cache.batch_repeat_interleave(B)
    return model(input_ids=ids[:, share:], past_key_values=cache, use_cache=False).logits
