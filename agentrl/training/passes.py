"""The learner's passes over a batch: log-probs and entropies of every target token under a model,
with gradient (one micro-batch) or without (the whole batch, micro-batched), and how rows are cut into
micro-batches across ranks (each rank its own rows; under FSDP2 as many forwards on every rank, padded
with dummies, since every forward is a collective)."""

from __future__ import annotations

import torch

from agentrl.config import ConfigError, TrainerConfig
from agentrl.parallel import ranks, sharding
from agentrl.training.batch import Batch, batch_forward
from agentrl.training.forward import output_head

CHUNKED_HEAD_VOCAB = 32768
"""``trainer.chunked_head: auto`` applies the head in chunks from this vocabulary size up; below it
the whole logits are small and one matrix multiplication is faster."""


class Passes:
    """``temperature``: the sampling temperature the log-probs are taken at (``rollout.temperature``)."""

    def __init__(
        self,
        trainer: TrainerConfig,
        temperature: float,
        strategy: sharding.Strategy,
        share_prefix_nograd: bool,
        share_prefix: bool,
    ) -> None:
        self.trainer, self.temperature, self.strategy = trainer, temperature, strategy
        self.rank, self.world = strategy.rank, strategy.world
        self.share_prefix_nograd, self.share_prefix = share_prefix_nograd, share_prefix

    def forward(
        self, model: torch.nn.Module, batch: Batch, grad: bool = False, phi: bool = False
    ) -> tuple[torch.Tensor, ...]:
        """Log-probs and entropies [B, T] of ``batch`` under ``model`` (micro-batched when no grad),
        and with ``phi`` (no grad) each token's first-order entropy coefficient φ."""
        t = self.trainer
        size = batch.size if grad else t.micro_batch_size
        return batch_forward(
            model,
            batch,
            size,
            self.temperature,
            grad=grad,
            bf16=t.computes_bf16 and not self.strategy.equal_forwards,  # FSDP2: its mixed-precision policy
            share_prefix=self.share_prefix if grad else self.share_prefix_nograd,
            head=self.chunked_head(model),
            phi=phi,
        )

    def chunked_head(self, model: torch.nn.Module) -> torch.nn.Linear | None:
        """The head ``batch_forward`` applies in chunks (``trainer.chunked_head``), or None for the
        whole logits."""
        mode = self.trainer.chunked_head
        if mode == "never":
            return None
        head = None if self.strategy.equal_forwards else output_head(model)
        if head is None and mode == "always":
            raise ConfigError(
                "trainer.chunked_head=always: this model's output head cannot be applied outside its forward "
                "(not a plain linear layer: adapted by LoRA, or logits transformed after it); use "
                "trainer.chunked_head=auto or off"
            )
        if head is not None and mode == "auto" and head.out_features < CHUNKED_HEAD_VOCAB:
            return None
        return head

    def no_grad(self, model: torch.nn.Module, batch: Batch, phi: bool = False) -> tuple[torch.Tensor, ...]:
        """Log-probs and entropies [B, T] of the whole batch with no gradient (and φ with ``phi``).
        Under W ranks each computes only its own rows (``ranks.shard_rows``), in micro-batches (as
        many on every rank under FSDP2), and every rank gets the whole batch's values."""
        if self.world == 1:
            with torch.no_grad():
                out = self.forward(model, batch, phi=phi)
            self.strategy.release(model)
            return out
        own = ranks.shard_rows(batch.size, self.rank, self.world)
        outs = torch.zeros((max(len(own), 1), 3 if phi else 2, batch.mask.shape[1]), device=batch.device)
        with torch.no_grad():
            for m in self.micro_batches(own, n_rows=batch.size):
                stats = self.forward(model, batch.rows(m.rows), phi=phi)  # [b, w] each
                if not m.dummy:
                    at = m.rows - own[0]  # positions within this rank's contiguous share
                    for j, x in enumerate(stats):
                        outs[at, j, : x.shape[1]] = x
        self.strategy.release(model)
        return ranks.gather_rows(outs, batch.size, self.rank, self.world).unbind(1)

    def gather_own(self, logp: torch.Tensor, ent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole batch's [B, T] values from each rank's own rows of ``logp`` and ``ent``."""
        own = ranks.shard_rows(logp.shape[0], self.rank, self.world)
        both = torch.stack([logp[own], ent[own]], 1)  # [b, 2, T]
        return ranks.gather_rows(both, logp.shape[0], self.rank, self.world).unbind(1)  # type: ignore[return-value]

    def micro_batches(self, rows: torch.Tensor, n_rows: int | None = None) -> list[sharding.Micro]:
        """This rank's micro-batches of ``rows``: its share (``ranks.local_rows``; all of them on one
        process) split by ``micro_batch_size``, each with its loss scale. Where every forward is a
        collective (FSDP2), padded with dummies to the count of the rank with the most rows.
        ``n_rows``: ``rows`` is already this rank's share of that many rows."""
        mb = self.trainer.micro_batch_size
        if n_rows is None:
            mine, scale = ranks.local_rows(rows, self.rank, self.world)
            total = len(rows)
        else:
            mine, scale, total = rows, float(self.world), n_rows
        if not len(mine):
            mine, scale = torch.zeros(1, dtype=torch.long), 0.0
        micros = [sharding.Micro(part, scale) for part in mine.split(mb)]
        if self.strategy.equal_forwards:
            pad = ranks.micro_counts(total, mb, self.world) - len(micros)
            micros += [sharding.Micro(mine[:1], 0.0)] * pad
        return micros
