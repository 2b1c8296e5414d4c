"""A lean one-token decode step for Qwen2-architecture models, for the embedded engine on CPU.

Why: for small models on CPU a decode step of ``transformers`` is mostly overhead, not arithmetic:
each step rebuilds a 4-D attention mask over the whole sequence, grows every layer's KV cache with
``torch.cat`` (copying it), and passes through several wrapper layers per module. Rollouts are most
of an RL step's time (``bench/train_step.py``), so that overhead is most of the step.

What: the same computation as ``Qwen2ForCausalLM.forward`` for one new token per row, written
directly against the model's own modules and weights (so ``load_weights`` updates are seen at once):
RMSNorm, q/k/v projections with bias, rotary embedding from the model's own ``rotary_emb`` (so any
rope scaling the config declares is honoured), grouped-query attention over a preallocated KV
buffer with the padding masked, o_proj, SwiGLU MLP, final norm and head. The prompt is still
prefilled by ``transformers``; its cache is copied into the buffer once.

Scope: ``supports(model)`` accepts Qwen2-style models (the tiny models and Qwen2/2.5) with full
attention in every layer and eager/sdpa attention; anything else keeps the ``transformers`` loop.
The engine records which path ran (``HFEngine.decode_path``). Parity with the full forward is
tested in tests/test_engines.py (max logit difference ~1e-5 in float32).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def supports(model: torch.nn.Module) -> bool:
    """True when ``model`` is a Qwen2-style causal LM this decoder reproduces exactly."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) != "qwen2":
        return False
    if getattr(cfg, "use_sliding_window", False):
        return False
    if any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or []):
        return False
    inner = getattr(model, "model", None)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    return inner is not None and all(hasattr(inner, n) for n in needed) and hasattr(model, "lm_head")


def _rms(x: Tensor, norm: Any) -> Tensor:
    """Qwen2RMSNorm: computed in float32, cast back, times the weight."""
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * h.to(dtype)


def _rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class LeanDecoder:
    """KV buffers for one batch and a ``step`` that appends one token per row.

    ``from_cache`` takes the ``DynamicCache`` of a left-padded prefill of width W and its attention
    mask [B, W] and reserves room for ``extra`` more tokens."""

    def __init__(
        self, model: torch.nn.Module, keys: list[Tensor], values: list[Tensor], mask: Tensor, length: int
    ):
        self.model = model
        self.inner = model.model  # type: ignore[attr-defined]
        self.keys, self.values = keys, values  # per layer [B, kvH, capacity, D]
        self.mask = mask  # [B, capacity] bool: real (non-padding) positions
        self.length = length  # columns filled
        attn = self.inner.layers[0].self_attn
        self.n_heads = model.config.num_attention_heads  # type: ignore[attr-defined]
        self.n_kv = model.config.num_key_value_heads  # type: ignore[attr-defined]
        self.head_dim = attn.head_dim
        self.scale = attn.scaling

    @classmethod
    def from_cache(cls, model: torch.nn.Module, cache: Any, mask: Tensor, extra: int) -> LeanDecoder:
        B, W = mask.shape
        keys, values = [], []
        for layer in cache.layers:
            k, v = layer.keys, layer.values  # [B, kvH, W, D]
            kb = k.new_zeros((B, k.shape[1], W + extra, k.shape[3]))
            vb = v.new_zeros((B, v.shape[1], W + extra, v.shape[3]))
            kb[:, :, :W], vb[:, :, :W] = k, v
            keys.append(kb)
            values.append(vb)
        full = torch.zeros((B, W + extra), dtype=torch.bool, device=mask.device)
        full[:, :W] = mask.bool()
        return cls(model, keys, values, full, W)

    def keep(self, rows: Tensor) -> None:
        """Keep only ``rows`` (indices into the current batch), dropping finished ones."""
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]
        self.mask = self.mask.index_select(0, rows)

    def step(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """Logits [B, V] (float32) of the next token after appending ``tokens`` [B] at rotary
        ``positions`` [B]."""
        col = self.length
        if col >= self.mask.shape[1]:
            raise RuntimeError("LeanDecoder: KV buffer full (more steps than reserved)")
        self.mask[:, col] = True
        B = tokens.shape[0]
        h = self.inner.embed_tokens(tokens)[:, None, :]  # [B, 1, H]
        cos, sin = self.inner.rotary_emb(h, positions[:, None])  # [B, 1, D]
        cos, sin = cos[:, None], sin[:, None]  # [B, 1, 1, D] broadcast over heads
        pad = ~self.mask[:, None, None, : col + 1]  # [B, 1, 1, col+1]: True on left padding
        for i, layer in enumerate(self.inner.layers):
            a = layer.self_attn
            x = _rms(h, layer.input_layernorm)
            q = a.q_proj(x).view(B, 1, self.n_heads, self.head_dim).transpose(1, 2)
            k = a.k_proj(x).view(B, 1, self.n_kv, self.head_dim).transpose(1, 2)
            v = a.v_proj(x).view(B, 1, self.n_kv, self.head_dim).transpose(1, 2)
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
            self.keys[i][:, :, col] = k[:, :, 0]
            self.values[i][:, :, col] = v[:, :, 0]
            # one query per row: plain matmuls beat SDPA's CPU kernels at this shape. Query heads
            # are grouped by the KV head they share (head j*g..j*g+g-1 reads KV head j, as repeat_kv)
            qg = q.reshape(B, self.n_kv, self.n_heads // self.n_kv, self.head_dim)  # [B, kvH, g, D]
            scores = torch.matmul(qg, self.keys[i][:, :, : col + 1].transpose(-1, -2)) * self.scale
            scores = scores.masked_fill(pad, float("-inf"))  # [B, kvH, g, col+1]
            probs = torch.softmax(scores.float(), dim=-1).to(qg.dtype)
            out = torch.matmul(probs, self.values[i][:, :, : col + 1])  # [B, kvH, g, D]
            h = h + a.o_proj(out.reshape(B, 1, self.n_heads * self.head_dim))
            m = layer.mlp
            x = _rms(h, layer.post_attention_layernorm)
            h = h + m.down_proj(m.act_fn(m.gate_proj(x)) * m.up_proj(x))
        self.length = col + 1
        h = _rms(h, self.inner.norm)
        return self.model.lm_head(h[:, 0]).float()  # type: ignore[attr-defined]
