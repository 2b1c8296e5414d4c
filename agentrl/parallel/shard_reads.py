"""FSDP2's first load without a broadcast: every rank reads its own shards from the checkpoint.

The broadcast (``sharding.materialize``: torch's ``set_model_state_dict(broadcast_from_rank0=True)``)
sends every tensor whole from rank 0 to each other rank, one tensor at a time, and under CPU offload
over gloo: rank 0 sends W - 1 copies of the model (docs/scaling.md: measured, and what it costs a
32 B model on 32 ranks). When every rank can read the checkpoint's safetensors files (one
filesystem, or a copy on each node), each rank instead builds the model on the meta device and reads
only the rows of each tensor its shard holds (FSDP2 splits dim 0 into ``ceil(rows / S)``-row
chunks), cast to the parameter's dtype: a node reads the model once in all, nothing crosses the
network, and no rank holds a full copy in host memory. The values are those the broadcast gives, bit
for bit (tests/parallel/test_sharding.py).
"""

from __future__ import annotations

import json
import math
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


def every_rank_reads(path: str) -> bool:
    """Whether every rank sees ``path``'s safetensors files (collective; False in one process, where
    there is nothing to broadcast)."""
    _, world = ranks.rank_and_world()
    return world > 1 and ranks.all_ranks(checkpoint_files(path) is not None)


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
    for name, p in model.named_parameters():
        by_file.setdefault(files[name], []).append((name, p))
    with torch.no_grad():
        for file, params in by_file.items():
            with safe_open(str(file), framework="pt") as f:
                for name, p in params:
                    _read_rows(f, name, p)


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
