"""Data-parallel policy gradients with torch.distributed (DDP; gloo on CPU, NCCL on GPU).

Why it splits exactly: the trainer's loss is a sum over micro-batches of a numerator divided by a
normaliser computed once on the whole batch (``alg.loss_normaliser``), so the loss over the batch is
the sum of the losses over any partition of its rows. Rank r of W computes that loss on its shard of
rows; DDP all-reduces the *mean* of the ranks' gradients, so each rank scales its loss by W and the
result is the single-process gradient of the whole batch (up to float summation order).

Every rank must hold the whole batch's ``logp_old`` and token weights (they are batch statistics),
then trains on its rows only. Launch with torchrun (or Ray's TorchTrainer, which sets the same
environment variables):

    torchrun --nproc_per_node 2 -m agentrl.ddp --selfcheck MODEL_DIR --out grads.pt

``--selfcheck`` computes the gradient of a seeded synthetic batch and saves it from rank 0, so a test
can compare it with the single-process gradient (tests/test_ddp.py).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from agentrl import algorithms as alg
from agentrl.batch import Batch, batch_forward, build_batch
from agentrl.episode import Episode, Segment


def init_from_env(backend: str | None = None) -> tuple[int, int]:
    """Join the process group torchrun describes in the environment; (rank, world size). Without
    torchrun's variables this is a single process: (0, 1)."""
    if "RANK" not in os.environ:
        return 0, 1
    if not dist.is_initialized():
        dist.init_process_group(backend or ("nccl" if torch.cuda.is_available() else "gloo"))
    return dist.get_rank(), dist.get_world_size()


def shard_rows(n: int, rank: int, world: int) -> Tensor:
    """This rank's contiguous share of ``n`` rows (sizes differ by at most one)."""
    return torch.arange(rank * n // world, (rank + 1) * n // world)


def wrap(model: torch.nn.Module, world: int) -> torch.nn.Module:
    """The module to run forward/backward through: DDP over ``model`` when there are several ranks."""
    if world <= 1:
        return model
    return torch.nn.parallel.DistributedDataParallel(model)


def local_rows(rows: Tensor, rank: int, world: int) -> tuple[Tensor, float]:
    """This rank's rows of a mini-batch and the scale of its loss (W, the inverse of DDP's mean).

    A rank left without rows (a mini-batch smaller than the world) still takes part in the gradient
    all-reduce: it runs its first row with scale 0."""
    if world <= 1:
        return rows, 1.0
    mine = rows[shard_rows(len(rows), rank, world)]
    return (mine, float(world)) if len(mine) else (rows[:1], 0.0)


def micro_batches(minis: Sequence[Tensor], micro_batch_size: int, world: int) -> list[Tensor]:
    """Every rank's micro-batches of these mini-batches, as ``local_rows`` and ``split`` cut them:
    the row groups a per-micro-batch selection (STARE ``scope: micro``) ranks within."""
    out = []
    for mini in minis:
        for rank in range(world):
            rows = mini[shard_rows(len(mini), rank, world)] if world > 1 else mini
            out += list(rows.split(micro_batch_size))
    return out


def sync_if(model: torch.nn.Module, last: bool) -> Any:
    """DDP all-reduces on the last micro-batch of a mini-batch only; the others accumulate locally
    (ranks may have different numbers of micro-batches: each syncs exactly once)."""
    return model.no_sync() if hasattr(model, "no_sync") and not last else _null()  # type: ignore[operator]


def set_sync(model: torch.nn.Module, last: bool) -> None:
    """Like ``sync_if`` without a ``with`` block: DDP all-reduces in the backward only when ``last``."""
    if hasattr(model, "require_backward_grad_sync"):
        model.require_backward_grad_sync = last  # type: ignore[assignment]


def gather_episodes(run: Callable[[list], list], requests: Sequence[Any]) -> list:
    """Data-parallel rollouts: each rank runs its contiguous shard of ``requests`` and every rank
    gets all episodes back, in request order (episodes carry their own seeds, so the result is
    the single-process one up to batch-dependent rounding)."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    if world == 1:
        return run(list(requests))
    mine = run([requests[i] for i in shard_rows(len(requests), rank, world).tolist()])
    parts: list[Any] = [None] * world
    dist.all_gather_object(parts, mine)
    return [ep for part in parts for ep in part]


def gather_to_rank0(obj: Any) -> list[Any] | None:
    """Every rank's ``obj`` in rank order on rank 0, None on the others ([obj] on one process)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [obj]
    parts: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(obj, parts, dst=0)
    return parts


def broadcast_from_rank0(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank, so all ranks take rank 0's decision (which checkpoint to
    resume from, whether the wall-clock budget is spent)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def any_rank(flag: bool) -> bool:
    """True on every rank when ``flag`` is True on any rank (a signal may reach only some ranks)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return flag
    t = torch.tensor([int(flag)])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def accumulate_policy_gradient(
    model: torch.nn.Module,
    batch: Batch,
    rows: Tensor,
    logp_old: Tensor,
    normaliser: float,
    micro_batch_size: int,
    temperature: float = 1.0,
    loss_scale: float = 1.0,
    **loss_kwargs: Any,
) -> float:
    """Backward of ``loss_scale`` × the trainer's policy loss on ``rows`` of ``batch``, micro-batch by
    micro-batch (the same calls as ``Learner.optimise``). Returns the unscaled loss of these rows. With a
    DDP model, gradients are all-reduced on the last micro-batch only."""
    total = 0.0
    parts = list(rows.split(micro_batch_size))
    for k, micro in enumerate(parts):
        sub = batch.rows(micro)  # [b, t] trimmed to its longest episode
        w = sub.mask.shape[1]
        last = k == len(parts) - 1
        with sync_if(model, last):
            logp, _ = batch_forward(
                model, sub, len(micro), temperature, grad=True, share_prefix=False
            )  # [b, w]
            loss = alg.policy_loss(
                logp, logp_old[micro, :w], sub.advantages, sub.mask, normaliser=normaliser, **loss_kwargs
            ).loss
            (loss * loss_scale).backward()
        total += float(loss.detach())
    return total


def data_parallel_gradient(
    model: torch.nn.Module,
    batch: Batch,
    logp_old: Tensor,
    normaliser: float,
    micro_batch_size: int,
    **loss_kwargs: Any,
) -> dict[str, Tensor]:
    """The whole batch's policy-loss gradient, computed by this process on its shard (all ranks call
    it). Single process: plain accumulation over all rows."""
    rank, world = init_from_env()
    model.zero_grad(set_to_none=True)
    wrapped = wrap(model, world)
    rows = shard_rows(batch.size, rank, world)
    accumulate_policy_gradient(
        wrapped, batch, rows, logp_old, normaliser, micro_batch_size, loss_scale=float(world), **loss_kwargs
    )
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def synthetic_batch(vocab: int, n: int = 6, seed: int = 0) -> Batch:
    """A seeded batch of episodes of different lengths (prompt, policy, tool, policy) with engine
    logprobs and mixed-sign advantages: enough structure to exercise masks and padding."""
    g = torch.Generator().manual_seed(seed)
    eps = []
    for i in range(n):
        ep = Episode(id=f"e{i}", env="synthetic", task_id=f"t{i}", seed=i, group=f"g{i % 2}")

        def ids(k: int) -> list[int]:
            return torch.randint(5, vocab, (k,), generator=g).tolist()

        ep.add(Segment("prompt", 0, ids(4 + i), "p"))
        a = ids(3 + 2 * i)
        ep.add(Segment("policy", 0, a, "a", [-1.0 - 0.1 * j for j in range(len(a))], 0))
        ep.add(Segment("tool", 1, ids(2 + i % 3), "t"))
        b = ids(5 - i % 3)
        ep.add(Segment("policy", 1, b, "b", [-0.5] * len(b), 0))
        eps.append(ep)
    adv = torch.linspace(-1.0, 1.5, n)
    return build_batch(eps, adv, [1.0] * n, pad_id=0)


def selfcheck_gradient(model: torch.nn.Module, micro_batch_size: int = 2) -> dict[str, Tensor]:
    """Gradient of the synthetic batch's loss: the same numbers on 1 or W processes."""
    vocab: int = model.config.vocab_size  # type: ignore[union-attr, assignment]
    batch = synthetic_batch(vocab)
    with torch.no_grad():
        logp_old, _ = batch_forward(model, batch, batch.size, 1.0)  # [B, T-1]
    logp_old = logp_old - 0.05  # ratios ≠ 1, so clipping paths are reached
    norm = alg.loss_normaliser(batch.mask, "token-mean")
    return data_parallel_gradient(
        model, batch, logp_old, norm, micro_batch_size, clip_low=0.2, clip_high=0.28
    )


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--selfcheck", required=True, help="model directory")
    ap.add_argument("--out", required=True, help="where rank 0 saves the gradients (torch.save)")
    ap.add_argument("--micro-batch-size", type=int, default=2)
    args = ap.parse_args()
    from agentrl.models import load_policy

    torch.manual_seed(0)
    rank, world = init_from_env()
    model, _ = load_policy(args.selfcheck)
    model.train()
    grads = selfcheck_gradient(model, args.micro_batch_size)
    if rank == 0:
        torch.save({"world": world, "grads": grads}, args.out)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
