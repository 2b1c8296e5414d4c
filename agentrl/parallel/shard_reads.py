"""FSDP2's first load without a broadcast: every rank reads its own shards from the checkpoint.

The broadcast (``sharding.materialize``: torch's ``set_model_state_dict(broadcast_from_rank0=True)``)
sends every tensor whole from rank 0 to each other rank, one tensor at a time, and under CPU offload
over gloo: rank 0 sends W - 1 copies of the model (docs/scaling.md: measured, and what it costs a
32 B model on 32 ranks). When every rank can read the checkpoint's safetensors files (one
filesystem, a copy on each node, or a hub name each node fetches into its own cache), each rank instead builds the model on the meta device and reads
only the rows of each tensor its shard holds (FSDP2 splits dim 0 into ``ceil(rows / S)``-row
chunks), cast to the parameter's dtype: a node reads the model once in all, nothing crosses the
network, and no rank holds a full copy in host memory. The values are those the broadcast gives, bit
for bit (tests/parallel/test_sharding.py).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from agentrl.parallel import ranks
from agentrl.parallel.buckets import _rows, _shard_dim


def checkpoint_files(path: str) -> dict[str, Path] | None:
    """Tensor name -> safetensors file of the checkpoint directory ``path`` (one file, or a sharded
    checkpoint's index); None when ``path`` is not a local directory of safetensors files."""
    root = Path(path)
    index, single = root / "model.safetensors.index.json", root / "model.safetensors"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files = {name: root / file for name, file in weight_map.items()}
        return files if files and all(f.is_file() for f in set(files.values())) else None
    if single.is_file():
        from safetensors import safe_open

        with safe_open(str(single), framework="pt") as f:
            return dict.fromkeys(f.keys(), single)
    return None


def local_checkpoint(path: str) -> str | None:
    """A local directory of ``path``'s safetensors files: ``path`` itself, or for a hub name its
    snapshot in this node's hub cache (``huggingface_hub.snapshot_download`` fetches the weights
    there when they are missing, once per node: its file lock serialises the node's ranks). None
    when there is none (no hub here, a ``.bin`` checkpoint)."""
    if Path(path).is_dir():
        return path if checkpoint_files(path) is not None else None
    if Path(path).exists() or path.count("/") != 1:
        return None
    try:
        from huggingface_hub import snapshot_download

        local = snapshot_download(path, allow_patterns=["*.safetensors", "*.json"])
    except Exception:  # offline without it cached, no such repository: rank 0 broadcasts instead
        return None
    return local if checkpoint_files(local) is not None else None


def shard_source(path: str) -> str | None:
    """The directory this rank reads its shards of ``path`` from, when every rank has one
    (``local_checkpoint``; collective); None in one process (nothing to broadcast) or when a rank
    has none."""
    _, world = ranks.rank_and_world()
    if world == 1:
        return None
    local = local_checkpoint(path)
    return local if ranks.all_ranks(local is not None) else None


def first_load(path: str, fills: bool, adapters: bool, log: Callable[[str], None]) -> str | None:
    """Where every rank reads its own shards of ``path`` from (``shard_source``) when a sharded
    model is to be filled from it (``fills``) on several ranks; None when rank 0 reads it and sends
    every tensor to the others instead (``adapters``: LoRA, whose adapters rank 0 draws; or a rank
    without the checkpoint's files). Collective; rank 0 logs which."""
    rank, world = ranks.rank_and_world()
    if not fills or world == 1:
        return None
    source = None if adapters else shard_source(path)
    if rank == 0:
        why = (
            "LoRA: rank 0 draws the adapters"
            if adapters
            else "not every rank has its files, locally or from the hub"
        )
        log(
            f"FSDP2: every rank reads its own shards of {source}"
            if source
            else f"FSDP2: rank 0 reads {path} and sends every tensor to the other ranks ({why})"
        )
    return source


def read_own_shards(model: nn.Module, path: str) -> None:
    """Fill this rank's shard of every parameter of ``model`` (sharded by FSDP2, its memory given by
    ``sharding.materialize(..., broadcast=False)``) from the checkpoint at ``path``: the rows of each
    tensor its shard holds, cast to the parameter's dtype. A parameter the checkpoint lacks raises,
    naming it."""
    from safetensors import safe_open

    files = checkpoint_files(path)
    if files is None:
        raise FileNotFoundError(f"{path}: no safetensors checkpoint here to read shards from")
    missing = [name for name, _ in model.named_parameters() if name not in files]
    if missing:
        raise KeyError(f"{path} lacks {len(missing)} of the model's parameters ({', '.join(missing[:5])})")
    by_file: dict[Path, list[tuple[str, torch.Tensor]]] = {}
    for name, param in model.named_parameters():
        by_file.setdefault(files[name], []).append((name, param))
    with torch.no_grad():
        for file, params in by_file.items():
            with safe_open(str(file), framework="pt") as f:
                for name, t in params:
                    _read_rows(f, name, t)


def _read_rows(f: object, name: str, p: torch.Tensor) -> None:
    """Parameter ``p``'s own rows of tensor ``name`` in the open safetensors file ``f``."""
    local = p.to_local() if hasattr(p, "to_local") else p  # type: ignore[operator]
    if not hasattr(p, "to_local") or p.dim() == 0:
        local.copy_(f.get_tensor(name))  # type: ignore[attr-defined]
        return
    mesh, dim = _shard_dim(p)
    size, me = mesh.size(dim), mesh.get_local_rank(dim)  # type: ignore[attr-defined]
    rows = p.shape[0]
    chunk = math.ceil(rows / size)
    n = _rows(rows, chunk, me)
    if n:
        part = f.get_slice(name)[me * chunk : me * chunk + n]  # type: ignore[attr-defined]
        local.copy_(part.reshape(local.shape))
