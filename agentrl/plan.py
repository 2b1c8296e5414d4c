"""``agentrl plan``: the memory one GPU needs for a config, term by term, and whether it fits.

The model's size comes from its config.json (a local directory, a ``tiny:`` preset, or one of the
architectures bundled in ``agentrl/assets/architectures`` for the hub models configs/gpu uses); the
model is built on the meta device and its parameters counted exactly. Nothing is downloaded.

Every term is per GPU (one rank), in GiB (2^30 bytes), with the formula it came from. With N
parameters, P trainable (N, or LoRA's adapters), S ranks sharing a shard (``fsdp2``: W/replicas;
``ddp``: 1), b bytes per parameter (``model.dtype``; LoRA's adapters are fp32, as peft keeps them),
c bytes per activation (2 with ``trainer.bf16`` or bf16 weights, else 4), t =
``micro_batch_size`` × ``max_episode_tokens`` tokens per micro-batch:

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
  checkpointed chunks);
- the KL reference (``kl_coef`` > 0; not with LoRA, whose reference is the base itself): N·b/S;
- the colocated HF engine: its copy of the weights, N·e (e = ``rollout.dtype``), and the KV cache of
  its running sequences, q·ctx·L·2·kv·e with q = min(64, ``max_concurrent_episodes``, episodes per
  rank); vLLM reserves ``gpu_memory_utilization`` of the GPU instead; Ray workers hold theirs off
  the trainer's GPUs; the weight sync streams one tensor at a time into the HF engine, so its
  transient is the largest tensor in e bytes;
- a fixed 2 GiB for the CUDA context, NCCL buffers and the allocator's slack.

Activations are an estimate (tests/test_plan.py checks the formula against the tensors autograd
actually saves, on the CPU); the rest is counted. docs/scaling.md shows the terms for configs/gpu.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from agentrl.config import Config, ConfigError
from agentrl.sharding import check_mesh

GIB = 2**30
OVERHEAD_GIB = 2.0
ENGINE_BATCH = 64  # HFEngine's default max_batch_size: sequences decoded together
BUNDLED = Path(__file__).parent / "assets" / "architectures"


@dataclass(frozen=True)
class Architecture:
    """What the planner needs of a model, counted on the meta device."""

    name: str
    params: int
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    layer_params: int  # one decoder layer
    root_params: int  # everything outside the decoder layers (embeddings, final norm, head)
    largest_tensor: int
    lora_params: int = 0  # adapters for the configured LoRA settings (0 without LoRA)

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim


@dataclass
class Term:
    name: str
    bytes: float
    how: str

    @property
    def gib(self) -> float:
        return self.bytes / GIB


@dataclass
class Plan:
    arch: Architecture
    layout: str
    terms: list[Term]
    capacity_gib: float
    host: list[Term] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def total_gib(self) -> float:
        return sum(t.gib for t in self.terms)

    @property
    def fits(self) -> bool:
        return self.total_gib <= self.capacity_gib


def config_json(path: str) -> dict[str, Any]:
    """The config.json of ``model.path``: a local directory, a ``tiny:`` preset, or a bundled
    architecture (``Qwen/Qwen2.5-7B`` -> assets/architectures/Qwen--Qwen2.5-7B.json)."""
    from agentrl.models import PRESETS

    if path.startswith("tiny:"):
        preset = path.removeprefix("tiny:")
        if preset not in PRESETS:
            raise ConfigError(f"unknown tiny preset {preset!r}; valid: {sorted(PRESETS)}")
        s = PRESETS[preset]
        return {
            "model_type": "qwen2",
            "architectures": ["Qwen2ForCausalLM"],
            "hidden_size": s.hidden_size,
            "intermediate_size": s.intermediate_size,
            "num_hidden_layers": s.num_layers,
            "num_attention_heads": s.num_heads,
            "num_key_value_heads": s.num_kv_heads,
            "vocab_size": 1024,
            "tie_word_embeddings": False,
        }
    local = Path(path) / "config.json"
    if local.exists():
        return json.loads(local.read_text())  # type: ignore[no-any-return]
    bundled = BUNDLED / (path.replace("/", "--") + ".json")
    if bundled.exists():
        return json.loads(bundled.read_text())  # type: ignore[no-any-return]
    known = sorted(p.stem.replace("--", "/") for p in BUNDLED.glob("*.json"))
    raise ConfigError(
        f"no config.json for model.path={path!r} (no download): pass a local model directory, a tiny: "
        f"preset, or one of the bundled architectures {known}"
    )


def architecture(cfg: Config) -> Architecture:
    """Count the configured model's parameters on the meta device (and its LoRA adapters)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from agentrl import lora, sharding

    raw = config_json(cfg.model.path)
    hf_config = AutoConfig.for_model(**raw)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    layers = sharding.decoder_layers(model)
    params = sum(p.numel() for p in model.parameters())
    layer_params = sum(p.numel() for p in layers[0].parameters())
    lora_params = 0
    if lora.enabled(cfg):
        lora.check_targets(model, cfg.model.lora)
        r, targets = cfg.model.lora.rank, set(cfg.model.lora.target_modules)
        lora_params = sum(
            r * (m.in_features + m.out_features)
            for name, m in model.named_modules()
            if isinstance(m, nn.Linear) and name.rsplit(".", 1)[-1] in targets
        )
    c = hf_config
    heads = c.num_attention_heads
    return Architecture(
        name=type(model).__name__,
        params=params,
        layers=len(layers),
        hidden=c.hidden_size,
        intermediate=c.intermediate_size,
        heads=heads,
        kv_heads=getattr(c, "num_key_value_heads", None) or heads,
        head_dim=getattr(c, "head_dim", None) or c.hidden_size // heads,
        vocab=c.vocab_size,
        layer_params=layer_params,
        root_params=params - layer_params * len(layers),
        largest_tensor=max(p.numel() for p in model.parameters()),
        lora_params=lora_params,
    )


def _bytes(dtype: str | None) -> int:
    return 2 if dtype in ("bfloat16", "float16") else 4


def activation_bytes(a: Architecture, c: int, k: int) -> int:
    """Bytes autograd keeps per token in one decoder layer (module docstring): c bytes per
    activation, k projection inputs of width h (4, or 7 under autocast)."""
    return 16 * a.hidden + c * (k * a.hidden + 2 * a.kv_dim + 4 * a.intermediate) + 4 * a.heads


def plan(cfg: Config, gpus: int = 1, gpu_memory_gib: float = 80.0, nodes: int = 1) -> Plan:
    """Per-GPU memory of ``cfg`` on ``nodes`` × ``gpus`` GPUs of ``gpu_memory_gib`` each."""
    from agentrl import lora

    a = architecture(cfg)
    t, r = cfg.trainer, cfg.rollout
    world = gpus * nodes
    fsdp = t.strategy == "fsdp2"
    if fsdp:
        check_mesh(world, t.fsdp.replicas)
    S = world // t.fsdp.replicas if fsdp else 1
    b = _bytes(cfg.model.dtype)
    c = 2 if t.bf16 or b == 2 else 4
    autocast = t.bf16 and b == 4 and not fsdp  # FSDP2 computes in bf16 through its mixed precision
    residual = 2 if b == 2 or (fsdp and t.bf16) else 4
    e = _bytes(r.dtype or cfg.model.dtype)
    N = a.params
    P = a.lora_params if lora.enabled(cfg) else N
    pb = 4 if lora.enabled(cfg) else b  # bytes per trainable parameter
    ctx = r.max_episode_tokens
    tokens = t.micro_batch_size * ctx
    episodes = r.prompts_per_step * r.group_size
    rows = math.ceil(episodes / t.mini_batches_per_step / world)  # per rank per optimizer step
    micros = math.ceil(rows / t.micro_batch_size)
    offload = fsdp and t.fsdp.cpu_offload
    shard = f"/{S}" if S > 1 else ""

    terms: list[Term] = []
    host: list[Term] = []
    states = [
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
    if offload:
        host += [Term(s.name + " [offloaded]", s.bytes * gpus, f"({s.how})·{gpus} ranks") for s in states]
    else:
        terms += states
    if fsdp:
        if t.fsdp.reshard_after_forward:
            gathered = Term(
                "gathered parameters (FSDP2)",
                (2 * a.layer_params + a.root_params) * c,
                f"(2 layers + root)·c = (2·{a.layer_params:,} + {a.root_params:,})·{c}",
            )
        else:  # every layer stays gathered from its forward to its backward
            gathered = Term("gathered parameters (FSDP2, no reshard)", N * c, f"N·c = {N:,}·{c}")
        terms.append(gathered)
        if t.fsdp.grad_reduce == "step" and micros > 1:
            terms.append(
                Term(
                    "unsharded gradient accumulation",
                    4 * P,
                    f"4·P, {micros} micro-batches per reduction (trainer.fsdp.grad_reduce=micro_batch avoids it)",
                )
            )
    else:
        if world > 1:
            terms.append(Term("DDP gradient buckets", P * pb, f"P·b = {P:,}·{pb}"))
        if autocast:
            terms.append(Term("bf16 weight copies (autocast)", 2 * N, f"2·N = 2·{N:,}"))
    k = 7 if autocast else 4
    per_token_layer = activation_bytes(a, c, k)
    if cfg.model.gradient_checkpointing:
        act = tokens * (a.layers * residual * a.hidden + per_token_layer)
        how = f"t·(L·r·h + one layer) = {tokens:,}·({a.layers}·{residual}·{a.hidden} + {per_token_layer:,})"
    else:
        act = tokens * a.layers * per_token_layer
        how = f"t·L·(16h + c·({k}h+2kv+4i) + 4·heads) = {tokens:,}·{a.layers}·{per_token_layer:,}"
    terms.append(Term("activations (one micro-batch)", act, how))
    terms.append(
        Term(
            "logits and their gradient", tokens * a.vocab * 2 * c, f"t·V·2c = {tokens:,}·{a.vocab:,}·{2 * c}"
        )
    )
    if cfg.algorithm.kl_coef > 0 and not (lora.enabled(cfg) and not cfg.model.ref_path):
        terms.append(Term("KL reference weights", N * b / S, f"N·b/S = {N:,}·{b}/{S}"))
    notes = []
    if r.workers > 0:
        notes.append(
            "rollout.workers > 0: the engines run in Ray workers, off the trainer's GPUs (not counted)"
        )
    elif r.engine == "vllm":
        frac = r.vllm.gpu_memory_utilization
        terms.append(
            Term(
                "vLLM engine (weights + KV cache)",
                frac * gpu_memory_gib * GIB,
                f"gpu_memory_utilization·GPU = {frac}·{gpu_memory_gib}",
            )
        )
    else:
        seqs = min(ENGINE_BATCH, r.max_concurrent_episodes, math.ceil(episodes / world))
        terms.append(Term(f"HF engine weights ({r.dtype or cfg.model.dtype})", N * e, f"N·e = {N:,}·{e}"))
        kv = seqs * ctx * a.layers * 2 * a.kv_dim * e
        terms.append(
            Term("HF engine KV cache", kv, f"q·ctx·L·2·kv·e = {seqs}·{ctx}·{a.layers}·2·{a.kv_dim}·{e}")
        )
        terms.append(
            Term(
                "weight sync (streamed)", a.largest_tensor * e, f"largest tensor·e = {a.largest_tensor:,}·{e}"
            )
        )
    terms.append(Term("CUDA context, NCCL, allocator slack", OVERHEAD_GIB * GIB, "fixed"))
    if fsdp or world == 1:
        host.append(Term("rank 0 reads the weights once", N * b, f"N·b = {N:,}·{b} (node 0 only)"))
    layout = (
        f"{nodes} node(s) × {gpus} GPU(s), trainer.strategy={t.strategy}"
        + (
            f", HSDP {t.fsdp.replicas} × {S}"
            if fsdp and t.fsdp.replicas > 1
            else (f", shards of 1/{S}" if fsdp else "")
        )
        + (", CPU offload" if offload else "")
        + (", LoRA" if lora.enabled(cfg) else ", full fine-tuning")
        + (", bf16 compute" if c == 2 else ", fp32 compute")
        + (", gradient checkpointing" if cfg.model.gradient_checkpointing else "")
        + f"; micro-batch {t.micro_batch_size} × {ctx} tokens, {micros} per optimizer step per rank"
    )
    return Plan(a, layout, terms, gpu_memory_gib, host, notes)


ADVICE = {
    "activations": "model.gradient_checkpointing=true or a smaller trainer.micro_batch_size",
    "logits": "a smaller trainer.micro_batch_size (or shorter rollout.max_episode_tokens)",
    "HF engine KV": "fewer rollout.max_concurrent_episodes or shorter rollout.max_episode_tokens",
    "HF engine weights": "rollout.dtype=bfloat16, or rollout.workers > 0 to put the engines on other GPUs",
    "AdamW": "trainer.strategy=fsdp2 over more GPUs, trainer.fsdp.cpu_offload=true, or model.lora.rank > 0",
    "gradients": "trainer.strategy=fsdp2 over more GPUs, or model.lora.rank > 0",
    "policy weights": "trainer.strategy=fsdp2 over more GPUs (fewer trainer.fsdp.replicas), or cpu_offload",
    "unsharded gradient": "trainer.fsdp.grad_reduce=micro_batch",
    "KL reference": "algorithm.kl_coef=0, or LoRA (the reference is then the base model itself)",
    "vLLM": "a lower rollout.vllm.gpu_memory_utilization",
    "bf16 weight copies": "trainer.strategy=fsdp2 (its mixed precision shards them)",
    "gathered parameters": "trainer.fsdp.reshard_after_forward=true",
    "DDP gradient": "trainer.strategy=fsdp2",
}


def render(p: Plan) -> str:
    a = p.arch
    lines = [
        f"model: {a.name}, {a.params / 1e9:.2f} B parameters ({a.layers} layers, hidden {a.hidden}, "
        f"vocab {a.vocab:,})" + (f"; LoRA adapters {a.lora_params / 1e6:.1f} M" if a.lora_params else ""),
        f"layout: {p.layout}",
        "",
        f"{'per GPU':44s} {'GiB':>7s}   how",
    ]
    for t in p.terms:
        lines.append(f"  {t.name:42s} {t.gib:7.2f}   {t.how}")
    verdict = "fits" if p.fits else "DOES NOT FIT"
    free = p.capacity_gib - p.total_gib
    lines.append(
        f"  {'total':42s} {p.total_gib:7.2f}   of {p.capacity_gib:g} GiB: {verdict} ({free:+.1f} GiB)"
    )
    if p.host:
        lines.append("")
        lines.append("host memory per node")
        lines += [f"  {t.name:42s} {t.gib:7.2f}   {t.how}" for t in p.host]
    lines += [f"note: {n}" for n in p.notes]
    if not p.fits:
        lines.append("")
        lines.append("largest terms, and what shrinks them:")
        for t in sorted(p.terms, key=lambda t: -t.bytes)[:3]:
            advice = next((v for k, v in ADVICE.items() if t.name.startswith(k)), "")
            lines.append(f"  {t.name} ({t.gib:.1f} GiB): {advice}")
    return "\n".join(lines)
