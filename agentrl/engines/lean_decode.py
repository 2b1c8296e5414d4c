"""A lean one-token decode step for Qwen2- and Llama-architecture models, for the embedded engine.

Why: for small models on CPU a decode step is mostly per-call overhead, not arithmetic. The
``transformers`` step rebuilds a 4-D attention mask over the whole sequence, grows every layer's KV
cache with ``torch.cat`` (copying it), and makes ~60 tensor calls per layer through several wrapper
modules. Rollouts are about half of an RL step's time (docs/performance.md#on-the-tiny-model).

What: the same function as ``Qwen2ForCausalLM.forward`` (or ``LlamaForCausalLM.forward``: the same
layer, with biases on q, k and v in Qwen2 and optionally on all four attention projections in Llama)
for one new token per row, in about 15
calls per layer. The weights are packed (``lean_weights.py``): q, k, v and the
rotate-half images of q and k come out of one GEMM, gate and up out of another, every matrix is
pre-transposed, each RMSNorm weight is folded into the matrix that reads its output, and the
attention scale into the rotary tables of the queries. Keys are stored transposed in a
preallocated buffer, so a score is one small GEMM per (row, KV head); padding is an additive bias.
Intermediate results are written into a per-batch workspace (``_Workspace``) through views made once,
so a step allocates almost nothing and slices little (the same operations in the same order as
allocating each result).
Rotary cos/sin come from the model's own ``rotary_emb`` (any rope scaling its config declares is
honoured). The prompt is still prefilled by ``transformers``; its cache is copied into the buffer.

Weights: the engine keeps one packed copy (``lean_weights.PackedWeights``) and packs again, in place,
before a batch whose model's weights changed since (``load_weights``, or a colocated trainer's
in-place optimizer steps: each parameter's in-place version counter says so), so a change between
batches is always seen, and a batch never sees a change made during it (there is none: generation
and training do not overlap in one process).

Numerics: exact in real arithmetic. In float32 the log-probs agree with the ``transformers`` loop
within 1e-5 and the sampled tokens are identical (tests/engines/test_engines.py); in bfloat16, folding
rounds differently (log-probs within 0.15 of a bfloat16 forward, tested).

Scope: ``supports(model)`` accepts Qwen2 models (the tiny models, Qwen2/2.5) and Llama models
(Llama 2/3, SmolLM2) with full attention in every layer and no MLP biases; anything else keeps the
``transformers`` loop. The engine
records which path ran (``HFEngine.decode_path``)."""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from agentrl.engines.lean_weights import PackedWeights, half_swap

ARCHITECTURES = ("qwen2", "llama")  # the same decoder layer, up to which projections carry biases


def supports(model: torch.nn.Module) -> bool:
    """True when ``model`` is a Qwen2- or Llama-architecture causal LM this decoder reproduces
    exactly: full attention in every layer, no MLP biases, one tensor-parallel slice."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in ARCHITECTURES:
        return False
    if getattr(cfg, "use_sliding_window", False) or getattr(cfg, "mlp_bias", False):
        return False
    if getattr(cfg, "pretraining_tp", 1) != 1:  # older Llama code splits the matmuls differently
        return False
    if any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or []):
        return False
    inner = getattr(model, "model", None)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if inner is None or not all(hasattr(inner, n) for n in needed) or not hasattr(model, "lm_head"):
        return False
    mlp = (inner.layers[0].mlp.gate_proj, inner.layers[0].mlp.up_proj, inner.layers[0].mlp.down_proj)
    return all(p.bias is None for p in mlp)  # Qwen2's MLP has none; the packed step assumes so


# On the CPU the lean step pays off up to hidden 256: it removes per-call overhead, which dominates
# only small models; above, the matrix products do (docs/models-and-engines.md#engines-agentrlengines).
PAYS_OFF_UP_TO_HIDDEN = 256


def pays_off(model: torch.nn.Module) -> bool:
    """True when the lean step is faster than the transformers forward for ``model`` (its hidden
    size, against ``PAYS_OFF_UP_TO_HIDDEN``)."""
    return int(getattr(getattr(model, "config", None), "hidden_size", 0) or 0) <= PAYS_OFF_UP_TO_HIDDEN


def _normed(x: Tensor, eps: Tensor) -> Tensor:
    """RMSNorm without its weight (folded into the next matmul, see ``lean_weights._Layer``): x / RMS(x), the
    RMS computed in float32 as Qwen2RMSNorm does. ``eps`` is a [1, 1, 1] tensor; mean(x^2) + eps
    comes out of one batched dot product."""
    h = x.float()
    r = torch.baddbmm(eps, h[:, None, :], h[:, :, None], alpha=1.0 / h.shape[-1]).rsqrt_().view(-1, 1)
    return x * r if x.dtype == torch.float32 else (h * r).to(x.dtype)


class LeanDecoder:
    """KV buffers for one batch and a ``step`` that appends one token per row.

    ``from_cache`` takes the ``DynamicCache`` of a left-padded prefill of width W and its attention
    mask [B, W] and reserves room for ``extra`` more tokens. ``packed``: the weights packed for this
    model (``lean_weights.PackedWeights``, the engine's copy, current for the batch); None packs
    them here, with ``gemm``.

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
        gemm: str = "mkl",
        packed: PackedWeights | None = None,
    ):
        if not supports(model):
            raise ValueError(
                "LeanDecoder reproduces Qwen2- and Llama-style models with full attention and no MLP biases only "
                "(check lean_decode.supports(model) first)"
            )
        m: Any = model  # a Qwen2/LlamaForCausalLM (supports() checked); its attributes are typed loosely
        self.model, self.inner = m, m.model
        self.keys, self.values = keys, values  # per layer [B, kvH, D, capacity], [B, kvH, capacity, D]
        self.bias = bias  # [B, kvH, 1, capacity]: 0 on columns written, -inf on padding and columns to come
        self.length = length  # columns the prefill filled
        self.col = torch.full((1,), length, dtype=torch.long, device=bias.device)
        """The next column to write, on the device: the step reads it, so its shapes never change."""
        cfg = m.config
        self.n_heads: int = cfg.num_attention_heads
        self.n_kv: int = cfg.num_key_value_heads
        attn = self.inner.layers[0].self_attn
        self.head_dim: int = attn.head_dim
        self.scale: float = attn.scaling
        self.embed: Tensor = self.inner.embed_tokens.weight  # the model's own (PackedWeights.embed)
        eps = self.inner.layers[0].input_layernorm.variance_epsilon
        self.eps = torch.full((1, 1, 1), eps, dtype=torch.float32, device=bias.device)
        if gemm not in ("mkl", "onednn"):
            raise ValueError(f"gemm={gemm!r}: choose mkl or onednn (engines/cpu_gemm.py)")
        rows = keys[0].shape[0] if gemm == "onednn" else None  # oneDNN packs each weight for the batch
        self.packed = packed if packed is not None else PackedWeights(m, rows)
        self.gemm = "onednn" if self.packed.rows is not None else "mkl"
        self.layers, self.head, self.head_b = self.packed.layers, self.packed.head, self.packed.head_b
        self._rope_tables(positions_needed)
        self._views()

    def _rope_tables(self, n: int) -> None:
        """cos and sin for positions [0, n), per query and key head: [n, (nH + kvH) D], with the
        attention scale folded into the query heads' columns and, where the step swaps the halves of
        q and k instead of reading rotated columns (``lean_weights._Layer``), the sign of
        rotate_half into the first half of each head's sin."""
        D = self.head_dim
        probe = self.embed.new_zeros((1, 1, 1))
        cos, sin = self.inner.rotary_emb(probe, torch.arange(n, device=probe.device)[None])  # [1, n, D]
        heads = self.n_heads + self.n_kv
        scale = torch.ones(heads, 1, dtype=cos.dtype, device=cos.device)
        scale[: self.n_heads] = self.scale
        self.cos = (cos[0][:, None, :] * scale).reshape(n, heads * D)
        if not self.packed.fold_rotation:  # the step swaps halves: rotate_half's sign goes here
            sign = torch.ones(D, dtype=sin.dtype, device=sin.device)
            sign[: D // 2] = -1.0
            scale = scale * sign
        self.sin = (sin[0][:, None, :] * scale).reshape(n, heads * D)

    @classmethod
    def from_cache(
        cls,
        model: torch.nn.Module,
        cache: Any,
        mask: Tensor,
        extra: int,
        gemm: str = "mkl",
        packed: PackedWeights | None = None,
    ) -> LeanDecoder:
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
        bias = keys[0].new_full((B, n_kv, 1, W + extra), float("-inf"))  # columns to come: -inf
        bias[:, :, 0, :W].masked_fill_(mask.bool()[:, None, :], 0.0)
        return cls(model, keys, values, bias, W, positions_needed=W + extra + 1, gemm=gemm, packed=packed)

    def keep(self, rows: Tensor) -> None:
        """Keep only ``rows`` (indices into the current batch), dropping finished ones."""
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]
        self.bias = self.bias.index_select(0, rows)
        self._views()

    def first_rows(self, rows: int) -> LeanDecoder:
        """A decoder over the first ``rows`` rows of this one's buffers: the same memory (and the
        same packed weights, rotary tables and column ``col``), its own workspace."""
        d = copy.copy(self)
        d.keys = [k[:rows] for k in self.keys]
        d.values = [v[:rows] for v in self.values]
        d.bias = self.bias[:rows]
        d._views()
        return d

    def _views(self) -> None:
        """[B kvH, ...] views of the buffers, one GEMM batch per (row, KV head), and the step's
        workspace (``_Workspace``) for the current number of rows."""
        B, nKV, D, cap = self.keys[0].shape
        self.keys3 = [k.view(B * nKV, D, cap) for k in self.keys]
        self.values3 = [v.view(B * nKV, cap, D) for v in self.values]
        self.bias3 = self.bias.view(B * nKV, 1, cap)
        self.ws = _Workspace(self, B)

    def step(self, tokens: Tensor, positions: Tensor, span: int | None = None) -> Tensor:
        """Logits [B, V] (float32) of the next token after appending ``tokens`` [B] at rotary
        ``positions`` [B]. Intermediate results go to the workspace's buffers through views made
        once per batch (``out=`` and in-place calls): at these sizes, allocations and the Python
        around each call are a measurable share of a step.

        No host read: the column written is ``self.col``, a device tensor. With ``span`` None the
        attention reads the whole capacity, the columns not yet written masked by a -inf bias
        (exp(-inf) = 0: the same weights, summed over more zeros), so every step runs the same
        operations on the same shapes and can be replayed as a CUDA graph. ``span``: read only the
        first ``span`` columns (at least the one written), a length the caller knows without
        reading the device; on the CPU, where nothing is replayed, attending over the whole capacity
        cost 1.6x the attention of the columns in use (a 2 M model, 32 rows, 2 cores). The capacity is
        the caller's to respect: ``from_cache`` reserves room for ``extra`` steps, and a column past
        the buffer is an index error."""
        ws, col = self.ws, self.col
        keys3, values3, bias3 = self.keys3, self.values3, self.bias3
        if span is not None:
            keys3 = [k.narrow(2, 0, span) for k in keys3]
            values3 = [v.narrow(1, 0, span) for v in values3]
            bias3 = bias3.narrow(2, 0, span)
        h = F.embedding(tokens, self.embed)  # [B, H], the residual stream, updated in place
        torch.index_select(self.cos, 0, positions, out=ws.cos)
        torch.index_select(self.sin, 0, positions, out=ws.sin)
        self.bias.index_fill_(3, col, 0.0)  # the new token's column is attended to from now on
        f32 = h.dtype == torch.float32
        for lw, k4, k3, v4, v3 in zip(self.layers, self.keys, keys3, self.values, values3):
            lw.qkv.into(ws.normed(h), ws.qkv)  # [q k | v | rot(q) rot(k)], or [q k | v] and a swap
            if ws.swap is not None:
                torch.index_select(ws.qk, 1, ws.swap, out=ws.qk_swapped)
            # rotary (queries also scaled); key and value written into the cache's column ``col``
            torch.mul(ws.q_raw, ws.cos_q, out=ws.q).addcmul_(ws.q_rot, ws.sin_q)
            torch.mul(ws.k_raw, ws.cos_k, out=ws.k).addcmul_(ws.k_rot, ws.sin_k)
            k4.index_copy_(3, col, ws.k[..., None])  # [B, kvH, D, 1] into [B, kvH, D, capacity]
            v4.index_copy_(2, col, ws.v[:, :, None])  # [B, kvH, 1, D] into [B, kvH, capacity, D]
            scores = torch.baddbmm(bias3, ws.q3, k3)  # [B kvH, g, capacity or span]
            if f32:
                probs = torch.softmax(scores, dim=-1)
            else:  # eager attention's softmax runs in float32
                probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(scores.dtype)
            torch.bmm(probs, v3, out=ws.attn)
            lw.o.add_into(h, ws.attn2)
            lw.gate_up.into(ws.normed(h), ws.gate_up)
            lw.down.add_into(h, lw.act(ws.gate).mul_(ws.up))
        col.add_(1)
        logits = self.head(ws.normed(h))
        if self.head_b is not None:
            logits = logits + self.head_b
        return logits.float()


class _Workspace:
    """Buffers for one decode step of B rows, and views into them made once: the packed GEMM's
    output split into raw and rotated q, k and v (the rotated ones from the GEMM, or from a buffer
    the step fills by swapping halves: ``lean_weights._Layer``), the rotary tables' query and key
    columns, the queries grouped by KV head ([B kvH, g, D]) and the attention output seen as
    [B, nH D]."""

    def __init__(self, d: LeanDecoder, B: int) -> None:
        nH, nKV, D = d.n_heads, d.n_kv, d.head_dim
        heads, qd, kd = nH + nKV, nH * D, nKV * D
        dt, dev = d.keys[0].dtype, d.keys[0].device
        new = lambda *shape, dtype=dt: torch.empty(shape, dtype=dtype, device=dev)  # noqa: E731
        self.eps = d.eps
        self.qkv = new(B, d.layers[0].qkv_width)
        v_end = (heads + nKV) * D
        self.qk = self.qkv.narrow(1, 0, qd + kd)
        self.swap: Tensor | None = None  # with the rotation folded in, the GEMM gives rot(q), rot(k)
        if d.packed.fold_rotation:
            rotated = self.qkv.narrow(1, v_end, qd + kd)
        else:
            self.swap = half_swap(heads, D, dev)
            self.qk_swapped = rotated = new(B, qd + kd)
        self.q_raw, self.q_rot = self.qkv.narrow(1, 0, qd), rotated.narrow(1, 0, qd)
        self.k_raw = self.qkv.narrow(1, qd, kd).view(B, nKV, D)
        self.k_rot = rotated.narrow(1, qd, kd).view(B, nKV, D)
        self.v = self.qkv.narrow(1, heads * D, kd).view(B, nKV, D)
        self.cos, self.sin = new(B, heads * D), new(B, heads * D)
        self.cos_q, self.sin_q = self.cos.narrow(1, 0, qd), self.sin.narrow(1, 0, qd)
        self.cos_k = self.cos.narrow(1, qd, kd).view(B, nKV, D)
        self.sin_k = self.sin.narrow(1, qd, kd).view(B, nKV, D)
        self.q = new(B, qd)
        self.k = new(B, nKV, D)  # the rotated keys of the step, before they go into the cache
        self.q3 = self.q.view(B * nKV, nH // nKV, D)  # heads j*g..j*g+g-1 read KV head j
        self.attn = new(B * nKV, nH // nKV, D)
        self.attn2 = self.attn.view(B, qd)
        inter = d.layers[0].inter
        self.gate_up = new(B, 2 * inter)
        self.gate, self.up = self.gate_up.narrow(1, 0, inter), self.gate_up.narrow(1, inter, inter)
        self.n = new(B, d.embed.shape[1])
        self.rms = new(B, 1, 1, dtype=torch.float32)

    def normed(self, x: Tensor) -> Tensor:
        """``_normed(x)`` into the workspace (float32; other dtypes take the allocating path)."""
        if x.dtype != torch.float32:
            return _normed(x, self.eps)
        torch.baddbmm(self.eps, x[:, None, :], x[:, :, None], alpha=1.0 / x.shape[-1], out=self.rms)
        return torch.mul(x, self.rms.rsqrt_().view(-1, 1), out=self.n)
