"""The data-parallel ranks: joining torchrun's process group, each rank's share of the rows, and the
few collectives the trainer needs (episodes, statistics, decisions). The model's layout over the
ranks, replicated (DDP) or sharded (FSDP2), is ``agentrl.parallel.sharding``.

Why splitting rows is exact: the trainer's loss is a sum over micro-batches of a numerator divided by
a normaliser computed once on the whole batch (``alg.loss_normaliser``), so the loss over the batch
is the sum of the losses over any partition of its rows. Rank r of W computes that loss on its share
of rows; DDP and FSDP2 average the ranks' gradients, so each rank scales its loss by W and the result
is the single-process gradient of the whole batch (up to float summation order).

Every rank holds the whole batch's π_old statistics and token weights (they are batch statistics:
``gather_rows`` assembles them from each rank's own rows), then trains on its rows only. Launch
with torchrun (or Ray's TorchTrainer, which sets the same environment variables).

A collective that some rank never joins fails after the process group's timeout
(``timeouts.collective_s``, passed to ``init_from_env``); the helpers here re-raise it as a
``CollectiveError`` naming the collective, the rank and the wait (gloo's own message names neither).
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar, cast

import torch
import torch.distributed as dist
from torch import Tensor

from agentrl.timeouts import bind_cuda_device


def backend_for() -> str:
    """gloo for CPU tensors and, when CUDA is present, NCCL for CUDA ones (one group serves both:
    CPU offload and object collectives use gloo, GPU tensors NCCL)."""
    return "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"


_timeout_s: float | None = None  # the process group's timeout, for the messages of CollectiveError


def init_from_env(backend: str | None = None, timeout_s: float | None = None) -> tuple[int, int]:
    """Join the process group torchrun describes in the environment; (rank, world size). Without
    torchrun's variables this is a single process: (0, 1). With CUDA each rank takes the GPU of its
    ``LOCAL_RANK``, and so does every thread agentrl starts (``timeouts.start_thread``).
    ``timeout_s`` (``timeouts.collective_s``; None = torch's default) bounds every collective of the
    group: gloo raises on the ranks that wait; NCCL's watchdog aborts them."""
    global _timeout_s
    if "RANK" not in os.environ:
        return 0, 1
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        bind_cuda_device(int(os.environ.get("LOCAL_RANK", "0")))  # every helper thread's device too
    if not dist.is_initialized():
        limit = {} if timeout_s is None else {"timeout": timedelta(seconds=timeout_s)}
        dist.init_process_group(backend or backend_for(), **limit)  # type: ignore[arg-type]
        _timeout_s = timeout_s
    return dist.get_rank(), dist.get_world_size()


class CollectiveError(RuntimeError):
    """A collective between the ranks failed or ran past the group's timeout; names which one."""


F = TypeVar("F", bound=Callable[..., Any])


def _collective(op: str, setting: Callable[[], str | None] = lambda: None) -> Callable[[F], F]:
    """Re-raise a failing collective's RuntimeError (gloo: \"Timed out waiting 600000ms for recv
    operation to complete\", \"Application timeout caused pair closure\") as a ``CollectiveError``
    naming ``op``, the helper, this rank and the wait (``setting()``: the setting that bounds it, when
    it is not the process group's ``timeouts.collective_s``)."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def named(*args: Any, **kwargs: Any) -> Any:
            t0 = time.monotonic()
            try:
                return fn(*args, **kwargs)
            except CollectiveError:
                raise
            except RuntimeError as e:
                if not dist.is_initialized():  # one process: no collective ran
                    raise
                waited = time.monotonic() - t0
                where = f"collective {op} (ranks.{fn.__name__}) on rank {dist.get_rank()} of {dist.get_world_size()}"
                limit = setting() or (
                    "the process group's timeout"
                    if _timeout_s is None
                    else f"timeouts.collective_s={_timeout_s:g}s"
                )
                why = (
                    f"not every rank joined within {limit} (a rank is stuck or gone)"
                    if "timeout" in str(e).lower() or "timed out" in str(e).lower()
                    else "failed"
                )
                raise CollectiveError(f"{where}: {why}; waited {waited:.1f}s. {type(e).__name__}: {e}") from e

        return cast(F, named)

    return wrap


def shard_rows(n: int, rank: int, world: int) -> Tensor:
    """This rank's contiguous share of ``n`` rows (sizes differ by at most one)."""
    return torch.arange(rank * n // world, (rank + 1) * n // world)


def local_rows(rows: Tensor, rank: int, world: int) -> tuple[Tensor, float]:
    """This rank's rows of a mini-batch and the scale of its loss (W, the inverse of DDP's mean).

    A rank left without rows (a mini-batch smaller than the world) still takes part in the gradient
    all-reduce: it runs its first row with scale 0."""
    if world <= 1:
        return rows, 1.0
    mine = rows[shard_rows(len(rows), rank, world)]
    return (mine, float(world)) if len(mine) else (rows[:1], 0.0)


def micro_counts(n: int, micro_batch_size: int, world: int) -> int:
    """The most micro-batches any rank runs for ``n`` rows: ranks with fewer pad to it when every
    forward is a collective (FSDP2)."""
    return max(math.ceil(len(shard_rows(n, r, world)) / micro_batch_size) for r in range(world)) or 1


@_collective("all_gather")
def gather_rows(own: Tensor, n: int, rank: int, world: int) -> Tensor:
    """The [n, ...] tensor whose rows ``shard_rows(n, r, world)`` are rank r's ``own`` (collective;
    ``own`` has this rank's rows first, then anything)."""
    if world <= 1:
        return own[:n]
    peak = math.ceil(n / world)
    padded = own.new_zeros((peak, *own.shape[1:]))
    k = len(shard_rows(n, rank, world))
    padded[:k] = own[:k]
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded.contiguous())
    return torch.cat([p[: len(shard_rows(n, r, world))] for r, p in enumerate(parts)])


def micro_batches(minis: Sequence[Tensor], micro_batch_size: int, world: int) -> list[Tensor]:
    """Every rank's micro-batches of these mini-batches, as ``local_rows`` and ``split`` cut them:
    the row groups a per-micro-batch selection (STARE ``scope: micro``) ranks within."""
    out = []
    for mini in minis:
        for rank in range(world):
            rows = mini[shard_rows(len(mini), rank, world)] if world > 1 else mini
            out += list(rows.split(micro_batch_size))
    return out


def set_sync(model: torch.nn.Module, last: bool) -> None:
    """Like ``sync_if`` without a ``with`` block: DDP all-reduces in the backward only when ``last``."""
    if hasattr(model, "require_backward_grad_sync"):
        model.require_backward_grad_sync = last  # type: ignore[assignment]


@dataclass
class _Rollouts:
    runners: tuple[int, ...] | None = None
    """The ranks that run episodes (``placement.episode_ranks``); None: every rank."""
    group: Any = None
    """A gloo group of every rank whose timeout is the wait for a step's episodes (None: one process):
    a rank that runs none waits there for those that do, a fast rank for the slowest."""
    wait_s: float | None = None
    """That group's timeout (``timeouts.data_wait_s``), for the error that names it."""


_rollouts = _Rollouts()


def configure_rollouts(runners: Sequence[int], wait_s: float) -> None:
    """Only ``runners`` run episodes (every rank of colocated engines, a tensor-parallel engine's
    leaders, or rank 0 with its Ray pool); the step's episodes are gathered over a group whose
    timeout is ``wait_s`` (``timeouts.data_wait_s``, not the collectives' timeout: a step's rollouts
    can take longer, and a rank that finished its share waits there for the slowest one, or for
    the ranks that run them). Collective: every rank calls it."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    _rollouts.runners = None if tuple(runners) == tuple(range(world)) else tuple(runners)
    _rollouts.wait_s = wait_s
    if world > 1:
        _rollouts.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=wait_s))


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) of this process; (0, 1) outside torch.distributed."""
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


T = TypeVar("T")


def builders_first(build: bool, work: Callable[[], T], timeout_s: float, what: str, setting: str) -> T | None:
    """``work()`` on the ranks where ``build`` holds while every other rank waits for them, at most
    ``timeout_s`` (named by ``setting``) instead of the collectives' timeout: rank 0 starting a Ray
    pool or training the SFT warm start may rightly take longer than any collective. Then every rank
    learns whether the builders succeeded: a builder that failed re-raises its error, and every
    other rank raises one naming that rank and its error, at once. Returns ``work()``'s result on a
    builder, None elsewhere. Collective: every rank calls it at the same point."""
    rank, world = rank_and_world()
    if world == 1:
        return work()
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    result, error = None, None
    if build:
        try:
            result = work()
        except BaseException as e:  # every rank hears of it below
            error = e
    said: list[Any] = [None] * world
    t0 = time.monotonic()
    try:
        dist.all_gather_object(
            said, None if error is None else f"{type(error).__name__}: {error}", group=group
        )
    except RuntimeError as e:
        raise CollectiveError(
            f"rank {rank} of {world} waited for {what} on another rank: no answer within {setting} "
            f"(waited {time.monotonic() - t0:.1f}s; a rank is stuck or gone). {type(e).__name__}: {e}"
        ) from e
    finally:
        dist.destroy_process_group(group)
    if error is not None:
        raise error
    failed = [f"rank {r}: {message}" for r, message in enumerate(said) if message is not None]
    if failed:
        raise RuntimeError(f"{what} failed on another rank, so this rank stops too: {'; '.join(failed)}")
    return result


def subgroup(members: Sequence[Sequence[int]], timeout_s: float) -> Any:
    """A gloo group for each list of ranks in ``members`` (collective: every rank creates every group,
    in the same order); this rank's, or None."""
    mine = None
    rank = dist.get_rank() if dist.is_initialized() else 0
    for ranks_ in members:
        group = dist.new_group(list(ranks_), backend="gloo", timeout=timedelta(seconds=timeout_s))
        if rank in ranks_:
            mine = group
    return mine


def gather_episodes(run: Callable[[list], list], requests: Sequence[Any]) -> list:
    """Data-parallel rollouts: each rank that runs episodes runs its contiguous shard of
    ``requests`` (``configure_rollouts``) and every rank gets all episodes back, in request order
    (episodes carry their own seeds, so the result is the single-process one up to batch-dependent
    rounding)."""
    return gather_episode_parts(run(local_share(requests)))


def local_share(requests: Sequence[Any]) -> list:
    """This rank's contiguous share of a step's episode requests (all of them in one process; none
    on a rank that runs no episodes)."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    runners = _rollouts.runners if _rollouts.runners is not None else tuple(range(world))
    if rank not in runners:
        return []
    k = runners.index(rank)
    return [requests[i] for i in shard_rows(len(requests), k, len(runners)).tolist()]


def _episode_wait() -> str | None:
    return None if _rollouts.wait_s is None else f"timeouts.data_wait_s={_rollouts.wait_s:g}s"


@_collective("all_gather_object", _episode_wait)
def gather_episode_parts(mine: list) -> list:
    """Every rank's episodes concatenated in rank order, over the group ``configure_rollouts`` made
    (collective; ``mine`` in one process)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return mine
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, mine, group=_rollouts.group)
    return [ep for part in parts for ep in part]


@_collective("all_gather_object")
def gather_parts(mine: list) -> list:
    """Every rank's ``mine`` concatenated in rank order (collective; ``mine`` in one process)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return mine
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, mine)
    return [ep for part in parts for ep in part]


@_collective("gather_object")
def gather_to_rank0(obj: Any) -> list[Any] | None:
    """Every rank's ``obj`` in rank order on rank 0, None on the others ([obj] on one process)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [obj]
    parts: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(obj, parts, dst=0)
    return parts


@_collective("broadcast_object_list")
def broadcast_from_rank0(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank, so all ranks take rank 0's decision (which checkpoint to
    resume from, whether the wall-clock budget is spent)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


@_collective("all_reduce")
def sum_over_ranks(t: Tensor) -> Tensor:
    """The elementwise sum of every rank's ``t`` (a new tensor, on every rank)."""
    out = t.clone()
    dist.all_reduce(out)
    return out


@_collective("all_gather_object")
def merge_lists(parts: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """Every rank's lists under each key, concatenated in rank order (small Python values)."""
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, dict(parts))
    merged: dict[str, list[Any]] = {}
    for part in everyone:
        for k, v in part.items():
            merged.setdefault(k, []).extend(v)
    return merged


def all_ranks(flag: bool) -> bool:
    """True on every rank when ``flag`` is True on every rank."""
    return not any_rank(not flag)


@_collective("all_reduce")
def any_rank(flag: bool) -> bool:
    """True on every rank when ``flag`` is True on any rank (a signal may reach only some ranks)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return flag
    t = torch.tensor([int(flag)])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def leave() -> None:
    """Tear the process group down before the interpreter exits: left to static destruction, gloo's
    threads can abort the process after a successful run ("terminate called without an active
    exception", seen under torchrun on 2 CPU ranks)."""
    if dist.is_initialized():
        dist.destroy_process_group()
