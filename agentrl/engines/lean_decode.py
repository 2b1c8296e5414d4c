"""A lean one-token decode step for Qwen2-architecture models, for the embedded engine on CPU.

Why: for small models on CPU a decode step is mostly per-call overhead, not arithmetic. The
``transformers`` step rebuilds a 4-D attention mask over the whole sequence, grows every layer's KV
cache with ``torch.cat`` (copying it), and makes ~60 tensor calls per layer through several wrapper
modules. Rollouts are about half of an RL step's time (``bench/train_step.py``).

What: the same function as ``Qwen2ForCausalLM.forward`` for one new token per row, in about 15
calls per layer. At the start of each batch the weights are packed (``_Layer``): q, k, v and the
rotate-half images of q and k come out of one GEMM, gate and up out of another, every matrix is
pre-transposed, each RMSNorm weight is folded into the matrix that reads its output, and the
attention scale into the rotary tables of the queries. Keys are stored transposed in a
preallocated buffer, so a score is one small GEMM per (row, KV head); padding is an additive bias.
Rotary cos/sin come from the model's own ``rotary_emb`` (any rope scaling its config declares is
honoured). The prompt is still prefilled by ``transformers``; its cache is copied into the buffer.

Weights: packed copies are made per batch, so weight changes between batches (``load_weights``, or
a colocated trainer's in-place optimizer steps) are always seen, and a batch never sees a change
made during it (there is none: generation and training do not overlap in one process).

Numerics: exact in real arithmetic. In float32 the log-probs agree with the ``transformers`` loop
within 1e-5 and the sampled tokens are identical (tests/test_engines.py); in bfloat16, folding
rounds differently (log-probs within 0.15 of a bfloat16 forward, tested).

Scope: ``supports(model)`` accepts Qwen2-style models (the tiny models and Qwen2/2.5) with full
attention in every layer and no MLP biases; anything else keeps the ``transformers`` loop. The engine
records which path ran (``HFEngine.decode_path``)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
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
    if inner is None or not all(hasattr(inner, n) for n in needed) or not hasattr(model, "lm_head"):
        return False
    mlp = (inner.layers[0].mlp.gate_proj, inner.layers[0].mlp.up_proj, inner.layers[0].mlp.down_proj)
    return all(p.bias is None for p in mlp)  # Qwen2's MLP has none; the packed step assumes so


def _normed(x: Tensor, eps: Tensor) -> Tensor:
    """RMSNorm without its weight (folded into the next matmul, see ``_Layer``): x / RMS(x), the
    RMS computed in float32 as Qwen2RMSNorm does. ``eps`` is a [1, 1, 1] tensor; mean(x^2) + eps
    comes out of one batched dot product."""
    h = x.float()
    r = torch.baddbmm(eps, h[:, None, :], h[:, :, None], alpha=1.0 / h.shape[-1]).rsqrt_().view(-1, 1)
    return x * r if x.dtype == torch.float32 else (h * r).to(x.dtype)


def _rotate_half_matrix(n_heads: int, head_dim: int, dtype: torch.dtype, device: Any) -> Tensor:
    """R with ``y @ R == rotate_half(y)`` head by head for y [., n_heads * head_dim]: rotate_half
    maps (a, b) to (-b, a) in each head's two halves."""
    half = head_dim // 2
    r = torch.zeros(head_dim, head_dim, dtype=dtype, device=device)
    idx = torch.arange(half, device=device)
    r[idx + half, idx] = -1.0  # output i < half takes -y[i + half]
    r[idx, idx + half] = 1.0  # output i + half takes y[i]
    return torch.block_diag(*[r] * n_heads)


class _Layer:
    """One decoder layer's weights packed for a [B, H] decode step, so a layer is a handful of calls:

    - every matrix is transposed to [in, out] and contiguous (a row-major GEMM against a
      pre-transposed weight is 2-3x faster on CPU at these shapes than ``F.linear``);
    - one GEMM gives q, k, v and rotate_half(q), rotate_half(k): rotate_half is linear, so its
      matrix is multiplied into the q and k columns, and rotary embedding becomes
      ``qk * cos + qk_rotated * sin``;
    - each RMSNorm's weight w is folded into the rows of the matrix that reads the normed vector
      (``(w * n) @ W == n @ (w[:, None] * W)``), so a norm is ``x * rsqrt(mean(x^2) + eps)``.

    Exact in real arithmetic; in float32 the rounding differs from ``transformers`` by ~1e-6
    relative (parity is tested)."""

    def __init__(self, layer: Any, n_heads: int, n_kv: int, head_dim: int) -> None:
        a, m = layer.self_attn, layer.mlp
        w1, w2 = layer.input_layernorm.weight, layer.post_attention_layernorm.weight
        projs = (a.q_proj, a.k_proj, a.v_proj)
        bias = [p.bias if p.bias is not None else p.weight.new_zeros(p.weight.shape[0]) for p in projs]
        qk_t = torch.cat([a.q_proj.weight, a.k_proj.weight]).t()  # [H, (nH + kvH) D]
        rot = _rotate_half_matrix(n_heads + n_kv, head_dim, qk_t.dtype, qk_t.device)
        qk_b = torch.cat(bias[:2])
        self.qkv_t = (w1[:, None] * torch.cat([qk_t, a.v_proj.weight.t(), qk_t @ rot], dim=1)).contiguous()
        self.qkv_b = torch.cat([qk_b, bias[2], qk_b @ rot])
        self.o_t = a.o_proj.weight.t().contiguous()
        self.o_b = a.o_proj.bias
        self.gate_up_t = (w2[:, None] * torch.cat([m.gate_proj.weight, m.up_proj.weight]).t()).contiguous()
        self.down_t = m.down_proj.weight.t().contiguous()
        act = type(m.act_fn).__name__
        self.act = F.silu if act in ("SiLU", "SiLUActivation") else m.act_fn


class LeanDecoder:
    """KV buffers for one batch and a ``step`` that appends one token per row.

    ``from_cache`` takes the ``DynamicCache`` of a left-padded prefill of width W and its attention
    mask [B, W] and reserves room for ``extra`` more tokens. The weights are packed once here: a
    decoder serves one batch, during which the weights do not change; the next batch packs again,
    so weight updates between batches are always seen.

    Layout: keys are stored transposed, [B, kvH, D, capacity], so the score GEMM reads them without
    a transpose; values [B, kvH, capacity, D]. Padding is an additive bias (0 / -inf) per column.
    Queries are grouped by the KV head they share (head j*g..j*g+g-1 reads KV head j, as
    ``repeat_kv``), so each (row, KV head) is one small GEMM of g queries."""

    def __init__(
        self,
        model: torch.nn.Module,
        keys: list[Tensor],
        values: list[Tensor],
        bias: Tensor,
        length: int,
        positions_needed: int,
    ):
        if not supports(model):
            raise ValueError(
                "LeanDecoder reproduces Qwen2-style models with full attention and no MLP biases only "
                "(check lean_decode.supports(model) first)"
            )
        self.model = model
        self.inner = model.model  # type: ignore[attr-defined]
        self.keys, self.values = keys, values  # per layer [B, kvH, D, capacity], [B, kvH, capacity, D]
        self.bias = bias  # [B, kvH, 1, capacity]: -inf on left padding, 0 elsewhere
        self.length = length  # columns filled
        cfg = model.config  # type: ignore[attr-defined]
        self.n_heads, self.n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        attn = self.inner.layers[0].self_attn
        self.head_dim, self.scale = attn.head_dim, attn.scaling
        eps = self.inner.layers[0].input_layernorm.variance_epsilon
        self.eps = torch.full((1, 1, 1), eps, dtype=torch.float32, device=bias.device)
        self.layers = [_Layer(layer, self.n_heads, self.n_kv, self.head_dim) for layer in self.inner.layers]
        w = self.inner.norm.weight
        self.head_t = (w[:, None] * model.lm_head.weight.t()).contiguous()  # type: ignore[attr-defined]
        self.head_b = getattr(model.lm_head, "bias", None)  # type: ignore[attr-defined]
        self.embed = self.inner.embed_tokens.weight
        self._rope_tables(positions_needed)
        self._views()

    def _rope_tables(self, n: int) -> None:
        """cos and sin for positions [0, n), per query and key head: [n, (nH + kvH) D], with the
        attention scale folded into the query heads' columns."""
        D = self.head_dim
        probe = self.head_t.new_zeros((1, 1, 1))
        cos, sin = self.inner.rotary_emb(probe, torch.arange(n, device=probe.device)[None])  # [1, n, D]
        heads = self.n_heads + self.n_kv
        scale = torch.ones(heads, 1, dtype=cos.dtype, device=cos.device)
        scale[: self.n_heads] = self.scale
        self.cos = (cos[0][:, None, :] * scale).reshape(n, heads * D)
        self.sin = (sin[0][:, None, :] * scale).reshape(n, heads * D)

    @classmethod
    def from_cache(cls, model: torch.nn.Module, cache: Any, mask: Tensor, extra: int) -> LeanDecoder:
        B, W = mask.shape
        keys, values = [], []
        for layer in cache.layers:
            k, v = layer.keys, layer.values  # [B, kvH, W, D]
            kb = k.new_zeros((B, k.shape[1], k.shape[3], W + extra))
            vb = v.new_zeros((B, v.shape[1], W + extra, v.shape[3]))
            kb[..., :W], vb[:, :, :W] = k.transpose(-1, -2), v
            keys.append(kb)
            values.append(vb)
        n_kv = keys[0].shape[1]
        bias = keys[0].new_zeros((B, n_kv, 1, W + extra))
        bias[:, :, 0, :W].masked_fill_(~mask.bool()[:, None, :], float("-inf"))
        return cls(model, keys, values, bias, W, positions_needed=W + extra + 1)

    def keep(self, rows: Tensor) -> None:
        """Keep only ``rows`` (indices into the current batch), dropping finished ones."""
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]
        self.bias = self.bias.index_select(0, rows)
        self._views()

    def _views(self) -> None:
        """[B kvH, ...] views of the buffers, one GEMM batch per (row, KV head)."""
        B, nKV, D, cap = self.keys[0].shape
        self.keys3 = [k.view(B * nKV, D, cap) for k in self.keys]
        self.values3 = [v.view(B * nKV, cap, D) for v in self.values]
        self.bias3 = self.bias.view(B * nKV, 1, cap)

    def step(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """Logits [B, V] (float32) of the next token after appending ``tokens`` [B] at rotary
        ``positions`` [B]. (Written with locals and ``narrow``/``select``: at small sizes the
        Python around each call is a measurable share of a step.)"""
        col = self.length
        if col >= self.bias.shape[-1]:
            raise RuntimeError("LeanDecoder: KV buffer full (more steps than reserved)")
        B, nH, nKV, D, eps = tokens.shape[0], self.n_heads, self.n_kv, self.head_dim, self.eps
        g, L, heads = nH // nKV, col + 1, nH + nKV
        qk_end, v_end = heads * D, (heads + nKV) * D
        h = F.embedding(tokens, self.embed)  # [B, H]
        cos, sin = self.cos.index_select(0, positions), self.sin.index_select(0, positions)
        bias = self.bias3.narrow(2, 0, L)
        f32 = h.dtype == torch.float32
        for lw, k4, k3, v4, v3 in zip(self.layers, self.keys, self.keys3, self.values, self.values3):
            qkv = torch.addmm(lw.qkv_b, _normed(h, eps), lw.qkv_t)  # [q k | v | rot(q) rot(k)]
            qk = torch.addcmul(qkv.narrow(1, 0, qk_end) * cos, qkv.narrow(1, v_end, qk_end), sin)
            qk = qk.view(B, heads, D)  # rotary applied; queries also scaled
            k4.select(3, col).copy_(qk.narrow(1, nH, nKV))
            v4.select(2, col).copy_(qkv.narrow(1, qk_end, nKV * D).view(B, nKV, D))
            q = qk.narrow(1, 0, nH).reshape(B * nKV, g, D)  # grouped by the KV head they read
            scores = torch.bmm(q, k3.narrow(2, 0, L)).add_(bias)  # [B kvH, g, L]
            if f32:
                probs = torch.softmax(scores, dim=-1)
            else:  # eager attention's softmax runs in float32
                probs = torch.softmax(scores.float(), dim=-1).to(scores.dtype)
            h = torch.addmm(h, torch.bmm(probs, v3.narrow(1, 0, L)).view(B, nH * D), lw.o_t)
            if lw.o_b is not None:
                h = h + lw.o_b
            gu = torch.mm(_normed(h, eps), lw.gate_up_t)
            inter = gu.shape[1] // 2
            h = torch.addmm(h, lw.act(gu.narrow(1, 0, inter)).mul_(gu.narrow(1, inter, inter)), lw.down_t)
        self.length = L
        logits = torch.mm(_normed(h, eps), self.head_t)
        if self.head_b is not None:
            logits = logits + self.head_b
        return logits.float()
