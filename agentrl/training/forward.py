"""Causal-LM forward passes that compute a prefix shared by every row only once.

Every episode of an environment starts with the same system prompt and tool schemas (often most of
the sequence: 230 of the calculator's 286 tokens), and no loss is ever taken on it. Run row by row,
a batch of B episodes pays for that prefix B times in the forward and again in the backward.
Here the common prefix is run once, with gradient, its key/value cache is repeated along the batch,
and only the suffixes are run as a batch on top of it. The logits of the suffix positions are the
same function of the weights as in a full forward (same positions, same causal attention), so
losses and gradients agree up to float rounding (tests/training/test_forward.py checks both).

Prefixes shared by groups of rows count too: a GRPO group's episodes all start with the same
prompt, so a micro-batch of 4 groups × 8 holds 4 distinct prompts. ``prefix_plan`` picks the
prefix length that saves the most token positions, given how many distinct prefixes of that length
the rows have; each distinct prefix is run once and its cache rows repeated for its rows.

Right padding stays harmless: pad tokens come after every real token of their row, so causal
attention never lets a real position see them (as in the full forward).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from agentrl.models.cache_api import cache_kwargs, returned_cache


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


@dataclass(frozen=True)
class PrefixPlan:
    """Run ``ids[:, :share]`` once per distinct prefix: ``owners[i]`` is the first row whose prefix
    equals row i's (``owners[i] == i`` for the rows whose prefixes are run)."""

    share: int
    owners: Tensor  # [B] long

    @property
    def distinct(self) -> int:
        return int((self.owners == torch.arange(len(self.owners), device=self.owners.device)).sum())


def prefix_plan(ids: Tensor, lengths: Tensor | None = None, limit: int | None = None) -> PrefixPlan:
    """The shared-prefix length s (capped at ``limit``, strictly shorter than the shortest row) that
    saves the most positions, (B - distinct prefixes of length s) * s, and the row owning each
    prefix. ``share`` is 0 when nothing is saved."""
    B = ids.shape[0]
    shortest = int(lengths.min()) if lengths is not None and B else ids.shape[1]
    cap = max(min(shortest - 1, ids.shape[1] if limit is None else limit), 0)
    none = PrefixPlan(0, torch.arange(B, device=ids.device))
    if B < 2 or cap == 0:
        return none
    head = ids[:, :cap]
    lcp = torch.empty((B, B), dtype=torch.long, device=ids.device)  # longest common prefix, capped
    for i in range(B):
        ne = head[i : i + 1] != head  # [B, cap]
        lcp[i] = torch.where(ne.any(-1), ne.int().argmax(-1), cap)
    earlier = torch.ones((B, B), dtype=torch.bool, device=ids.device).tril()  # j <= i
    best, best_s = 0, 0
    for s in sorted(set(lcp.flatten().tolist()) - {0}):
        distinct = int((~((lcp >= s) & earlier).tril(-1).any(-1)).sum())
        if (B - distinct) * s > best:
            best, best_s = (B - distinct) * s, s
    if best_s == 0:
        return none
    # owner of row i: the first row j <= i with the same prefix of length best_s
    owners = ((lcp >= best_s) & earlier).int().argmax(-1)
    return PrefixPlan(best_s, owners)


def first_loss_column(mask: Tensor) -> int:
    """The first column with a nonzero entry in any row of ``mask`` [B, T-1] (T-1 if none).
    Column j of an aligned mask is the target token j+1, predicted at position j."""
    any_col = (mask != 0).any(dim=0)
    nz = torch.nonzero(any_col)
    return int(nz[0]) if len(nz) else mask.shape[1]


def suffix_logits(model: torch.nn.Module, ids: Tensor, share: int, owners: Tensor | None = None) -> Tensor:
    """Logits [B, T - share, V] of the positions ``share..T-1`` of ``ids`` [B, T], running each
    distinct prefix ``ids[:, :share]`` once: ``owners`` as in ``PrefixPlan`` (None: every row shares
    row 0's prefix). ``share = 0`` is a plain forward."""
    if share <= 0:
        return model(input_ids=ids).logits
    B = ids.shape[0]
    if owners is None:
        reps, index = torch.zeros(1, dtype=torch.long, device=ids.device), None
    else:
        reps, index = torch.unique(owners, sorted=True, return_inverse=True)  # index: row -> rep
    prefix = model(input_ids=ids[reps, :share], use_cache=True)
    cache = returned_cache(prefix)
    if cache is None:  # e.g. gradient checkpointing turns the cache off: fall back, still correct
        return model(input_ids=ids).logits[:, share:]
    if len(reps) == 1:
        if B > 1:
            cache.batch_repeat_interleave(B)
    else:
        cache.reorder_cache(index)  # index_select along the batch (differentiable)
    return model(input_ids=ids[:, share:], **cache_kwargs(model, cache), use_cache=False).logits


def output_head(model: nn.Module) -> nn.Linear | None:
    """The model's output head (``lm_head``) when it is a plain linear layer, through a DDP or peft
    wrapper; None when it is anything else (a LoRA-adapted head, a sharded one), so that a caller
    that applies the head itself never skips what the head's own forward would do."""
    inner: Any = getattr(model, "module", model)  # DDP
    if hasattr(inner, "get_base_model"):  # peft
        inner = inner.get_base_model()
    config = getattr(inner, "config", None)
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None):
        return None  # the logits are transformed after the head (Gemma 2, Cohere)
    get: Any = getattr(inner, "get_output_embeddings", None)
    head = get() if callable(get) else None
    return head if type(head) is nn.Linear else None


@contextlib.contextmanager
def hidden_states_out(head: nn.Linear) -> Iterator[None]:
    """Inside, ``head`` passes its input through, so the model's ``.logits`` are its last hidden
    states [B, T, D]: the caller applies the head a chunk of positions at a time
    (``token_logprobs_and_entropy_from_hidden``) and the [B, T, V] logits never exist whole.
    Llama/Qwen-style heads only: a model that transforms its logits after the head (soft-capping,
    scaling) would need that too."""
    head.forward = _identity  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        del head.forward


def _identity(x: Tensor) -> Tensor:
    return x
