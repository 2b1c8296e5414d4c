"""How the policy is spread over the data-parallel ranks (``trainer.strategy``).

``ddp`` (``Replicated``): every rank holds the whole model, its gradients and AdamW's states
(~16 bytes per fp32 parameter); DDP all-reduces the gradients. One process: the model as it is.

``fsdp2`` (``Sharded``): FSDP2 (``torch.distributed.fsdp.fully_shard``) shards parameters, gradients
and optimizer states over the ranks. Each decoder layer is one unit, all-gathered for its forward and
backward and resharded after, and the root (embeddings, final norm, head) is another. With
``trainer.fsdp.replicas`` R > 1 the W ranks form an R × W/R mesh (HSDP): parameters are sharded
within a group of W/R ranks (a node) and replicated across the R groups, so the big all-gathers stay
inside a node. ``trainer.bf16`` becomes FSDP2's ``MixedPrecisionPolicy``: the forward and backward
run in bf16, gradients are reduced in fp32 and the optimizer updates fp32 master weights
(``model.dtype: float32``). ``trainer.fsdp.cpu_offload`` keeps the shards and the optimizer on the
CPU.

Both are exact: rank r of W trains on its rows of every mini-batch with its loss scaled by W (the
gradient reductions average), so the update is the single-process update up to float summation
order. What FSDP2 adds to the learner's loop:

- Every forward of a sharded module is a collective (it all-gathers each layer), so every rank must
  run the same number of forwards: ``micro_batches`` pads a rank with fewer rows with a dummy
  micro-batch of loss scale 0, and the shared-prefix forward (a data-dependent number of forwards)
  is off.
- The no-grad passes (π_old, the KL reference, the overlays) compute only the rank's own rows, and
  ``gather_rows`` assembles the whole batch's per-token statistics on every rank, so token weights
  (STARE's selection and gate) stay computed over the whole batch. ``ddp`` does the same.
- The engine needs full weights: ``engine_buckets`` gathers them a bucket per collective, in the
  engine's dtype (``parallel/buckets.py``); ``full_parameters`` one tensor at a time.
- Loading: rank 0 reads the checkpoint; the other ranks build the model on the meta device and
  receive their shards from rank 0 (``materialize``), so a node holds one full copy in host memory,
  not one per rank. Checkpoints are DCP (``agentrl.training.checkpoint``): each rank writes its shards.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import Tensor, nn

from agentrl.config import ConfigError, TrainerConfig
from agentrl.parallel import ranks
from agentrl.parallel.buckets import gather_buckets, pack_buckets


@dataclass
class Micro:
    """One micro-batch of a rank: its rows and its loss scale (0 for a dummy that only keeps the
    ranks' collectives in step: its loss, statistics and clip status are not used)."""

    rows: Tensor
    scale: float

    @property
    def dummy(self) -> bool:
        return self.scale == 0.0


class Strategy(Protocol):
    """What the learner asks of a data-parallel layout."""

    name: str
    rank: int
    world: int
    device: torch.device
    equal_forwards: bool
    """Every rank must run the same number of forwards (FSDP2's all-gathers are collectives)."""

    def prepare(self, model: nn.Module) -> nn.Module:
        """Wrap or shard the policy in place; returns the module to run forward/backward through."""
        ...

    def prepare_frozen(self, model: nn.Module) -> nn.Module:
        """The same for a frozen model (the KL reference): sharded like the policy, or as it is."""
        ...

    def set_sync(self, module: nn.Module, last: bool) -> None:
        """Reduce gradients in this backward only when ``last`` (the mini-batch's last micro-batch)."""
        ...

    def clip_grad_norm(self, model: nn.Module, max_norm: float) -> float:
        """Clip the global gradient norm; returns the norm before clipping (the same on every rank)."""
        ...

    def full_parameters(self, model: nn.Module) -> Iterator[tuple[str, Tensor]]:
        """(name, full tensor) of every parameter, in the same order on every rank (collective)."""
        ...

    def engine_buckets(
        self, model: nn.Module, bucket_bytes: float, dtype: torch.dtype | None
    ) -> Iterator[list[tuple[str, Tensor]]]:
        """Every parameter, whole, in buckets of at most ``bucket_bytes`` for the engine
        (``parallel/buckets.py``), in the same order on every rank (collective)."""
        ...

    def release(self, model: nn.Module) -> None:
        """Free what a no-grad pass left gathered (only a backward frees it otherwise)."""
        ...


class Replicated:
    """One process, or DDP: the whole model on every rank."""

    name = "ddp"
    equal_forwards = False

    def __init__(self, rank: int, world: int, device: torch.device) -> None:
        self.rank, self.world, self.device = rank, world, device

    def prepare(self, model: nn.Module) -> nn.Module:
        if self.world <= 1:
            return model
        # buffers (rotary frequencies) are constants: not broadcasting them keeps DDP's forward
        # free of collectives, so ranks may run different numbers of micro-batches
        ids = [self.device.index] if self.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=ids, broadcast_buffers=False)

    def prepare_frozen(self, model: nn.Module) -> nn.Module:
        return model

    def set_sync(self, module: nn.Module, last: bool) -> None:
        ranks.set_sync(module, last)

    def clip_grad_norm(self, model: nn.Module, max_norm: float) -> float:
        return float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))

    def full_parameters(self, model: nn.Module) -> Iterator[tuple[str, Tensor]]:
        for name, p in model.named_parameters():
            yield name, p.detach()

    def engine_buckets(
        self, model: nn.Module, bucket_bytes: float, dtype: torch.dtype | None
    ) -> Iterator[list[tuple[str, Tensor]]]:
        """Views of the parameters (the engine casts as it copies: nothing is copied here)."""
        return pack_buckets(self.full_parameters(model), bucket_bytes)

    def release(self, model: nn.Module) -> None:
        pass


class Sharded:
    """FSDP2 over a 1-D mesh (``replicas`` = 1) or an HSDP mesh (``replicas`` × ``world/replicas``)."""

    name = "fsdp2"
    equal_forwards = True

    def __init__(
        self,
        rank: int,
        world: int,
        device: torch.device,
        replicas: int = 1,
        bf16: bool = False,
        cpu_offload: bool = False,
        reshard_after_forward: bool = True,
        reduce_every_micro_batch: bool = False,
    ) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

        check_mesh(world, replicas)
        self.rank, self.world, self.device = rank, world, device
        ensure_process_group(device)
        shape = (replicas, world // replicas) if replicas > 1 else (world,)
        names = ("replicate", "shard") if replicas > 1 else ("shard",)
        self.mesh = init_device_mesh(device.type, shape, mesh_dim_names=names)
        self.mp = (
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            if bf16
            else MixedPrecisionPolicy()
        )
        # pinned host memory needs an accelerator: on a CPU-only machine the offload is unpinned
        self.offload = CPUOffloadPolicy(pin_memory=device.type == "cuda") if cpu_offload else None
        self.reshard_after_forward = reshard_after_forward
        self.reduce_every_micro_batch = reduce_every_micro_batch

    def prepare(self, model: nn.Module) -> nn.Module:
        from torch.distributed.fsdp import fully_shard

        kwargs: dict[str, Any] = {"mesh": self.mesh, "mp_policy": self.mp}
        if self.offload is not None:
            kwargs["offload_policy"] = self.offload
        for layer in decoder_layers(model):
            fully_shard(layer, reshard_after_forward=self.reshard_after_forward, **kwargs)
        # the root's parameters are used last in the forward: keeping them gathered saves an all-gather
        fully_shard(model, reshard_after_forward=False, **kwargs)
        return model

    def prepare_frozen(self, model: nn.Module) -> nn.Module:
        return self.prepare(model)

    def set_sync(self, module: nn.Module, last: bool) -> None:
        # off: each rank accumulates unsharded gradients until the last micro-batch's reduce-scatter
        module.set_requires_gradient_sync(last or self.reduce_every_micro_batch)  # type: ignore[operator]

    def clip_grad_norm(self, model: nn.Module, max_norm: float) -> float:
        params = [p for p in model.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    def full_parameters(self, model: nn.Module) -> Iterator[tuple[str, Tensor]]:
        for name, p in model.named_parameters():
            yield name, full_tensor(p)

    def engine_buckets(
        self, model: nn.Module, bucket_bytes: float, dtype: torch.dtype | None
    ) -> Iterator[list[tuple[str, Tensor]]]:
        """Each bucket's shards cast to the engine's ``dtype`` and gathered by one collective."""
        return gather_buckets(model.named_parameters(), bucket_bytes, dtype, self.device)

    def release(self, model: nn.Module) -> None:
        # the root (always) and, with reshard_after_forward=False, every layer stay gathered after a
        # forward until their backward: a no-grad pass has none, so free them here
        from torch.distributed.fsdp import FSDPModule

        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.reshard()


def full_tensor(t: Tensor) -> Tensor:
    """A sharded (DTensor) parameter gathered whole; a plain tensor as it is."""
    t = t.detach()
    return t.full_tensor() if hasattr(t, "full_tensor") else t  # type: ignore[no-any-return]


def make_strategy(t: TrainerConfig, rank: int, world: int, device: torch.device) -> Strategy:
    """The strategy ``trainer.strategy`` names, on this rank."""
    if t.strategy == "fsdp2":
        f = t.fsdp
        return Sharded(
            rank,
            world,
            device,
            f.replicas,
            t.computes_bf16,
            f.cpu_offload,
            f.reshard_after_forward,
            reduce_every_micro_batch=f.grad_reduce == "micro_batch",
        )
    return Replicated(rank, world, device)


def check_mesh(world: int, replicas: int) -> None:
    """HSDP needs the ranks to split evenly into ``replicas`` groups: a clear error before any work."""
    if replicas < 1 or world % replicas:
        raise ConfigError(
            f"trainer.fsdp.replicas={replicas} does not divide the world size {world}: HSDP needs "
            f"world = replicas × shard group size (e.g. 4 nodes × 8 GPUs: replicas=4, 32 ranks). "
            f"Valid replicas for {world} ranks: {[r for r in range(1, world + 1) if world % r == 0]}"
        )


def ensure_process_group(device: torch.device) -> None:
    """FSDP2 needs a process group even on one process (no torchrun): a single-rank one then."""
    if dist.is_initialized():
        return
    dist.init_process_group(ranks.backend_for(), store=dist.HashStore(), rank=0, world_size=1)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks FSDP2 shards one by one: modules whose class transformers lists in the
    model's ``_no_split_modules`` (``Qwen2DecoderLayer``, ``LlamaDecoderLayer``...)."""
    names: set[str] = set()
    for m in model.modules():
        names.update(getattr(m, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ConfigError(
            f"trainer.strategy=fsdp2: cannot find the decoder layers of {type(model).__name__} (no "
            "module class listed in its _no_split_modules); use trainer.strategy=ddp for this model"
        )
    return layers


# -- loading on the meta device ------------------------------------------------------------------
@contextmanager
def meta_parameters() -> Iterator[None]:
    """Build modules with parameters on the meta device (no memory) and real buffers: the rotary
    frequencies a model computes at construction are not in its state dict, so they must be real."""
    register = nn.Module.register_parameter

    def register_on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        register(module, name, param)
        if param is not None:
            kind: Any = type(param)
            module._parameters[name] = kind(param.to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = register_on_meta  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


def on_meta(model: nn.Module) -> bool:
    return any(p.is_meta for p in model.parameters())


def materialize(
    model: nn.Module, device: torch.device, from_rank0: dict[str, Any] | None, broadcast: bool = True
) -> None:
    """After ``prepare``: give meta shards memory on ``device`` and, with ``broadcast``, fill every
    rank's shards from rank 0's full state dict (``from_rank0``; None on the other ranks; collective).
    Without it the shards are left uninitialised for a checkpoint to fill. Buffers keep their values."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    if on_meta(model):
        model.to_empty(device=device)
        with torch.no_grad():
            for name, b in model.named_buffers():
                b.copy_(buffers[name])
    if broadcast:
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(model, from_rank0 or {}, options=options)  # type: ignore[arg-type]
