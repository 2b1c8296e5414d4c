"""``agentrl plan``: the memory one GPU needs for a config, term by term, in the budget each term
must fit, and whether every budget holds.

The model's size comes from its config.json, counted on the meta device (``architecture.py``).

Budgets. A GPU is shared by components that do not borrow from each other, so a plan checks each
against its own share instead of one total against the whole GPU:

- a colocated vLLM engine (``rollout.engine: vllm``, ``rollout.workers: 0``) reserves
  ``rollout.vllm.gpu_memory_utilization`` × GPU at start (its KV cache then fills what its weights
  leave of that share), so two budgets: the engine's, u·GPU, holding its weights and its minimum KV
  cache; and the trainer's, (1 − u)·GPU, holding every other term. A trainer with room to spare
  cannot lend it to an engine whose weights overflow its share, and the other way round;
- the HF engine runs in the trainer's process and reserves nothing: one budget, the whole GPU;
- with ``rollout.workers`` > 0 the engines run in Ray workers on other GPUs: one budget, the whole
  GPU, for the trainer alone.
- with ``sft.enabled``, the SFT warm start, a phase before RL in one unsharded process per rank:
  one more budget, the whole GPU (``sft_budget``).

The plan fits when every budget holds. It does not credit ``rollout.colocate.sleep`` (the update
could then use the engine's freed share): the budgets are those of the generate phase, which the
sleep cycle does not change.

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
- the colocated HF engine (same budget): its copy of the weights, N·e, and the KV cache of its
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
  tensor in e bytes;
- a fixed 2 GiB for the CUDA context, NCCL buffers and the allocator's slack.

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

Activations are an estimate (tests/plan/test_plan.py checks the formula against the tensors autograd
actually saves, on the CPU); the rest is counted. docs/scaling.md shows the terms for configs/gpu.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from agentrl.algorithms.token_stats import default_chunk
from agentrl.config import Config
from agentrl.parallel.placement import Launch, Placement
from agentrl.parallel.placement import render as render_placement
from agentrl.parallel.sharding import check_mesh
from agentrl.plan.architecture import Architecture, architecture

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


@dataclass
class Budget:
    """One share of a GPU and the terms that must fit in it. ``reserved``: its owner takes the
    whole share whatever its terms add up to (vLLM's KV cache fills what its weights leave)."""

    name: str
    capacity_gib: float
    how: str
    terms: list[Term]
    reserved: bool = False

    @property
    def total_gib(self) -> float:
        return sum(t.gib for t in self.terms)

    @property
    def free_gib(self) -> float:
        return self.capacity_gib - self.total_gib

    @property
    def fits(self) -> bool:
        return self.total_gib <= self.capacity_gib

    @property
    def held_gib(self) -> float:
        """What this component occupies on the GPU."""
        return self.capacity_gib if self.reserved else self.total_gib


@dataclass
class Plan:
    arch: Architecture
    layout: str
    budgets: list[Budget]
    capacity_gib: float  # one GPU
    host: list[Term] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)  # settings that would make it fit, when it does not
    placement: Placement | None = None
    """Where every process lives (``parallel/placement.py``); its problems make the plan refuse."""
    worker_budgets: list[Budget] = field(default_factory=list)
    """The budgets of the most loaded GPU that holds rollout workers and no trainer rank."""

    @property
    def terms(self) -> list[Term]:
        return [t for b in self.budgets for t in b.terms]

    @property
    def total_gib(self) -> float:
        """What the GPU holds: the reserved shares in full, the other budgets' terms."""
        return sum(b.held_gib for b in self.budgets)

    @property
    def fits(self) -> bool:
        """Every budget holds, and the placement works."""
        placed = self.placement is None or self.placement.ok
        return placed and all(b.fits for b in self.budgets + self.worker_budgets)

    def budget(self, name: str) -> Budget:
        return next(b for b in self.budgets + self.worker_budgets if b.name == name)


def _bytes(dtype: str | None) -> int:
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
    b = _bytes(cfg.model.dtype)
    episodes = r.prompts_per_step * r.group_size
    rows = math.ceil(episodes / t.mini_batches_per_step / world)  # per rank per optimizer step
    return Sizes(
        N=a.params,
        P=a.lora_params if lora.enabled(cfg) else a.params,
        S=world // t.fsdp.replicas if fsdp else 1,
        b=b,
        pb=4 if lora.enabled(cfg) else b,
        c=2 if t.bf16 or b == 2 else 4,
        e=_bytes(r.dtype or cfg.model.dtype),
        ctx=r.max_episode_tokens,
        tokens=t.micro_batch_size * r.max_episode_tokens,
        episodes=episodes,
        micros=math.ceil(rows / t.micro_batch_size),
        world=world,
        fsdp=fsdp,
        offload=fsdp and t.fsdp.cpu_offload,
        autocast=t.bf16 and b == 4 and not fsdp,  # FSDP2 computes in bf16 through its mixed precision
        residual=2 if b == 2 or (fsdp and t.bf16) else 4,
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
and its product with the logits, the gradients in the backward): bench/logits_memory.py measured 5.1
to 6.1 of them (172 to 205 MB at V = 151,669), so 7 bounds it from above."""


def chunked_head(cfg: Config, vocab: int) -> bool:
    """Whether the update applies the output head in chunks (``trainer.chunked_head``; the learner's
    ``Passes.chunked_head`` decides the same from the model itself)."""
    from agentrl.training.passes import CHUNKED_HEAD_VOCAB

    t, lora = cfg.trainer, cfg.model.lora
    possible = t.strategy != "fsdp2" and not (lora.rank > 0 and "lm_head" in lora.target_modules)
    if t.chunked_head == "always":
        return True
    return t.chunked_head == "auto" and possible and vocab >= CHUNKED_HEAD_VOCAB


def _hf_engine_terms(cfg: Config, a: Architecture, s: Sizes) -> list[Term]:
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


def _trainer_terms(cfg: Config, a: Architecture, s: Sizes) -> list[Term]:
    """Every term the trainer's process holds on its GPU (the HF engine's included: it lives there)."""
    from agentrl.training import lora

    terms = [] if s.offload else _state_terms(cfg, s)
    terms += _strategy_terms(cfg, a, s) + _compute_terms(cfg, a, s)
    if cfg.algorithm.kl_coef > 0 and not (lora.enabled(cfg) and not cfg.model.ref_path):
        terms.append(Term("KL reference weights", s.N * s.b / s.S, f"N·b/S = {s.N:,}·{s.b}/{s.S}"))
    if cfg.rollout.engine == "hf" and cfg.rollout.workers == 0:
        terms += _hf_engine_terms(cfg, a, s)
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
floats in lists): ``bench/episode_memory.py`` measured 70.5-71.7."""


def sft_budget(cfg: Config, a: Architecture, gpu: float) -> Budget:
    """The SFT warm start (``sft.enabled``), before RL, in each trainer process on its own GPU with
    nothing sharded: the weights, the trained weights' gradients and AdamW moments (LoRA's adapters
    under ``sft.weights`` lora/auto, else all N), and one forward's activations and logits
    (``sft.micro_batch_size`` demonstrations, else the whole ``sft.batch_size``, of up to ctx tokens;
    with ``model.gradient_checkpointing`` each layer's input, as for RL)."""
    from agentrl.training.sft import trains_adapters

    b = _bytes(cfg.model.dtype)
    c = 2 if b == 2 else 4
    adapters = trains_adapters(cfg)
    P, pb = (a.lora_params, 4) if adapters else (a.params, b)
    what = "LoRA adapters, merged when SFT ends" if adapters else "every weight"
    micro = min(cfg.sft.micro_batch_size or cfg.sft.batch_size, cfg.sft.batch_size)
    tokens = micro * cfg.rollout.max_episode_tokens
    per_token_layer = activation_bytes(a, c, 4)
    if cfg.model.gradient_checkpointing:
        act = tokens * (a.layers * c * a.hidden + per_token_layer)
        how = f"t·(L·c·h + one layer) = {tokens:,}·({a.layers}·{c}·{a.hidden} + {per_token_layer:,})"
    else:
        act = tokens * a.layers * per_token_layer
        how = f"t·L·(per token and layer) = {tokens:,}·{a.layers}·{per_token_layer:,}"
    terms = [
        Term(f"weights ({cfg.model.dtype})", a.params * b, f"N·b = {a.params:,}·{b}"),
        Term(f"gradients ({what})", P * pb, f"P·b = {P:,}·{pb}"),
        Term("AdamW moments", 2 * P * pb, f"2·P·b = 2·{P:,}·{pb}"),
        Term(f"activations (one forward of {micro} demonstrations, t = {micro}·ctx)", act, how),
        Term(
            "logits and their gradient", tokens * a.vocab * 2 * c, f"t·V·2c = {tokens:,}·{a.vocab:,}·{2 * c}"
        ),
        Term("CUDA context, allocator slack", OVERHEAD_GIB * GIB, "fixed"),
    ]
    how = f"the whole GPU, before RL; sft.weights={cfg.sft.weights}: {what}"
    return Budget("SFT warm start", gpu, how, terms)


def _host_terms(cfg: Config, s: Sizes, gpus: int) -> list[Term]:
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

    if s.world == 1 or (s.fsdp and lora.enabled(cfg)):  # else each rank reads only its own shards
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


def _vllm_budgets(cfg: Config, a: Architecture, s: Sizes, trainer: list[Term], gpu: float) -> list[Budget]:
    """The colocated vLLM engine's share of the GPU, and the trainer's: the rest."""
    v = cfg.rollout.vllm
    u = v.gpu_memory_utilization
    dtype = cfg.rollout.dtype or cfg.model.dtype
    engine = Budget(
        "vLLM engine",
        u * gpu,
        f"gpu_memory_utilization·GPU = {u:g}·{gpu:g}",
        vllm_engine_terms(a, s.e, s.ctx, v.tensor_parallel_size, dtype),
        reserved=True,
    )
    rest = Budget(
        "trainer", gpu - engine.capacity_gib, f"(1 − gpu_memory_utilization)·GPU = {1 - u:g}·{gpu:g}", trainer
    )
    return [engine, rest]


def _utilization_hint(engine_gib: float, trainer_gib: float, gpu: float) -> str:
    """The range of gpu_memory_utilization that holds both budgets, or why none does."""
    low, high = engine_gib / gpu, 1 - trainer_gib / gpu
    low_2, high_2 = math.ceil(round(low * 100, 6)) / 100, math.floor(round(high * 100, 6)) / 100
    needs = (
        f"the engine needs at least {engine_gib:.2f} GiB ({low:.3f} of the GPU), the trainer "
        f"{trainer_gib:.2f} GiB (leaving the engine at most {max(high, 0):.3f})"
    )
    if low_2 <= high_2 and low_2 <= 1:
        return f"rollout.vllm.gpu_memory_utilization between {low_2:.2f} and {high_2:.2f}: {needs}"
    return f"no rollout.vllm.gpu_memory_utilization holds both budgets: {needs}"


def _tensor_parallel_hint(cfg: Config, a: Architecture, s: Sizes, engine: Budget, gpus: int) -> str:
    """The smallest larger tensor_parallel_size whose engine terms fit the engine's share."""
    tp = cfg.rollout.vllm.tensor_parallel_size
    dtype = cfg.rollout.dtype or cfg.model.dtype
    for d in (d for d in range(tp + 1, gpus + 1) if gpus % d == 0):
        need = sum(t.gib for t in vllm_engine_terms(a, s.e, s.ctx, d, dtype))
        if need <= engine.capacity_gib:
            return (
                f"rollout.vllm.tensor_parallel_size={d}: the engine's terms then take {need:.2f} GiB of "
                f"its {engine.capacity_gib:.2f} (with rollout.sync.verify=off; a colocated engine with "
                "tensor_parallel_size > 1 has not run on GPUs yet, docs/scaling.md)"
            )
    return f"no rollout.vllm.tensor_parallel_size up to the node's {gpus} GPU(s) fits the engine's {engine.capacity_gib:.2f} GiB"


def _vllm_hints(
    cfg: Config, a: Architecture, s: Sizes, budgets: list[Budget], gpu: float, gpus: int
) -> list[str]:
    """Settings that would make a colocated vLLM plan fit (none when it fits)."""
    engine, trainer = budgets
    if engine.fits and trainer.fits:
        return []
    hints = [_utilization_hint(engine.total_gib, trainer.total_gib, gpu)]
    if not engine.fits:
        hints.append(_tensor_parallel_hint(cfg, a, s, engine, gpus))
    return hints


def _layout(cfg: Config, s: Sizes, gpus: int, nodes: int) -> str:
    from agentrl.training import lora

    t, fsdp, S = cfg.trainer, s.fsdp, s.S
    return (
        f"{nodes} node(s) × {gpus} trainer rank(s), trainer.strategy={t.strategy}"
        + (
            f", HSDP {t.fsdp.replicas} × {S}"
            if fsdp and t.fsdp.replicas > 1
            else (f", shards of 1/{S}" if fsdp else "")
        )
        + (", CPU offload" if s.offload else "")
        + (", LoRA" if lora.enabled(cfg) else ", full fine-tuning")
        + (", bf16 compute" if s.c == 2 else ", fp32 compute")
        + (", gradient checkpointing" if cfg.model.gradient_checkpointing else "")
        + f"; micro-batch {t.micro_batch_size} × {s.ctx} tokens, {s.micros} per optimizer step per rank"
    )


def default_ranks_per_node(cfg: Config, gpus: int) -> int:
    """torchrun's ``--nproc_per_node`` when the plan is not told: one rank per GPU, less the whole
    GPUs local Ray workers take (fractional workers share the trainer's GPUs; a cluster's workers
    run on its own)."""
    from agentrl.rollout.components import worker_gpus

    r = cfg.rollout
    w = worker_gpus(cfg, cuda=True)
    if r.workers == 0 or r.ray_address or w < 1 or gpus - math.ceil(r.workers * w) < 1:
        return gpus  # (the last case: no room; the placement refuses it)
    return gpus - math.ceil(r.workers * w)


def plan(
    cfg: Config,
    gpus: int = 1,
    gpu_memory_gib: float = 80.0,
    nodes: int = 1,
    ranks_per_node: int | None = None,
) -> Plan:
    """Per-GPU memory of ``cfg`` on ``nodes`` × ``gpus`` GPUs of ``gpu_memory_gib`` each, with
    ``ranks_per_node`` trainer ranks on each (default ``default_ranks_per_node``), in the budget each
    term must fit (module docstring), and the placement of every process."""
    from agentrl.rollout.components import placement

    r = cfg.rollout
    ranks = ranks_per_node or default_ranks_per_node(cfg, gpus)
    where = placement(cfg, Launch(nodes=nodes, gpus_per_node=gpus, ranks_per_node=ranks))
    a = architecture(cfg)
    s = sizes(cfg, a, ranks, nodes)
    trainer = _trainer_terms(cfg, a, s)
    notes, hints = [], []
    shared, alone = _worker_loads(where)
    if r.engine == "vllm" and r.workers == 0:
        budgets = _vllm_budgets(cfg, a, s, trainer, gpu_memory_gib)
        hints = _vllm_hints(cfg, a, s, budgets, gpu_memory_gib, ranks)
    elif r.workers > 0:
        on_trainer = [_worker_budget(cfg, a, s, gpu_memory_gib, k) for k in range(shared)]
        rest = gpu_memory_gib - sum(b.capacity_gib for b in on_trainer)
        how = "the whole GPU" if not shared else f"what {shared} rollout worker(s) leave of the GPU"
        budgets = [*on_trainer, Budget("trainer", rest, how, trainer)]
        if r.ray_address:
            notes.append(
                "rollout.workers > 0: the engines run in Ray workers on a cluster's GPUs (not counted)"
            )
    else:
        budgets = [Budget("trainer and HF engine", gpu_memory_gib, "the whole GPU", trainer)]
        notes.append("the HF engine runs in the trainer's process and reserves nothing: one budget")
    if cfg.sft.enabled:  # a phase of its own, before RL: it must fit too
        budgets.append(sft_budget(cfg, a, gpu_memory_gib))
    return Plan(
        a,
        _layout(cfg, s, ranks, nodes),
        budgets,
        gpu_memory_gib,
        _host_terms(cfg, s, ranks),
        notes,
        hints,
        where,
        [_worker_budget(cfg, a, s, gpu_memory_gib, k) for k in range(alone)],
    )


def _worker_loads(where: Placement) -> tuple[int, int]:
    """The most rollout workers on one GPU that also holds a trainer rank, and on one that does not
    (node 0: a local Ray's)."""
    trainer_gpus = {g for t in where.trainers if t.node == 0 for g in t.gpus}
    count: dict[int, int] = {}
    for w in where.workers:
        for g in w.gpus if w.node == 0 else ():
            count[g] = count.get(g, 0) + 1
    shared = max((n for g, n in count.items() if g in trainer_gpus), default=0)
    alone = max((n for g, n in count.items() if g not in trainer_gpus), default=0)
    return shared, alone


def _worker_budget(cfg: Config, a: Architecture, s: Sizes, gpu: float, k: int) -> Budget:
    """Rollout worker ``k``'s share of a GPU it shares with others: a vLLM engine reserves
    ``gpu_memory_utilization``·GPU (its weights split over tp GPUs and one sequence of KV cache); an
    HF engine holds its weights and the KV cache of its running sequences in ``worker_gpus``·GPU."""
    from agentrl.rollout.components import worker_gpus

    r = cfg.rollout
    w = min(worker_gpus(cfg, cuda=True), 1.0)
    dtype = r.dtype or cfg.model.dtype
    name = f"rollout worker {k}"
    if r.engine == "vllm":
        u = r.vllm.gpu_memory_utilization
        terms = vllm_engine_terms(a, s.e, s.ctx, r.vllm.tensor_parallel_size, dtype)
        return Budget(name, u * gpu, f"gpu_memory_utilization·GPU = {u:g}·{gpu:g}", terms, reserved=True)
    seqs = min(r.max_concurrent_episodes, math.ceil(s.episodes / r.workers))
    terms = hf_engine_terms(a, s, seqs, dtype)
    return Budget(name, w * gpu, f"rollout.worker_gpus·GPU = {w:g}·{gpu:g}", terms)


ADVICE = {
    "activations": "model.gradient_checkpointing=true or a smaller trainer.micro_batch_size",
    "logits": "a smaller trainer.micro_batch_size (or shorter rollout.max_episode_tokens)",
    "HF engine KV": "fewer rollout.max_concurrent_episodes or shorter rollout.max_episode_tokens",
    "HF engine weights": "rollout.dtype=bfloat16, or rollout.workers > 0 to put the engines on other GPUs",
    "HF engine packed": "rollout.dtype=bfloat16, or rollout.workers > 0 to put the engines on other GPUs",
    "AdamW": "trainer.strategy=fsdp2 over more GPUs, trainer.fsdp.cpu_offload=true, or model.lora.rank > 0",
    "gradients": "trainer.strategy=fsdp2 over more GPUs, or model.lora.rank > 0",
    "policy weights": "trainer.strategy=fsdp2 over more GPUs (fewer trainer.fsdp.replicas), or cpu_offload",
    "unsharded gradient": "trainer.fsdp.grad_reduce=micro_batch",
    "KL reference": "algorithm.kl_coef=0, or LoRA (the reference is then the base model itself)",
    "vLLM weights": (
        "a larger rollout.vllm.tensor_parallel_size, a higher rollout.vllm.gpu_memory_utilization if "
        "the trainer has room, rollout.dtype=bfloat16 (if fp32), or rollout.workers > 0 to put the "
        "engines on other GPUs"
    ),
    "vLLM KV cache": (
        "shorter rollout.max_episode_tokens, a larger rollout.vllm.tensor_parallel_size, or a higher "
        "rollout.vllm.gpu_memory_utilization if the trainer has room"
    ),
    "bf16 weight copies": "trainer.strategy=fsdp2 (its mixed precision shards them)",
    "gathered parameters": "trainer.fsdp.reshard_after_forward=true",
    "DDP gradient": "trainer.strategy=fsdp2",
    "CUDA context": "fixed; a lower rollout.vllm.gpu_memory_utilization leaves the trainer more (colocated vLLM)",
}


def _term_line(t: Term) -> str:
    return f"  {t.name:42s} {t.gib:7.2f}   {t.how}"


def _budget_lines(b: Budget) -> list[str]:
    """A budget's terms, their total against its capacity, and its own verdict."""
    verdict = "fits" if b.fits else "DOES NOT FIT"
    return [
        f"{b.name} budget: {b.how} = {b.capacity_gib:.2f} GiB",
        *(_term_line(t) for t in b.terms),
        f"  {'total':42s} {b.total_gib:7.2f}   of {b.capacity_gib:.2f} GiB: {verdict} ({b.free_gib:+.2f} GiB)",
    ]


def launch_command(where: Placement) -> str:
    """The torchrun line that starts this placement's trainer ranks."""
    L = where.launch
    nodes = f"--nnodes {L.nodes} " if L.nodes > 1 else ""
    rdzv = "--rdzv_endpoint HOST:PORT " if L.nodes > 1 else ""
    return f"torchrun {nodes}--nproc_per_node {L.ranks_per_node} {rdzv}-m agentrl.cli train CONFIG"


def verdict(p: Plan) -> str:
    """The overall verdict, naming each budget that is exceeded and by how much, and the placement's
    problems."""
    if p.placement is not None and not p.placement.ok:
        keys = ", ".join(dict.fromkeys(q.key for q in p.placement.problems))
        return f"verdict: REFUSED: the placement cannot work (change {keys}; the REFUSED lines above say why)"
    if p.fits:
        each = ", ".join(
            f"{b.name} {b.total_gib:.2f} of {b.capacity_gib:.2f} GiB" for b in p.budgets + p.worker_budgets
        )
        return f"verdict: fits, every budget holds ({each})"
    every = p.budgets + p.worker_budgets
    over = [
        f"the {b.name}'s budget is exceeded: {b.total_gib:.2f} GiB > {b.capacity_gib:.2f} GiB ({b.how})"
        for b in every
        if not b.fits
    ]
    held = [f"the {b.name}'s fits ({b.total_gib:.2f} of {b.capacity_gib:.2f} GiB)" for b in every if b.fits]
    return "verdict: DOES NOT FIT: " + "; ".join(over + held)


def _advice_lines(p: Plan) -> list[str]:
    """For each exceeded budget its largest terms and what shrinks them, then the settings that
    would make the plan fit."""
    lines = []
    for b in (b for b in p.budgets + p.worker_budgets if not b.fits):
        lines += ["", f"largest terms, and what shrinks them ({b.name}'s budget):"]
        for t in sorted(b.terms, key=lambda t: -t.bytes)[:3]:
            advice = next((v for k, v in ADVICE.items() if t.name.startswith(k)), "")
            lines.append(f"  {t.name} ({t.gib:.1f} GiB): {advice}")
    if p.hints:
        lines += ["", "settings that would make it fit (the engine's own working memory not counted):"]
        lines += [f"  {h}" for h in p.hints]
    return lines


def render(p: Plan) -> str:
    a = p.arch
    lines = [
        f"model: {a.name}, {a.params / 1e9:.2f} B parameters ({a.layers} layers, hidden {a.hidden}, "
        f"vocab {a.vocab:,})" + (f"; LoRA adapters {a.lora_params / 1e6:.1f} M" if a.lora_params else ""),
        f"layout: {p.layout}",
        "",
        *([*render_placement(p.placement, launch_command(p.placement)), ""] if p.placement else []),
        f"{'per GPU, ' + str(len(p.budgets)) + ' budget(s)':44s} {'GiB':>7s}   how",
    ]
    for b in p.budgets:
        lines += _budget_lines(b)
    if p.worker_budgets:
        lines += ["", f"{'a GPU of rollout workers alone, ' + str(len(p.worker_budgets)) + ' budget(s)':44s}"]
        for b in p.worker_budgets:
            lines += _budget_lines(b)
    if p.host:
        lines += ["", "host memory per node", *(_term_line(t) for t in p.host)]
    lines += [""] + [f"note: {n}" for n in p.notes]
    lines.append(verdict(p))
    return "\n".join(lines + (_advice_lines(p) if not p.fits else []))
