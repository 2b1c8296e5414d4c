"""The weight sync's own process group: the trainer (rank 0) broadcasts buckets to N Ray workers.

``rollout.sync.transport: broadcast`` (``sync/transports/broadcast.py``) sends each bucket by a collective
broadcast instead of Ray's object store. The group exists for the sync only: it is built from a
``TCPStore`` the trainer hosts and the backend's process group constructed directly
(``ProcessGroupGloo`` / ``ProcessGroupNCCL``), so torch.distributed's default group is never read
or touched (the trainer may run under torchrun with its own; a worker has none). Gloo when the
trainer's tensors are on the CPU, NCCL when they are on a GPU; the group's timeout is
``timeouts.weight_sync_s``. Which of the two has run where: docs/scaling.md ("Beyond one process
per GPU").

A bucket travels as its layout (name, shape, dtype per tensor, sent with the Ray call that starts
the receive) and one flat buffer per dtype, in the order the dtypes first appear in the bucket.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import Tensor
from torch._C._distributed_c10d import Backend

Layout = list[tuple[str, tuple[int, ...], str]]
"""(name, shape, dtype without ``torch.``) per tensor of a bucket, in the bucket's order."""

JOINED = "agentrl/joined/{rank}"
"""The store key a rank sets when it starts joining (so a rank that never came can be named)."""


def backend_for(device: torch.device) -> str:
    """``gloo`` for tensors on the CPU, ``nccl`` for tensors on a CUDA device."""
    if device.type == "cpu":
        return "gloo"
    if device.type == "cuda":
        return "nccl"
    raise ValueError(f"rollout.sync.transport=broadcast has no backend for tensors on {device}")


def host_store(host: str, size: int, timeout_s: float) -> dist.TCPStore:
    """The trainer's store for a group of ``size`` ranks, listening on ``host`` at a free port
    (port 0: the OS picks one; ``store.port`` says which)."""
    return dist.TCPStore(
        host, 0, size, is_master=True, timeout=timedelta(seconds=timeout_s), wait_for_workers=False
    )


def client_store(host: str, port: int, rank: int, timeout_s: float) -> dist.TCPStore:
    """A worker's connection to the trainer's store; marks ``rank`` as joining."""
    store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s))
    store.set(JOINED.format(rank=rank), "1")
    return store


def joined(store: dist.Store, ranks: Sequence[int]) -> list[bool]:
    """Whether each of ``ranks`` started joining."""
    return [store.check([JOINED.format(rank=r)]) for r in ranks]


def make_group(store: dist.Store, rank: int, size: int, device: torch.device, timeout_s: float) -> Backend:
    """This process's member of the group (blocks until every rank has joined, or raises after
    ``timeout_s``). Gloo connects every pair of ranks in its constructor; NCCL is connected eagerly
    on ``device`` so that a rank that cannot join fails here, not in the first bucket."""
    timeout = timedelta(seconds=timeout_s)
    if backend_for(device) == "gloo":
        return dist.ProcessGroupGloo(store, rank, size, timeout)
    opts = dist.ProcessGroupNCCL.Options()
    opts._timeout = timeout
    group = dist.ProcessGroupNCCL(store, rank, size, opts)
    group.eager_connect_single_device(device)
    return group


def leave(group: Backend) -> None:
    """End this process's member of a group (its peers may be gone: NCCL is aborted, not drained)."""
    nccl = getattr(dist, "ProcessGroupNCCL", None)  # absent from CPU-only builds
    if nccl is not None and isinstance(group, nccl):
        group.abort()
    # gloo: dropping the last reference closes its pairs


def layout(bucket: Sequence[tuple[str, Tensor]]) -> Layout:
    return [(n, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in bucket]


def _dtype_order(spec: Layout) -> list[str]:
    return list(dict.fromkeys(d for _, _, d in spec))


def _broadcast(group: Backend, tensor: Tensor, timeout_s: float) -> None:
    opts = dist.BroadcastOptions()
    opts.rootRank, opts.rootTensor, opts.timeout = 0, 0, timedelta(seconds=timeout_s)
    group.broadcast([tensor], opts).wait()  # type: ignore[attr-defined]  # bound, not in the stub


def send_bucket(
    group: Backend, bucket: Sequence[tuple[str, Tensor]], device: torch.device, timeout_s: float
) -> None:
    """Rank 0's side: the bucket's tensors as one flat buffer per dtype, each broadcast to every rank
    (a collective every rank takes part in; it raises after ``timeout_s`` without them)."""
    for dtype in _dtype_order(layout(bucket)):
        parts = [t.detach().reshape(-1).to(device) for _, t in bucket if t.dtype == getattr(torch, dtype)]
        flat = torch.cat(parts)  # [sum of numels]: one copy of this dtype's share of the bucket
        del parts
        _broadcast(group, flat, timeout_s)
        del flat


def receive_bucket(
    group: Backend, spec: Layout, device: torch.device, timeout_s: float
) -> list[tuple[str, Tensor]]:
    """A worker's side of ``send_bucket``: the (name, tensor) pairs of a bucket laid out as ``spec``,
    on ``device``, in the bucket's order (views into the flat buffers)."""
    out: dict[str, Tensor] = {}
    for dtype in _dtype_order(spec):
        mine = [(n, shape) for n, shape, d in spec if d == dtype]
        sizes = [int(torch.Size(shape).numel()) for _, shape in mine]
        flat = torch.empty(sum(sizes), dtype=getattr(torch, dtype), device=device)
        _broadcast(group, flat, timeout_s)
        for (name, shape), part in zip(mine, flat.split(sizes)):
            out[name] = part.view(shape)
    return [(n, out[n]) for n, _, _ in spec]
