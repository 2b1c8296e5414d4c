"""Per-token log-probs of the taken tokens and full-vocabulary entropy, in bounded memory.

Two entry points:
- ``token_logprobs_and_entropy(logits, token_ids, ...)``: the model already produced logits
  [B, T, V] (tiny models, vocab ~1k). The float32 log-softmax is computed ``chunk_size`` rows
  (positions) at a time, so the extra memory is chunk_size × V floats instead of B × T × V.
- ``token_logprobs_and_entropy_from_hidden(hidden, lm_head_weight, token_ids, ...)``: for large
  vocabularies (150k) the caller stops before the LM head and passes the last hidden states
  [B, T, D]; logits exist only one chunk at a time, and never for the whole batch.

When autograd is on, the backward also holds one chunk of logits at a time, at the cost of
recomputing that chunk: the logits path wraps each chunk in activation checkpointing; the hidden-state
path is one autograd function (``_HeadStats``) with the gradient written out, which keeps no [N, V]
tensor between the passes and makes fewer passes over each chunk than autograd's softmax,
log-sum-exp and product would. Both return float32 tensors [B, T]. ``token_ids[b, t]`` must be the token *at* the position the logits row predicts,
i.e. the caller shifts (logits[:, :-1] predict ids[:, 1:]) before calling.

Entropy is in nats of softmax(logits / temperature), matching the sampling distribution.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

CHUNK_ELEMENTS = 1 << 23
"""Default chunk: ~8 M logits (32 MB in float32) per temporary, e.g. 8192 positions at vocab 1k,
256 at 32k, 55 at 150k: cache-sized temporaries, faster than larger chunks
(docs/algorithms.md#weighting-overhead--benchweighting_overheadpy)."""


def default_chunk(vocab: int) -> int:
    return max(1, CHUNK_ELEMENTS // max(vocab, 1))


def _stats_from_logits(logits: Tensor, ids: Tensor, temperature: float) -> tuple[Tensor, Tensor]:
    """Rows of logits [N, V] -> (logp of ids [N], entropy [N]), float32."""
    z = logits.float()  # [N, V]
    if temperature != 1.0:
        z = z / temperature
    log_z = torch.logsumexp(z, dim=-1)  # [N]
    logp = z.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - log_z  # [N]
    probs = torch.softmax(z, dim=-1)
    entropy = log_z - (probs * z).sum(-1)  # H = logZ - E_p[z]
    return logp, entropy


def _chunked(fn, rows: Tensor, ids: Tensor, chunk_size: int, *args) -> tuple[Tensor, Tensor]:
    """fn(rows_chunk, ids_chunk, *args) over row chunks; checkpointed when a gradient will flow back
    and there is more than one chunk (peak memory is then one chunk's activations)."""
    needs_grad = torch.is_grad_enabled() and (
        rows.requires_grad or any(isinstance(a, Tensor) and a.requires_grad for a in args)
    )
    # one chunk: nothing to bound, so keep the chunk's activations rather than recompute them
    needs_grad = needs_grad and rows.shape[0] > chunk_size
    logps, ents = [], []
    # split (not slicing in a loop): its backward concatenates the chunk gradients once, where
    # per-slice backward would write a full-size zero gradient for every chunk.
    for r, i in zip(rows.split(chunk_size), ids.split(chunk_size)):
        if needs_grad:
            lp, h = checkpoint(fn, r, i, *args, use_reentrant=False)
        else:
            lp, h = fn(r, i, *args)
        logps.append(lp)
        ents.append(h)
    if not logps:
        empty = rows.new_zeros(0, dtype=torch.float32)
        return empty, empty
    return torch.cat(logps), torch.cat(ents)


def token_logprobs_and_entropy(
    logits: Tensor, token_ids: Tensor, temperature: float = 1.0, chunk_size: int | None = None
) -> tuple[Tensor, Tensor]:
    """logits [B, T, V], token_ids [B, T] -> (logp [B, T], entropy [B, T]), float32, chunked over B·T.

    ``chunk_size`` = positions per chunk (default: ~8 M logits per chunk, see ``CHUNK_ELEMENTS``).
    """
    b, t, v = logits.shape
    chunk_size = chunk_size or default_chunk(v)
    logp, ent = _chunked(
        _stats_from_logits, logits.reshape(b * t, v), token_ids.reshape(b * t), chunk_size, temperature
    )  # [B·T] each
    return logp.reshape(b, t), ent.reshape(b, t)


def _head_logits(hidden: Tensor, weight: Tensor, bias: Tensor | None, temperature: float) -> Tensor:
    """One chunk's logits [n, V] in float32, divided by the temperature."""
    z = F.linear(hidden, weight, bias).float()
    return z if temperature == 1.0 else z.div_(temperature)


def _softmax_moments(z: Tensor) -> tuple[Tensor, Tensor]:
    """log Z and E_p[z] [n] of the rows of z [n, V] under p = softmax(z): one exp, two reductions.

    The mean is of z - max z, summed by torch's reduction: a ``bmm`` dot product of e_v and z_v
    accumulates in float32 without pairing, which loses the entropy's precision at a large
    vocabulary (Gemma 3's: docs/models-and-engines.md)."""
    m = z.amax(-1, keepdim=True)
    shifted = torch.sub(z, m)
    e = shifted.exp()
    s = e.sum(-1)
    ez = shifted.mul_(e).sum(-1)  # sum_v e_v (z_v - m), float32 (z is), in shifted's memory
    m = m.view(-1)
    return m + s.log(), m + ez / s


class _HeadStats(torch.autograd.Function):
    """(log p of ids, entropy) [N] of softmax((hidden @ weight.T + bias) / T), ``chunk`` rows of
    hidden at a time, with the gradient written out. With z the scaled logits, p = softmax(z) and
    E = E_p[z]: log p_id = z_id - log Z and H = log Z - E, so

        d log p_id / dz = onehot(id) - p,        dH / dz = -p * (z - E),

    and the backward recomputes each chunk's z from the saved hidden states (as checkpointing
    would), forms dL/dz = onehot * g_logp - p * (g_logp + g_H * (z - E)) in place, divides by T and
    multiplies back through the head. Nothing of size [N, V] is kept between the passes. Under
    autocast the backward runs under the forward's autocast state, as the head's products did."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, ids, temperature, chunk):  # type: ignore[override]
        lps, ents, lses, means = [], [], [], []
        for h, i in zip(hidden.split(chunk), ids.split(chunk)):
            z = _head_logits(h, weight, bias, temperature)
            lse, mean = _softmax_moments(z)
            lps.append(z.gather(-1, i.unsqueeze(-1)).view(-1) - lse)
            ents.append(lse - mean)
            lses.append(lse)
            means.append(mean)
        lse, mean = torch.cat(lses), torch.cat(means)
        ctx.save_for_backward(hidden, weight, bias, ids, lse, mean)
        ctx.temperature, ctx.chunk = temperature, chunk
        device = hidden.device.type
        ctx.autocast = (torch.is_autocast_enabled(device), torch.get_autocast_dtype(device), device)
        return torch.cat(lps), torch.cat(ents)

    @staticmethod
    def backward(ctx, g_logp, g_ent):  # type: ignore[override]
        hidden, weight, bias, ids, lse, mean = ctx.saved_tensors
        enabled, dtype, device = ctx.autocast
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros_like(weight) if need_w else None
        grad_b = torch.zeros_like(bias) if need_b else None
        g_logp = g_logp if g_logp is not None else torch.zeros_like(lse)
        g_ent = g_ent if g_ent is not None else torch.zeros_like(lse)
        with torch.autocast(device, dtype=dtype, enabled=enabled):
            for start in range(0, hidden.shape[0], ctx.chunk):
                rows = slice(start, start + ctx.chunk)
                h, gl, ge = hidden[rows], g_logp[rows].unsqueeze(-1), g_ent[rows].unsqueeze(-1)
                z = _head_logits(h, weight, bias, ctx.temperature)
                p = torch.sub(z, lse[rows].unsqueeze(-1)).exp_()
                gz = z.sub_(mean[rows].unsqueeze(-1)).mul_(ge).add_(gl).mul_(p).neg_()  # in z's memory
                gz.scatter_add_(-1, ids[rows].unsqueeze(-1), gl)
                if ctx.temperature != 1.0:
                    gz.div_(ctx.temperature)
                gz = gz.to(weight.dtype)
                if grad_h is not None:
                    grad_h[rows] = gz @ weight
                if grad_w is not None:
                    grad_w += (gz.t() @ h).to(weight.dtype)
                if grad_b is not None:
                    grad_b += gz.sum(0).to(bias.dtype)
        return grad_h, grad_w, grad_b, None, None, None


def token_logprobs_and_entropy_from_hidden(
    hidden: Tensor,
    lm_head_weight: Tensor,
    token_ids: Tensor,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    lm_head_bias: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """hidden [B, T, D], lm_head_weight [V, D], token_ids [B, T] -> (logp, entropy) [B, T] float32.

    Logits are formed chunk by chunk, so peak extra memory is chunk_size × V (forward and backward).
    """
    b, t, d = hidden.shape
    chunk_size = chunk_size or default_chunk(lm_head_weight.shape[0])
    if b * t == 0:
        empty = hidden.new_zeros((b, t), dtype=torch.float32)
        return empty, empty
    logp, ent = _HeadStats.apply(
        hidden.reshape(b * t, d),
        lm_head_weight,
        lm_head_bias,
        token_ids.reshape(b * t),
        temperature,
        chunk_size,
    )
    return logp.reshape(b, t), ent.reshape(b, t)


def _phi_from(z: Tensor, ids: Tensor, lse: Tensor, ent: Tensor) -> tuple[Tensor, Tensor]:
    """(log p of ids, φ of ids) [n] of the rows of z [n, V] (scaled logits, float32), given their
    log Z and H: φ_a = π_a (H + log π_a) - Σ_j π_j² (H + log π_j) (``entropy_theory.entropy_phi``),
    the second term from two more reductions over the vocabulary, Σ π² and Σ π² log π."""
    logp_all = z - lse.unsqueeze(-1)
    p2 = logp_all.exp().square_()
    kappa = ent * p2.sum(-1) + p2.mul_(logp_all).sum(-1)
    logp = logp_all.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    return logp, logp.exp() * (ent + logp) - kappa


def _phi_chunks(rows: Tensor, ids: Tensor, chunk: int, to_logits) -> tuple[Tensor, Tensor, Tensor]:
    """(logp, entropy, φ) [N] of rows [N, ·], ``chunk`` rows at a time; ``to_logits(rows_chunk)`` gives
    their scaled float32 logits [n, V]. No gradient."""
    out: list[list[Tensor]] = [[], [], []]
    with torch.no_grad():
        for r, i in zip(rows.split(chunk), ids.split(chunk)):
            z = to_logits(r)
            lse, mean = _softmax_moments(z)
            ent = lse - mean
            logp, phi = _phi_from(z, i, lse, ent)
            for acc, x in zip(out, (logp, ent, phi)):
                acc.append(x)
    if not out[0]:
        empty = rows.new_zeros(0, dtype=torch.float32)
        return empty, empty, empty
    logp, ent, phi = (torch.cat(x) for x in out)
    return logp, ent, phi


def token_stats_with_phi(
    logits: Tensor, token_ids: Tensor, temperature: float = 1.0, chunk_size: int | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """(logp, entropy, φ) [B, T] float32 from logits [B, T, V], no gradient: ``token_logprobs_and_entropy``
    plus each taken token's first-order entropy coefficient φ, from the same chunks of the same logits
    (the π_old pass of a STARE run; ``stare_balance``)."""
    b, t, v = logits.shape

    def scaled(z: Tensor) -> Tensor:
        return z.float() if temperature == 1.0 else z.float() / temperature

    out = _phi_chunks(
        logits.reshape(b * t, v), token_ids.reshape(b * t), chunk_size or default_chunk(v), scaled
    )
    return out[0].reshape(b, t), out[1].reshape(b, t), out[2].reshape(b, t)


def token_stats_with_phi_from_hidden(
    hidden: Tensor,
    lm_head_weight: Tensor,
    token_ids: Tensor,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    lm_head_bias: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """``token_stats_with_phi`` from the last hidden states [B, T, D], the head applied a chunk of
    positions at a time (as ``token_logprobs_and_entropy_from_hidden``), no gradient."""
    b, t, d = hidden.shape
    chunk = chunk_size or default_chunk(lm_head_weight.shape[0])
    out = _phi_chunks(
        hidden.reshape(b * t, d),
        token_ids.reshape(b * t),
        chunk,
        lambda h: _head_logits(h, lm_head_weight, lm_head_bias, temperature),
    )
    return out[0].reshape(b, t), out[1].reshape(b, t), out[2].reshape(b, t)


def entropy_from_logits(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Full-vocabulary entropy in nats over the last dim (unchunked; for small inputs and tests)."""
    z = logits.float() / temperature
    logp = torch.log_softmax(z, dim=-1)
    return -(logp.exp() * logp).sum(-1)
