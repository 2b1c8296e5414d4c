"""Supervised warm start on demonstrations, loss on assistant tokens only.

Conversations are tokenized exactly the way the EpisodeRunner lays out an episode (prompt rendered
with the chat template, each assistant turn as its own tokens followed by the end-of-turn token,
observations as template deltas), so what SFT teaches is what RL later samples and trains on.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from agentrl.config.schema import LoraConfig, SFTConfig
from agentrl.models.chat import ChatRenderer
from agentrl.training import lora
from agentrl.training.forward import first_loss_column, prefix_plan, suffix_logits

Message = dict[str, Any]


def tokenize_conversation(renderer: ChatRenderer, messages: Sequence[Message]) -> tuple[list[int], list[int]]:
    """Token ids and loss mask (1 on assistant tokens, including each turn's end-of-turn token). The
    tools section goes into the system message as the runner puts it there (``prompt_messages``)."""
    messages = renderer.prompt_messages(messages)
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
    if first is None:
        raise ValueError("a demonstration needs at least one assistant message")
    prompt = renderer.render_prompt(list(messages[:first]))
    ids, mask = list(prompt.token_ids), [0] * len(prompt.token_ids)
    i = first
    while i < len(messages):
        msg = messages[i]
        if msg["role"] != "assistant":
            raise ValueError(f"expected an assistant message at position {i}, got {msg['role']!r}")
        turn = renderer.encode(msg["content"], split_special=False)
        if renderer.eos_token_id is not None:
            turn.append(renderer.eos_token_id)
        ids += turn
        mask += [1] * len(turn)
        text = renderer.tokenizer.decode(turn, skip_special_tokens=False)
        close = renderer.close_turn(text, ended_with_eos=renderer.eos_token_id is not None)
        ids += close.token_ids
        mask += [0] * len(close.token_ids)
        j = i + 1
        while j < len(messages) and messages[j]["role"] != "assistant":
            j += 1
        if j > i + 1 and j < len(messages):  # observations followed by another assistant turn
            for piece in renderer.render_observation(list(messages[i + 1 : j])):
                ids += piece.token_ids
                mask += [0] * len(piece.token_ids)
        i = j
    return ids, mask


@dataclass
class SFTResult:
    steps: int
    final_loss: float
    losses: list[float]
    tokens: int
    seconds: float
    holdout_losses: list[tuple[int, float]] = field(default_factory=list)
    """(steps done, mean held-out loss) at every evaluation; empty without a held-out set."""
    best_step: int | None = None
    """Steps done when the held-out loss was lowest: the weights kept (None: the last ones)."""


def sft_train(
    model: torch.nn.Module,
    examples: Sequence[tuple[list[int], list[int]]],
    steps: int,
    lr: float,
    batch_size: int,
    seed: int = 0,
    warmup: int = 10,
    grad_clip: float = 1.0,
    pad_id: int = 0,
    on_step: Callable[[int, float], None] | None = None,
    share_prefix: bool = True,
    holdout: Sequence[tuple[list[int], list[int]]] = (),
    eval_every: int = 50,
    patience: int = 0,
    micro_batch_size: int | None = None,
) -> SFTResult:
    """AdamW with linear warm-up and cosine decay; each step draws a shuffled batch. Loss is the mean
    over assistant tokens of the batch. ``share_prefix`` runs the prompt prefix common to the batch
    once (``agentrl.training.forward``; same loss and gradients, several times faster on tool prompts).

    With ``holdout`` examples, their mean loss is measured before training, every ``eval_every`` steps
    and at the end; the weights with the lowest held-out loss are the ones kept, and with
    ``patience`` > 0 training stops after that many evaluations without a new lowest (early
    stopping: the warm start keeps the demonstrations' diversity instead of memorising prompts).
    ``micro_batch_size``: forwards of at most that many demonstrations (``_accumulate``)."""
    if not examples:
        raise ValueError("no SFT examples")
    rng = random.Random(seed)
    params = [p for p in model.parameters() if p.requires_grad]
    fused = all(p.is_floating_point() for p in params) or None  # one kernel for all parameters
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.95), fused=fused)
    order: list[int] = []
    losses, tokens, t0 = [], 0, time.perf_counter()
    keeper = _BestWeights(model, holdout, batch_size, pad_id, patience * eval_every)
    if holdout:
        keeper.check(0)  # the starting point: if training only hurts the held-out loss, it is kept
    model.train()
    for step in range(steps):
        scale = min(1.0, (step + 1) / max(1, warmup)) * 0.5 * (1 + math.cos(math.pi * step / max(1, steps)))
        for g in opt.param_groups:
            g["lr"] = lr * max(scale, 0.05)
        if len(order) < batch_size:
            order += rng.sample(range(len(examples)), len(examples))
        batch = [examples[order.pop()] for _ in range(min(batch_size, len(examples)))]
        opt.zero_grad(set_to_none=True)
        loss_value, n_tokens = _accumulate(model, batch, pad_id, share_prefix, micro_batch_size)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()
        losses.append(loss_value)
        tokens += n_tokens
        if on_step:
            on_step(step, losses[-1])
        if holdout and (step + 1) % eval_every == 0 and step + 1 < steps and keeper.check(step + 1):
            break
    best_step = keeper.restore(len(losses)) if holdout else None
    model.eval()
    return SFTResult(
        len(losses), losses[-1], losses, tokens, time.perf_counter() - t0, keeper.held, best_step
    )


def _accumulate(
    model: torch.nn.Module,
    batch: Sequence[tuple[list[int], list[int]]],
    pad_id: int,
    share_prefix: bool,
    micro_batch_size: int | None,
) -> tuple[float, int]:
    """The gradient of the batch's mean loss over its assistant tokens, accumulated over forwards of
    at most ``micro_batch_size`` demonstrations; returns (that loss, its token count)."""
    m = micro_batch_size or len(batch)
    if m >= len(batch):  # one forward, as without micro-batches
        loss, n = _batch_loss(model, batch, pad_id, share_prefix)
        loss.backward()
        return loss.item(), n
    total = max(1, sum(sum(mask[1:]) for _, mask in batch))  # the loss's targets: every token after the first
    value, count = 0.0, 0
    for i in range(0, len(batch), m):
        loss, n = _batch_loss(model, batch[i : i + m], pad_id, share_prefix)
        (loss * (n / total)).backward()
        value, count = value + loss.item() * n / total, count + n
    return value, count


def _batch_loss(
    model: torch.nn.Module, batch: Sequence[tuple[list[int], list[int]]], pad_id: int, share_prefix: bool
) -> tuple[torch.Tensor, int]:
    """Mean cross-entropy over the batch's assistant tokens, and how many there were."""
    device = next(model.parameters()).device  # the batches follow the model
    ids, mask = (t.to(device) for t in _pad(batch, pad_id))
    share, owners = 0, None
    if share_prefix:  # the system prompt every demonstration starts with is run once
        lengths = torch.tensor([len(x) for x, _ in batch])
        plan = prefix_plan(ids, lengths, limit=first_loss_column(mask[:, 1:]))
        share, owners = plan.share, plan.owners
    logits = suffix_logits(model, ids, share, owners)  # [B, T - share, V], positions share..T-1
    target, tmask = ids[:, share + 1 :], mask[:, share + 1 :]
    loss_tok = F.cross_entropy(
        logits[:, :-1].flatten(0, 1).float(), target.clamp(min=0).flatten(), reduction="none"
    )
    return (loss_tok * tmask.flatten()).sum() / tmask.sum().clamp(min=1), int(tmask.sum())


class _BestWeights:
    """The held-out loss after some steps, and the weights where it was lowest."""

    def __init__(
        self,
        model: torch.nn.Module,
        holdout: Sequence[tuple[list[int], list[int]]],
        batch_size: int,
        pad_id: int,
        patience_steps: int,
    ) -> None:
        self.model, self.holdout, self.batch_size, self.pad_id = model, holdout, batch_size, pad_id
        self.patience_steps = patience_steps
        self.held: list[tuple[int, float]] = []
        self.best: tuple[float, int, dict[str, torch.Tensor]] | None = None

    def check(self, done: int) -> bool:
        """Measure the held-out loss after ``done`` steps; True when patience has run out."""
        loss = holdout_loss(self.model, self.holdout, self.batch_size, self.pad_id)
        self.held.append((done, loss))
        if self.best is None or loss < self.best[0]:
            trained = {k: p.detach().clone() for k, p in self.model.named_parameters() if p.requires_grad}
            self.best = (loss, done, trained)  # the frozen base of a LoRA warm start is not copied
        return self.patience_steps > 0 and done - self.best[1] >= self.patience_steps

    def restore(self, done: int) -> int:
        """Measure once more at the end if needed, load the best weights and return their step."""
        if not self.held or self.held[-1][0] != done:
            self.check(done)
        assert self.best is not None
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                if name in self.best[2]:
                    p.copy_(self.best[2][name])
        return self.best[1]


@torch.no_grad()
def holdout_loss(
    model: torch.nn.Module, examples: Sequence[tuple[list[int], list[int]]], batch_size: int, pad_id: int
) -> float:
    """Mean loss per assistant token over ``examples`` (eval mode, no gradients)."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total, count = 0.0, 0.0
    for i in range(0, len(examples), batch_size):
        ids, mask = (t.to(device) for t in _pad(examples[i : i + batch_size], pad_id))
        logits = model(input_ids=ids).logits[:, :-1]
        tok = F.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten(), reduction="none")
        total += float((tok * mask[:, 1:].flatten()).sum())
        count += float(mask[:, 1:].sum())
    model.train(was_training)
    return total / max(count, 1.0)


def _pad(batch: Sequence[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad; returns ids [B, T] and mask [B, T] (padding has mask 0)."""
    T = max(len(ids) for ids, _ in batch)
    ids = torch.full((len(batch), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), T), dtype=torch.float32)
    for i, (x, m) in enumerate(batch):
        ids[i, : len(x)] = torch.tensor(x)
        mask[i, : len(m)] = torch.tensor(m, dtype=torch.float32)
    return ids, mask


def trains_adapters(sft: SFTConfig, adapters: LoraConfig) -> bool:
    """Whether the warm start trains LoRA adapters (``sft.weights``; ``auto``: when ``model.lora`` is set)."""
    return sft.weights == "lora" or (sft.weights == "auto" and lora.enabled(adapters))


def sft_seed(sft: SFTConfig, run_seed: int) -> int:
    """The warm start's seed: ``sft.seed``, else ``run.seed``."""
    return run_seed if sft.seed is None else sft.seed


def save_warm_start(
    out_dir: Path, model: Any, tokenizer: Any, result: SFTResult, n_examples: int, n_holdout: int
) -> None:
    """The warm start in HF format, with ``sft_result.json`` beside it."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    record = {
        "steps": result.steps,
        "final_loss": result.final_loss,
        "tokens": result.tokens,
        "seconds": result.seconds,
        "examples": n_examples,
        "holdout_examples": n_holdout,
        "holdout_losses": result.holdout_losses,
        "best_step": result.best_step,
    }
    (out_dir / "sft_result.json").write_text(json.dumps(record))
