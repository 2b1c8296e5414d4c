"""The memory terms of a plan: what each part of a run holds on a GPU or on its node's host.

Every term is per GPU (one rank), in GiB (2^30 bytes), with the formula it came from. With N
parameters, P trainable (N, or LoRA's adapters), S ranks sharing a shard (``fsdp2``: W/replicas;
``ddp``: 1), b bytes per parameter (``model.dtype``; LoRA's adapters are fp32, as peft keeps them),
c bytes per activation (2 with ``trainer.bf16`` or bf16 weights, else 4), t =
``micro_batch_size`` × ``max_episode_tokens`` tokens per micro-batch, e bytes per engine value
(``rollout.dtype``, else ``model.dtype``):

The trainer's budget (or the whole GPU's):

- weights N·b/S; gradients P·b/S; AdamW's two moments 2·P·b/S (on the host with ``cpu_offload``);
- FSDP2: the gathered parameters of two layers (the one computing and the one prefetched) and of
  the root (embeddings, head), in c bytes; with ``grad_reduce: step`` and more than one micro-batch
  per optimizer step, the unsharded fp32 gradients accumulated between reductions, 4·P;
- DDP over several ranks: its gradient buckets, P·b; autocast (``trainer.bf16`` with fp32 weights
  outside FSDP2): the bf16 copies of the weights the backward keeps, 2·N;
- activations per micro-batch, per token and layer: 16h + c·(k·h + 2·kv + 4·i) + 4·heads bytes, the
  tensors autograd saves in a Qwen2/Llama layer: each RMSNorm's fp32 input and normalised output
  (16h), the projections' inputs (k = 4: q/k/v share one, attention output, MLP input; autocast
  casts per projection, so k = 7), rotated q and k, v, the attention output, and the MLP's gate,
  up, SiLU and product (4i), plus the attention's log-sum-exp. With gradient checkpointing only each
  layer's input stays, r·h (r = 4 for an fp32 residual stream, 2 for bf16), plus one layer
  recomputed in the backward. The logits and their gradient: t·V·2c (the log-softmax runs in
  checkpointed chunks); with the head applied in chunks (``trainer.chunked_head``: from a 32 k
  vocabulary, outside FSDP2) only one chunk's exist, min(t, ⌊2²³/V⌋)·V·4·k, k = ``CHUNK_COPIES``;
- the KL reference (``kl_coef`` > 0; not with LoRA, whose reference is the base itself): N·b/S;
- the colocated HF engine (same budget): ``engine_terms.py``;
- a fixed 2 GiB for the CUDA context, NCCL buffers and the allocator's slack.

Activations are an estimate (tests/plan/test_plan.py checks the formula against the tensors autograd
actually saves, on the CPU); the rest is counted. docs/scaling.md shows the terms for configs/gpu.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from agentrl.algorithms.token_stats import default_chunk
from agentrl.config import Config
from agentrl.parallel.sharding import check_mesh
from agentrl.plan.architecture import Architecture

GIB = 2**30


OVERHEAD_GIB = 2.0


@dataclass
class Term:
    name: str
    bytes: float
    how: str

    @property
    def gib(self) -> float:
        return self.bytes / GIB


def dtype_bytes(dtype: str | None) -> int:
    return 2 if dtype in ("bfloat16", "float16") else 4


def activation_bytes(a: Architecture, c: int, k: int) -> int:
    """Bytes autograd keeps per token in one decoder layer (module docstring): c bytes per
    activation, k projection inputs of width h (4, or 7 under autocast)."""
    return 16 * a.hidden + c * (k * a.hidden + 2 * a.kv_dim + 4 * a.intermediate) + 4 * a.heads


@dataclass(frozen=True)
class Sizes:
    """The quantities the terms' formulas use (the module docstring names them)."""

    N: int  # parameters
    P: int  # trainable parameters
    S: int  # ranks sharing a shard
    b: int  # bytes per parameter
    pb: int  # bytes per trainable parameter
    c: int  # bytes per activation
    e: int  # bytes per engine value
    ctx: int  # rollout.max_episode_tokens
    tokens: int  # per micro-batch
    episodes: int  # per step
    micros: int  # micro-batches per optimizer step per rank
    world: int
    fsdp: bool
    offload: bool
    autocast: bool
    residual: int  # bytes per value of the residual stream


def sizes(cfg: Config, a: Architecture, ranks_per_node: int, nodes: int) -> Sizes:
    """The quantities of ``cfg`` on ``nodes`` × ``ranks_per_node`` trainer ranks; refuses a mesh HSDP
    cannot build."""
    from agentrl.training import lora

    t, r = cfg.trainer, cfg.rollout
    world = ranks_per_node * nodes
    fsdp = t.strategy == "fsdp2"
    if fsdp:
        check_mesh(world, t.fsdp.replicas)
    b = dtype_bytes(cfg.model.dtype)
    # trainer.bf16=auto is decided on the machine at the start (assembly/precision.py); it may take bf16
    # only with the importance correction on, so the plan counts bf16 exactly then
    bf16 = t.bf16 is True or (t.bf16 == "auto" and cfg.algorithm.is_correction == "tis")
    episodes = r.prompts_per_step * r.group_size
    rows = math.ceil(episodes / t.mini_batches_per_step / world)  # per rank per optimizer step
    return Sizes(
        N=a.params,
        P=a.lora_params if lora.enabled(cfg.model.lora) else a.params,
        S=world // t.fsdp.replicas if fsdp else 1,
        b=b,
        pb=4 if lora.enabled(cfg.model.lora) else b,
        c=2 if bf16 or b == 2 else 4,
        e=dtype_bytes(r.dtype or cfg.model.dtype),
        ctx=r.max_episode_tokens,
        tokens=t.micro_batch_size * r.max_episode_tokens,
        episodes=episodes,
        micros=math.ceil(rows / t.micro_batch_size),
        world=world,
        fsdp=fsdp,
        offload=fsdp and t.fsdp.cpu_offload,
        autocast=bf16 and b == 4 and not fsdp,  # FSDP2 computes in bf16 through its mixed precision
        residual=2 if b == 2 or (fsdp and bf16) else 4,
    )


def _state_terms(cfg: Config, s: Sizes) -> list[Term]:
    """The policy's weights, gradients and AdamW moments, each sharded 1/S."""
    N, P, S, b, pb = s.N, s.P, s.S, s.b, s.pb
    shard = f"/{S}" if S > 1 else ""
    return [
        Term(
            f"policy weights ({cfg.model.dtype}{', 1' + shard if shard else ''})",
            N * b / S,
            f"N·b/S = {N:,}·{b}/{S}",
        ),
        Term("gradients" + (f" (1{shard})" if shard else ""), P * pb / S, f"P·b/S = {P:,}·{pb}/{S}"),
        Term(
            "AdamW moments" + (f" (1{shard})" if shard else ""),
            2 * P * pb / S,
            f"2·P·b/S = 2·{P:,}·{pb}/{S}",
        ),
    ]


def _strategy_terms(cfg: Config, a: Architecture, s: Sizes) -> list[Term]:
    """What FSDP2 gathers and accumulates, or what DDP and autocast add."""
    t, N, P, c = cfg.trainer, s.N, s.P, s.c
    if not s.fsdp:
        terms = [Term("DDP gradient buckets", P * s.pb, f"P·b = {P:,}·{s.pb}")] if s.world > 1 else []
        if s.autocast:
            terms.append(Term("bf16 weight copies (autocast)", 2 * N, f"2·N = 2·{N:,}"))
        return terms
    if t.fsdp.reshard_after_forward:
        terms = [
            Term(
                "gathered parameters (FSDP2)",
                (2 * a.layer_params + a.root_params) * c,
                f"(2 layers + root)·c = (2·{a.layer_params:,} + {a.root_params:,})·{c}",
            )
        ]
    else:  # every layer stays gathered from its forward to its backward
        terms = [Term("gathered parameters (FSDP2, no reshard)", N * c, f"N·c = {N:,}·{c}")]
    if t.fsdp.grad_reduce == "step" and s.micros > 1:
        terms.append(
            Term(
                "unsharded gradient accumulation",
                4 * P,
                f"4·P, {s.micros} micro-batches per reduction (trainer.fsdp.grad_reduce=micro_batch avoids it)",
            )
        )
    return terms


def _compute_terms(cfg: Config, a: Architecture, s: Sizes) -> list[Term]:
    """One micro-batch's activations, and its logits with their gradient."""
    tokens, c = s.tokens, s.c
    k = 7 if s.autocast else 4
    per_token_layer = activation_bytes(a, c, k)
    if cfg.model.gradient_checkpointing:
        act = tokens * (a.layers * s.residual * a.hidden + per_token_layer)
        how = f"t·(L·r·h + one layer) = {tokens:,}·({a.layers}·{s.residual}·{a.hidden} + {per_token_layer:,})"
    else:
        act = tokens * a.layers * per_token_layer
        how = f"t·L·(16h + c·({k}h+2kv+4i) + 4·heads) = {tokens:,}·{a.layers}·{per_token_layer:,}"
    if chunked_head(cfg, a.vocab):
        rows = min(tokens, default_chunk(a.vocab))
        logits = Term(
            "logits (the head in chunks)",
            rows * a.vocab * 4 * CHUNK_COPIES,
            f"min(t, ⌊2²³/V⌋)·V·4·{CHUNK_COPIES} = {rows:,}·{a.vocab:,}·{4 * CHUNK_COPIES}",
        )
    else:
        logits = Term(
            "logits and their gradient", tokens * a.vocab * 2 * c, f"t·V·2c = {tokens:,}·{a.vocab:,}·{2 * c}"
        )
    return [Term("activations (one micro-batch)", act, how), logits]


CHUNK_COPIES = 7
"""fp32 [rows, V] tensors counted for one chunk of the head at its peak (its logits, the softmax
and its product with the logits, the gradients in the backward), bounded from above by the
measurement in docs/performance.md#log-probs-and-entropy-at-a-real-vocabulary-the-head-in-chunks-benchlogits_memorypy."""


def chunked_head(cfg: Config, vocab: int) -> bool:
    """Whether the update applies the output head in chunks (``trainer.chunked_head``; the learner's
    ``Passes.chunked_head`` decides the same from the model itself)."""
    from agentrl.training.passes import CHUNKED_HEAD_VOCAB

    t, lora = cfg.trainer, cfg.model.lora
    possible = t.strategy != "fsdp2" and not (lora.rank > 0 and "lm_head" in lora.target_modules)
    if t.chunked_head == "always":
        return True
    return t.chunked_head == "auto" and possible and vocab >= CHUNKED_HEAD_VOCAB


def trainer_terms(cfg: Config, a: Architecture, s: Sizes, engine: list[Term]) -> list[Term]:
    """Every term the trainer's process holds on its GPU, ``engine`` the terms of an engine that lives
    there (the colocated HF engine's)."""
    from agentrl.training import lora

    terms = [] if s.offload else _state_terms(cfg, s)
    terms += _strategy_terms(cfg, a, s) + _compute_terms(cfg, a, s)
    if cfg.algorithm.kl_coef > 0 and not (lora.enabled(cfg.model.lora) and not cfg.model.ref_path):
        terms.append(Term("KL reference weights", s.N * s.b / s.S, f"N·b/S = {s.N:,}·{s.b}/{s.S}"))
    terms += engine
    per_token = BATCH_BYTES_PER_TOKEN + (4 if cfg.algorithm.kl_coef > 0 else 0)
    terms.append(
        Term(
            "the step's batch (every rank holds all of it)",
            s.episodes * s.ctx * per_token,
            f"B·ctx·{per_token} = {s.episodes:,}·{s.ctx:,}·{per_token} (ids, masks, log-probs, statistics, "
            "token weights; whole-batch statistics need every row)",
        )
    )
    terms.append(Term("CUDA context, NCCL, allocator slack", OVERHEAD_GIB * GIB, "fixed"))
    return terms


BATCH_BYTES_PER_TOKEN = 31
"""Bytes of the step's [B, T] tensors per token on every rank's device: the batch's ids (8), loss mask
(4), engine log-probs (4) and three flags (3), and the whole batch's π_old log-probs and entropies (8)
and token weights (4); the KL reference's log-probs add 4 (``training/batch.py``, ``learner.py``)."""


EPISODE_BYTES_PER_TOKEN = 72
"""Host bytes per token of a step's episodes as every rank holds them after the gather (Python ints and
floats in lists), rounded up from docs/performance.md#host-memory-of-a-steps-episodes-benchepisode_memorypy."""


def host_terms(cfg: Config, s: Sizes, gpus: int) -> list[Term]:
    """Host memory per node: offloaded states of the node's ranks, and rank 0's read of the weights
    (one process, or FSDP2 with LoRA, whose rank 0 broadcasts; otherwise every rank reads only its
    own shards, ``parallel/shard_reads.py``)."""
    host = []
    if s.offload:
        host += [
            Term(t.name + " [offloaded]", t.bytes * gpus, f"({t.how})·{gpus} ranks")
            for t in _state_terms(cfg, s)
        ]
    from agentrl.training import lora

    if s.world == 1 or (s.fsdp and lora.enabled(cfg.model.lora)):  # else each rank reads only its own shards
        host.append(Term("rank 0 reads the weights once", s.N * s.b, f"N·b = {s.N:,}·{s.b} (node 0 only)"))
    host.append(
        Term(
            "the step's episodes on every rank (at most)",
            gpus * s.episodes * s.ctx * EPISODE_BYTES_PER_TOKEN,
            f"ranks·B·ctx·{EPISODE_BYTES_PER_TOKEN} = {gpus}·{s.episodes:,}·{s.ctx:,}·{EPISODE_BYTES_PER_TOKEN} "
            "(every rank gathers every episode; episodes shorter than ctx hold less)",
        )
    )
    return host
