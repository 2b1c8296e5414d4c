"""The engines' memory terms (``terms.py`` names the quantities).

A colocated HF engine, in the trainer's budget: its copy of the weights, N·e, and the KV cache of its
running sequences, q·ctx·L·2·kv·e with q = min(``max_concurrent_episodes``, episodes per rank)
(the engine decodes together as many rows as its KV budget, half the GPU's free memory, holds).
For an architecture its lean step reproduces (Qwen2, Llama: its default on CUDA) the engine also
keeps the packed weights, (L·(layer + (heads + kv_heads)·head_dim·h) + V·h)·e (the rotated q and
k columns, a head of its own), and decodes in the arenas of its kept CUDA graphs
(engines/decode_graphs.py) instead: R rows and C columns, q and ctx rounded up to powers of two
(C at least 128), two arenas kept, the second of other columns, so at most 1.5·R·C·L·2·kv·e,
and beside it the arenas' sampling state, 2·R·4·V + 1.5·R·C·(20 + kv_heads·e) (float32 logits;
per column float64 draws, int64 tokens, float32 log-probs, an attention bias per KV head);
the weight sync streams one tensor at a time into it, so its transient is the largest
tensor in e bytes.

The colocated vLLM engine's budget, u·GPU, with tp = ``rollout.vllm.tensor_parallel_size`` GPUs
per engine (tp must divide a node's GPUs: an engine's GPUs are on one node):

- its weights, N·e/tp (tensor parallelism splits every projection, the embeddings and the head);
- its minimum KV cache: one sequence of ctx = ``max_episode_tokens`` tokens, ctx·L·2·⌈kv_heads/tp⌉·
  head_dim·e. vLLM refuses to start unless its KV cache holds one sequence of its ``max_model_len``,
  which the engine sets to ctx, the longest sequence a rollout makes; a GPU holds ⌈kv_heads/tp⌉ KV heads (vLLM
  replicates them when tp exceeds them). Whatever the share has beyond these two becomes more KV
  cache, i.e. more sequences decoded at once, which is throughput, not a condition to start;
- not counted: vLLM's own working memory (the activations of its profiling forward pass and CUDA
  graphs), which depend on its version, ``max_num_batched_tokens`` and ``enforce_eager``; no one
  number holds for them, so the engine's check is a lower bound and a share that only just holds
  may still be too small.
"""

from __future__ import annotations

import math

from agentrl.config import Config
from agentrl.plan.architecture import Architecture
from agentrl.plan.terms import Sizes, Term


def colocated_hf_terms(cfg: Config, a: Architecture, s: Sizes) -> list[Term]:
    """The in-process HF engine: its weights, its running sequences' KV cache, the sync's transient."""
    r, e = cfg.rollout, s.e
    seqs = min(r.max_concurrent_episodes, math.ceil(s.episodes / s.world))  # all decode together
    sync = Term(
        "weight sync (streamed)", a.largest_tensor * e, f"largest tensor·e = {a.largest_tensor:,}·{e}"
    )
    return [*hf_engine_terms(a, s, seqs, r.dtype or cfg.model.dtype), sync]


def hf_engine_terms(a: Architecture, s: Sizes, seqs: int, dtype: str) -> list[Term]:
    """An HF engine on a GPU decoding ``seqs`` sequences together (module docstring): its weights,
    and for an architecture its lean step reproduces (its default on CUDA) the packed copy of them
    and the KV arenas its kept CUDA graphs decode in, else the KV cache of its running sequences."""
    from agentrl.engines.decode_graphs import MAX_ARENAS, columns_bucket, rows_bucket

    e, per_column = s.e, a.layers * 2 * a.kv_dim * s.e
    terms = [Term(f"HF engine weights ({dtype})", s.N * e, f"N·e = {s.N:,}·{e}")]
    if not a.lean:
        how = f"q·ctx·L·2·kv·e = {seqs}·{s.ctx}·{a.layers}·2·{a.kv_dim}·{e}"
        return [*terms, Term("HF engine KV cache", seqs * s.ctx * per_column, how)]
    rotated = (a.heads + a.kv_heads) * a.head_dim * a.hidden
    packed = a.layers * (a.layer_params + rotated) + a.vocab * a.hidden
    rows, columns = rows_bucket(seqs), columns_bucket(s.ctx)
    more = sum(0.5**k for k in range(MAX_ARENAS))  # the kept arenas have different columns: C, C/2, ...
    return [
        *terms,
        Term(
            "HF engine packed weights (lean step)",
            packed * e,
            f"(L·(layer + (heads+kv_heads)·head_dim·h) + V·h)·e = ({a.layers}·({a.layer_params:,} + {rotated:,}) "
            f"+ {a.vocab:,}·{a.hidden})·{e}",
        ),
        Term(
            "HF engine KV cache (CUDA graph arenas)",
            more * rows * columns * per_column,
            f"{more:g}·R·C·L·2·kv·e = {more:g}·{rows}·{columns}·{a.layers}·2·{a.kv_dim}·{e} (R: q = {seqs} "
            f"rounded up to a power of two; C: ctx = {s.ctx} rounded up, at least 128; {MAX_ARENAS} arenas kept)",
        ),
        Term(
            "HF engine sampling state (CUDA graph arenas)",
            MAX_ARENAS * rows * 4 * a.vocab + more * rows * columns * (20 + a.kv_heads * e),
            f"{MAX_ARENAS}·R·4·V + {more:g}·R·C·(20 + kv_heads·e) = {MAX_ARENAS}·{rows}·4·{a.vocab:,} + "
            f"{more:g}·{rows}·{columns}·(20 + {a.kv_heads}·{e}) (each arena's float32 logits; per column its "
            "draws, tokens, log-probs and attention bias)",
        ),
    ]


def vllm_engine_terms(a: Architecture, e: int, ctx: int, tp: int, dtype: str) -> list[Term]:
    """A colocated vLLM engine's per-GPU needs before it starts: its weights split over tp GPUs,
    and a KV cache for one sequence of ctx tokens (module docstring: why this minimum)."""
    heads = math.ceil(a.kv_heads / tp)  # vLLM replicates the KV heads when tp exceeds them
    return [
        Term(f"vLLM weights ({dtype}, 1/{tp})", a.params * e / tp, f"N·e/tp = {a.params:,}·{e}/{tp}"),
        Term(
            f"vLLM KV cache (one {ctx:,}-token sequence)",
            ctx * a.layers * 2 * heads * a.head_dim * e,
            f"ctx·L·2·⌈kv_heads/tp⌉·head_dim·e = {ctx:,}·{a.layers}·2·{heads}·{a.head_dim}·{e}",
        ),
    ]
