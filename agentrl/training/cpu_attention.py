"""The trainer's attention in float32 under bf16 autocast on the CPU (``trainer.bf16``).

Why: under ``torch.autocast("cpu", bfloat16)`` torch runs ``scaled_dot_product_attention`` in bf16,
and its CPU flash-attention backward is slower in bf16 than in float32, while the products around it
get faster: the attention becomes a large share of the bf16 backward. Run in float32 (its inputs
upcast, autocast off inside) the backward is faster and the log-probs keep bf16's own error; the
measurements: docs/performance.md#defaults-chosen-by-measurement-rolloutcpu_gemm-and-trainerbf16-are-auto.

``ATTENTION`` is transformers' ``sdpa`` with that one change, registered under its own name with
``sdpa``'s mask function; outside CPU autocast it is ``sdpa`` exactly (same call, same masks), so an
engine that shares the model's weights and modules computes what it computed before."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

ATTENTION = "agentrl_sdpa_fp32_cpu"


def _registered() -> bool:
    """Register ``ATTENTION`` with transformers (once); False where this transformers has no
    attention or mask registry (older than the masking utilities)."""
    try:
        from transformers import AttentionInterface
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError:
        return False

    def attention(
        module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Any, **kw: Any
    ) -> Any:
        # under autocast q may arrive in float32 (rotary embeddings promote it) and be cast down inside
        if query.device.type != "cpu" or not torch.is_autocast_enabled("cpu"):
            return sdpa_attention_forward(module, query, key, value, mask, **kw)
        with torch.autocast("cpu", enabled=False):
            out, weights = sdpa_attention_forward(
                module, query.float(), key.float(), value.float(), mask, **kw
            )
        return out.to(query.dtype), weights

    AttentionInterface.register(ATTENTION, attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
    return True


def apply(
    model: torch.nn.Module, device: torch.device, autocast_bf16: bool, log: Callable[[str], None]
) -> bool:
    """Give ``model`` the float32 attention when it trains under bf16 autocast on the CPU with
    transformers' ``sdpa`` (another implementation the user chose is kept). Returns whether it did."""
    config: Any = getattr(model, "config", None)
    if not autocast_bf16 or device.type != "cpu" or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    if not _registered():
        log(
            "note: this transformers has no attention registry: the bf16 attention backward stays bf16 (slower)"
        )
        return False
    setter = getattr(model, "set_attn_implementation", None)
    if setter is not None:
        setter(ATTENTION)
    else:
        config._attn_implementation = ATTENTION
    log(
        "bf16 autocast on the CPU: the attention runs in float32, whose backward is faster there (training/cpu_attention.py)"
    )
    return True
