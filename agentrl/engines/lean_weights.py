"""The lean decode step's weights, packed from a model once and repacked in place when its weights
change.

``_Layer`` packs one decoder layer for a [B, H] step (its docstring says how). ``PackedWeights`` holds
every layer's and the head's, and the key they were packed under: each parameter's address and
in-place version counter (``Tensor._version``, which every in-place write through the parameter
bumps: an optimizer step, ``copy_`` under ``no_grad`` as ``HFEngine.load_weights`` does). A batch
whose model still has that key reuses the packed tensors; otherwise ``refresh`` packs again, layer by
layer, and copies the result into the same tensors, so their addresses never change and a CUDA
graph that reads them (``decode_graphs.py``) stays valid across weight syncs.

What the key cannot see: a write through ``param.data`` (PyTorch gives ``.data`` its own version
counter) and a model whose parameters are inference tensors (they have no counter). The second is
detected and such a model is repacked at every batch; after the first, call ``refresh`` (or write
through the parameter, or ``load_weights``)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from agentrl.engines.cpu_gemm import Gemm

WeightsKey = tuple[tuple[int, int], ...]


def weights_key(model: torch.nn.Module) -> WeightsKey | None:
    """Each parameter's (address, in-place version): equal keys mean no parameter was moved or
    written in place since (module docstring for what it cannot see); None where a parameter has no
    version counter (an inference tensor), so the weights can never be assumed unchanged."""
    try:
        return tuple((p.data_ptr(), p._version) for p in model.parameters())
    except RuntimeError:  # "Inference tensors do not track version counter"
        return None


def half_swap(n_heads: int, head_dim: int, device: torch.device | str = "cpu") -> Tensor:
    """The column indices that swap the two halves of each head's columns, (a, b) -> (b, a): with the
    first half's sin negated (``LeanDecoder``'s rotary tables), ``y[:, half_swap] * sin`` is
    ``rotate_half(y) * sin`` exactly (the unfolded rotation, ``_Layer``)."""
    half = head_dim // 2
    within = torch.cat([torch.arange(half, head_dim), torch.arange(half)])
    return (torch.arange(n_heads)[:, None] * head_dim + within).flatten().to(device)


def _rotate_half_columns(y: Tensor, n_heads: int, head_dim: int) -> Tensor:
    """``rotate_half`` of each head's columns of y [., n_heads * head_dim]: (a, b) -> (-b, a) in
    each head's two halves. A signed permutation: exact, no product, no read of the device."""
    halves = y.unflatten(-1, (n_heads, 2, head_dim // 2))
    return torch.stack((-halves[..., 1, :], halves[..., 0, :]), dim=-2).flatten(-3)


class _Layer:
    """One decoder layer's weights packed for a [B, H] decode step, so a layer is a handful of calls:

    - every matrix is transposed to [in, out] and contiguous (a row-major GEMM against a
      pre-transposed weight is faster on CPU at these shapes than ``F.linear``: docs/performance.md#on-the-tiny-model), or, with
      ``rows`` set, packed for oneDNN (``cpu_gemm.Gemm``: ``rollout.cpu_gemm: onednn``);
    - one GEMM gives q, k and v; with ``fold_rotation`` (on CUDA) also rotate_half(q) and
      rotate_half(k): rotate_half permutes and negates columns, so the weight carries the q and k
      columns a second time, rotated (``_rotate_half_columns``), and rotary embedding becomes
      ``qk * cos + qk_rotated * sin``. Without it (on the CPU) the step swaps the halves of q and k
      (``half_swap``, one ``index_select``) and the sin table carries the sign: the same numbers
      without the extra columns (faster for a FLOP-bound CPU step: docs/performance.md#the-decode-step-on-the-cpu-against-its-roofline),
      while on a GPU a step is bound by its kernel launches and
      the folded GEMM saves one;
    - each RMSNorm's weight w is folded into the rows of the matrix that reads the normed vector
      (``(w * n) @ W == n @ (w[:, None] * W)``), so a norm is ``x * rsqrt(mean(x^2) + eps)``.

    Exact in real arithmetic; in float32 the rounding differs from ``transformers`` by ~1e-6
    relative (parity is tested)."""

    def __init__(
        self, layer: Any, n_heads: int, n_kv: int, head_dim: int, rows: int | None, fold_rotation: bool
    ) -> None:
        a, m = layer.self_attn, layer.mlp
        w1, w2 = layer.input_layernorm.weight, layer.post_attention_layernorm.weight
        projs = (a.q_proj, a.k_proj, a.v_proj)
        bias = [p.bias if p.bias is not None else p.weight.new_zeros(p.weight.shape[0]) for p in projs]
        qk_t = torch.cat([a.q_proj.weight, a.k_proj.weight]).t()  # [H, (nH + kvH) D]
        qk_b = torch.cat(bias[:2])
        columns, biases = [qk_t, a.v_proj.weight.t()], [qk_b, bias[2]]
        if fold_rotation:
            columns.append(_rotate_half_columns(qk_t, n_heads + n_kv, head_dim))
            biases.append(_rotate_half_columns(qk_b, n_heads + n_kv, head_dim))
        qkv_t = (w1[:, None] * torch.cat(columns, dim=1)).contiguous()
        self.qkv = Gemm(qkv_t, torch.cat(biases), rows)
        self.fold_rotation = fold_rotation
        o_b = a.o_proj.bias.clone() if a.o_proj.bias is not None else None  # its own: refreshed in place
        self.o = Gemm(a.o_proj.weight.t().contiguous(), o_b, rows)
        gate_up_t = (w2[:, None] * torch.cat([m.gate_proj.weight, m.up_proj.weight]).t()).contiguous()
        self.gate_up = Gemm(gate_up_t, None, rows)
        self.down = Gemm(m.down_proj.weight.t().contiguous(), None, rows)
        self.qkv_width, self.inter = qkv_t.shape[1], gate_up_t.shape[1] // 2
        act = type(m.act_fn).__name__
        silu = act in ("SiLU", "SiLUActivation")
        self.act = (lambda x: F.silu(x, inplace=True)) if silu else m.act_fn  # x: workspace scratch

    def gemms(self) -> tuple[Gemm, ...]:
        return self.qkv, self.o, self.gate_up, self.down


class PackedWeights:
    """Every layer's packed weights (``_Layer``) and the head's (the final norm folded in) for
    ``model``, products through MKL (``rows`` None) or oneDNN packed for about ``rows`` rows, and the
    key they were packed under (module docstring). The embedding and the head's bias are the model's
    own tensors, read where they are."""

    def __init__(
        self, model: torch.nn.Module, rows: int | None = None, fold_rotation: bool | None = None
    ) -> None:
        m: Any = model  # a Qwen2/LlamaForCausalLM (lean_decode.supports checked by the caller)
        cfg, inner = m.config, m.model
        self.rows = rows
        self.fold_rotation = (
            inner.embed_tokens.weight.device.type == "cuda" if fold_rotation is None else fold_rotation
        )
        """rotate_half folded into the q/k GEMM (``_Layer``): on CUDA unless told otherwise."""
        self.shape = (cfg.num_attention_heads, cfg.num_key_value_heads, inner.layers[0].self_attn.head_dim)
        self.key = weights_key(model)
        self.layers = [_Layer(layer, *self.shape, rows, self.fold_rotation) for layer in inner.layers]
        self.head = self._head(m)
        self.embed: Tensor = inner.embed_tokens.weight
        self.head_b: Tensor | None = getattr(m.lm_head, "bias", None)

    def _head(self, m: Any) -> Gemm:
        w = m.model.norm.weight
        return Gemm((w[:, None] * m.lm_head.weight.t()).contiguous(), None, self.rows)

    def current(self, model: torch.nn.Module) -> bool:
        """Whether ``model``'s weights are the ones packed here (same addresses, no in-place write
        since): never for a model whose parameters have no version counter."""
        return self.key is not None and weights_key(model) == self.key

    def refresh(self, model: torch.nn.Module) -> None:
        """Pack ``model``'s weights again into the same tensors (same addresses), one layer at a time
        (the transient copy is one layer's). ``model`` must have the architecture packed here. Runs in
        inference mode: the engine makes its packed tensors inside ``generate``'s."""
        m: Any = model
        with torch.inference_mode():
            for packed, layer in zip(self.layers, m.model.layers):
                fresh = _Layer(layer, *self.shape, self.rows, self.fold_rotation)
                for old, new in zip(packed.gemms(), fresh.gemms()):
                    old.copy_from(new)
            self.head.copy_from(self._head(m))
        self.embed, self.head_b = m.model.embed_tokens.weight, getattr(m.lm_head, "bias", None)
        self.key = weights_key(model)
