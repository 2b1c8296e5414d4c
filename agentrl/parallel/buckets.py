"""The trainer's weights for the engine, a bucket at a time: packing, and gathering FSDP2's shards
one bucket per collective, in the engine's dtype.

``pack_buckets`` cuts a stream of (name, tensor) pairs into buckets of at most ``bucket_bytes``
(a bigger tensor travels alone). ``gather_buckets`` does the same for sharded parameters without
gathering them one by one: the parameters of a bucket (sized in the dtype they travel in) are cast to
that dtype on their own rank, copied into one flat buffer, and gathered with **one**
all-gather (``all_gather_flat``) over the shard group, then cut back into whole tensors. Against a
``full_tensor()`` per parameter in float32 followed by the engine's cast to bfloat16 this sends half
the bytes in one collective per bucket instead of one per tensor, and gives the same values bit for
bit: the cast rounds each element the same way wherever it happens, and a gather moves bytes.

FSDP2 shards a parameter along dim 0 in ``ceil(rows / S)``-row chunks (the last ranks may hold fewer
rows, or none); HSDP adds a replicate dimension whose members hold the same shards. Each rank's part
of the flat buffer has room for every parameter's largest chunk, so all parts are the same size;
the padding is never read.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence

import torch
import torch.distributed as dist
from torch import Tensor


def pack_buckets(
    stream: Iterable[tuple[str, Tensor]], bucket_bytes: float
) -> Iterator[list[tuple[str, Tensor]]]:
    """The stream's pairs in order, in lists of at most ``bucket_bytes`` (a tensor bigger than that
    is a list of its own). Lazy: a bucket is handed out as soon as the next tensor does not fit, so
    the stream has produced one bucket and that tensor at most."""
    bucket: list[tuple[str, Tensor]] = []
    size = 0
    for name, t in stream:
        n = t.numel() * t.element_size()
        if bucket and size + n > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, t))
        size += n
    if bucket:
        yield bucket


def bucket_size(bucket: Sequence[tuple[str, Tensor]]) -> int:
    return sum(t.numel() * t.element_size() for _, t in bucket)


def gather_buckets(
    params: Iterable[tuple[str, Tensor]],
    bucket_bytes: float,
    dtype: torch.dtype | None,
    device: torch.device,
) -> Iterator[list[tuple[str, Tensor]]]:
    """Buckets of whole tensors from sharded (DTensor) parameters, each bucket one gather per dtype
    (module docstring). ``dtype``: what the tensors travel and arrive in (the engine's), None for
    each parameter's own. Plain tensors pass through, cast. Collective: every rank of the mesh must
    consume the iterator in step. The buckets are packed as ``pack_buckets`` packs the gathered
    stream, sized in the travelling dtype."""

    def travel(t: Tensor) -> torch.dtype:
        return dtype or t.dtype

    sized = ((name, t, t.numel() * torch.empty((), dtype=travel(t)).element_size()) for name, t in params)
    bucket: list[tuple[str, Tensor]] = []
    size = 0
    for name, t, n in sized:
        if bucket and size + n > bucket_bytes:
            yield gather_bucket(bucket, dtype, device)
            bucket, size = [], 0
        bucket.append((name, t))
        size += n
    if bucket:
        yield gather_bucket(bucket, dtype, device)


def gather_bucket(
    bucket: Sequence[tuple[str, Tensor]], dtype: torch.dtype | None, device: torch.device
) -> list[tuple[str, Tensor]]:
    """The bucket's parameters whole, in ``dtype`` (None: their own), on ``device``; the sharded ones
    gathered with one collective per dtype over their shard group (all of a bucket's sharded
    parameters share FSDP2's mesh)."""
    out: dict[str, Tensor] = {}
    sharded: dict[torch.dtype, list[tuple[str, Tensor]]] = {}
    for name, t in bucket:
        t = t.detach()
        if hasattr(t, "to_local"):
            sharded.setdefault(dtype or t.dtype, []).append((name, t))
        else:
            out[name] = t.to(device=device, dtype=dtype or t.dtype)
    for kind, part in sharded.items():
        out.update(_gather_flat(part, kind, device))
    return [(name, out[name]) for name, _ in bucket]


def _shard_dim(t: Tensor) -> tuple[object, int]:
    """The mesh and the mesh dimension along which ``t`` (a DTensor) is split on its dim 0; every other
    mesh dimension must replicate it (FSDP2: ``(Shard(0),)``; HSDP: ``(Replicate(), Shard(0))``)."""
    from torch.distributed.tensor import Replicate, Shard

    placements = t.placements  # type: ignore[attr-defined]
    split = [i for i, p in enumerate(placements) if isinstance(p, Shard)]
    if (
        len(split) != 1
        or placements[split[0]].dim != 0
        or not all(isinstance(p, Replicate) for i, p in enumerate(placements) if i != split[0])
    ):
        raise NotImplementedError(
            f"a bucketed gather reads FSDP2 parameters sharded on dim 0 over one mesh dimension, not {placements}"
        )
    return t.device_mesh, split[0]  # type: ignore[attr-defined]


def _gather_flat(
    part: list[tuple[str, Tensor]], dtype: torch.dtype, device: torch.device
) -> dict[str, Tensor]:
    """One all-gather (``all_gather_flat``) for these sharded parameters, cast to ``dtype`` first."""
    mesh, dim = _shard_dim(part[0][1])
    group = mesh.get_group(dim)  # type: ignore[attr-defined]
    world, me = dist.get_world_size(group), dist.get_rank(group)
    layout = []  # (name, full shape, rows per chunk, elements per row, offset in a rank's part)
    offset = 0
    for name, t in part:
        if _shard_dim(t) != (mesh, dim):
            raise NotImplementedError(f"{name} is sharded over another mesh than {part[0][0]}")
        shape = tuple(t.shape)
        rows = shape[0] if shape else 1
        row = math.prod(shape[1:]) if len(shape) > 1 else 1
        chunk = math.ceil(rows / world)
        layout.append((name, shape, chunk, row, offset))
        offset += chunk * row
    send = torch.zeros(offset, dtype=dtype, device=device)  # [this rank's part]
    for (name, shape, chunk, row, at), (_, t) in zip(layout, part):
        local = t.to_local()  # type: ignore[attr-defined]
        mine = _rows(shape[0] if shape else 1, chunk, me)
        if local.numel() != mine * row:
            raise RuntimeError(
                f"{name}: rank {me} of {world} holds {local.numel()} elements, but a dim-0 split in chunks of "
                f"{chunk} rows gives it {mine * row}"
            )
        send[at : at + local.numel()] = local.reshape(-1).to(device=device, dtype=dtype)
    recv = torch.empty(world * offset, dtype=dtype, device=device)  # [world parts]
    all_gather_flat(recv, send, group)
    del send
    parts = recv.view(world, offset)
    out = {}
    for name, shape, chunk, row, at in layout:
        rows = shape[0] if shape else 1
        pieces = [parts[r, at : at + _rows(rows, chunk, r) * row] for r in range(world)]
        out[name] = torch.cat(pieces).view(shape)
    return out


def all_gather_flat(out: Tensor, part: Tensor, group: object) -> None:
    """Every rank's ``part`` concatenated into ``out`` (one collective): torch's
    ``all_gather_single`` (2.13 deprecates its old name, ``all_gather_into_tensor``, which earlier
    versions, 2.11 on the GPU machine, still need)."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, part, group=group)


def _rows(rows: int, chunk: int, rank: int) -> int:
    """How many of ``rows`` rank ``rank`` holds when they are split in chunks of ``chunk``."""
    return max(0, min(chunk, rows - rank * chunk))
