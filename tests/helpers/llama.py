"""A small randomly initialised Llama for tests that need a model of a given shape (above the lean
step's or the bf16 rule's small-model bound, say) without a checkpoint."""

from __future__ import annotations

from typing import Any

import torch


def small_llama(
    vocab: int,
    hidden: int,
    inter: int,
    heads: int,
    kv_heads: int | None = None,
    layers: int = 1,
    seed: int = 0,
    **config: Any,
) -> torch.nn.Module:
    """A ``LlamaForCausalLM`` in eval mode, seeded: ``config`` goes to ``LlamaConfig``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    shape = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads or heads,
        **config,
    )
    return LlamaForCausalLM(shape).eval()
