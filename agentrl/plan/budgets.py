"""The plan of a config: its memory terms in the budget each must fit, and whether every budget
holds. The model's size comes from ``architecture.py``.

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

Every term, with its formula, is in ``terms.py`` (the trainer's and the host's) and
``engine_terms.py`` (the engines').
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from agentrl.config import Config
from agentrl.engines.registry import engine_record
from agentrl.parallel.placement import Launch, Placement
from agentrl.plan.architecture import Architecture, architecture
from agentrl.plan.engine_terms import colocated_hf_terms, hf_engine_terms, vllm_engine_terms
from agentrl.plan.terms import (
    GIB,
    OVERHEAD_GIB,
    Sizes,
    Term,
    activation_bytes,
    dtype_bytes,
    host_terms,
    sizes,
    trainer_terms,
)


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


def sft_budget(cfg: Config, a: Architecture, gpu: float) -> Budget:
    """The SFT warm start (``sft.enabled``), before RL, in each trainer process on its own GPU with
    nothing sharded: the weights, the trained weights' gradients and AdamW moments (LoRA's adapters
    under ``sft.weights`` lora/auto, else all N), and one forward's activations and logits
    (``sft.micro_batch_size`` demonstrations, else the whole ``sft.batch_size``, of up to ctx tokens;
    with ``model.gradient_checkpointing`` each layer's input, as for RL)."""
    from agentrl.training.sft import trains_adapters

    b = dtype_bytes(cfg.model.dtype)
    c = 2 if b == 2 else 4
    adapters = trains_adapters(cfg.sft, cfg.model.lora)
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
                f"its {engine.capacity_gib:.2f} (with rollout.sync.verify=off; what a colocated engine with "
                "tensor_parallel_size > 1 has run on: docs/scaling.md)"
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
        + (", LoRA" if lora.enabled(cfg.model.lora) else ", full fine-tuning")
        + (", bf16 compute" if s.c == 2 else ", fp32 compute")
        + (", gradient checkpointing" if cfg.model.gradient_checkpointing else "")
        + f"; micro-batch {t.micro_batch_size} × {s.ctx} tokens, {s.micros} per optimizer step per rank"
    )


def default_ranks_per_node(cfg: Config, gpus: int) -> int:
    """torchrun's ``--nproc_per_node`` when the plan is not told: one rank per GPU, less the whole
    GPUs local Ray workers take (fractional workers share the trainer's GPUs; a cluster's workers
    run on its own)."""
    from agentrl.assembly.components import worker_gpus

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
    from agentrl.assembly.components import placement

    r = cfg.rollout
    ranks = ranks_per_node or default_ranks_per_node(cfg, gpus)
    where = placement(cfg, Launch(nodes=nodes, gpus_per_node=gpus, ranks_per_node=ranks))
    a = architecture(cfg)
    s = sizes(cfg, a, ranks, nodes)
    reserves = engine_record(r.engine).reserves_memory  # vLLM's way, else the HF engine's
    in_process = not reserves and r.workers == 0
    trainer = trainer_terms(cfg, a, s, colocated_hf_terms(cfg, a, s) if in_process else [])
    notes, hints = [], []
    shared, alone = _worker_loads(where)
    if reserves and r.workers == 0:
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
        host_terms(cfg, s, ranks),
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
    from agentrl.assembly.components import worker_gpus

    r = cfg.rollout
    w = min(worker_gpus(cfg, cuda=True), 1.0)
    dtype = r.dtype or cfg.model.dtype
    name = f"rollout worker {k}"
    if engine_record(r.engine).reserves_memory:
        u = r.vllm.gpu_memory_utilization
        terms = vllm_engine_terms(a, s.e, s.ctx, r.vllm.tensor_parallel_size, dtype)
        return Budget(name, u * gpu, f"gpu_memory_utilization·GPU = {u:g}·{gpu:g}", terms, reserved=True)
    seqs = min(r.max_concurrent_episodes, math.ceil(s.episodes / r.workers))
    terms = hf_engine_terms(a, s, seqs, dtype)
    return Budget(name, w * gpu, f"rollout.worker_gpus·GPU = {w:g}·{gpu:g}", terms)
