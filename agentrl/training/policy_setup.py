"""The learner's parts: the policy prepared for training (gradient checkpointing, LoRA; rank 0's
weights kept aside for ranks that start on the meta device), the optimizer, and each step's plan
(which rows each optimizer step trains on) and learning rate."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from agentrl.config import ModelConfig, TrainerConfig
from agentrl.models.checkpointing import checkpointing
from agentrl.parallel import ranks, sharding
from agentrl.seeds import mix_seed
from agentrl.training import cpu_attention, lora


def prepare_policy(
    settings: ModelConfig,
    seed: int,
    model: torch.nn.Module,
    strategy: sharding.Strategy,
    log: Callable[[str], None],
    bf16: bool = False,
) -> tuple[torch.nn.Module, bool, dict[str, Any] | None]:
    """Gradient checkpointing, LoRA, and under bf16 autocast on the CPU (``bf16``, outside FSDP2) the
    attention in float32 (``cpu_attention``), on the loaded policy, before it is wrapped or sharded. Returns
    the model, whether ranks > 0 get rank 0's weights by broadcast, and (on rank 0 then) those weights.
    Ranks > 0 of a sharded run start on meta and get rank 0's weights; a run whose every rank starts
    on meta (a DCP checkpoint will fill it) broadcasts nothing."""
    if settings.gradient_checkpointing:
        checkpointing(model)
    if lora.enabled(settings.lora):
        model = lora.apply(model, settings.lora, seed)
        log(lora.describe(model))
    cpu_attention.apply(model, strategy.device, bf16 and not strategy.equal_forwards, log)
    sharded = strategy.equal_forwards and strategy.world > 1
    broadcast = sharded and not ranks.all_ranks(sharding.on_meta(model))
    return model, broadcast, model.state_dict() if broadcast and strategy.rank == 0 else None


def make_optimizer(t: TrainerConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    trainable = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(
        trainable,
        lr=t.lr,
        betas=(t.betas[0], t.betas[1]),
        weight_decay=t.weight_decay,
        # one fused kernel over all parameters (the same update, faster than the per-tensor loop
        # torch picks by default on CPU; docs/performance.md#on-the-tiny-model)
        fused=all(p.is_floating_point() for p in trainable) or None,
    )


def update_plan(t: TrainerConfig, seed: int, step: int, batch_size: int) -> list[list[torch.Tensor]]:
    """The rows of each optimizer step, per epoch: one mini-batch of all rows, or
    ``mini_batches_per_step`` mini-batches of a fresh seeded shuffle every epoch."""
    rng = torch.Generator().manual_seed(mix_seed(seed, step, 17))
    plan = []
    for _epoch in range(t.epochs_per_step):
        order = (
            torch.randperm(batch_size, generator=rng)
            if t.mini_batches_per_step > 1
            else torch.arange(batch_size)
        )
        plan.append(list(order.chunk(t.mini_batches_per_step)))
    return plan


def set_lr(t: TrainerConfig, optimizer: torch.optim.Optimizer, step: int) -> None:
    """Linear warm-up over ``trainer.warmup_steps``, then constant or cosine to ``total_steps``."""
    scale = min(1.0, (step + 1) / t.warmup_steps) if t.warmup_steps else 1.0
    if t.lr_schedule == "cosine":
        scale *= 0.5 * (1 + math.cos(math.pi * min(step, t.total_steps) / t.total_steps))
    for g in optimizer.param_groups:
        g["lr"] = t.lr * scale
