"""One record per weight transport (``rollout.sync.transport``): its name, the class that holds both
of its ends (``sync/transports/base.py``: ``Transport``), and the facts the placement and the config
ask of it instead of comparing names.

Who reads the records: the config loader (the valid names), ``parallel/placement.py`` (what a
placement must give the transport, and how ``agentrl plan`` shows it), ``sync/ray_pool.py`` (the
trainer's end) and ``rollout/ray_workers.py`` (each worker's end).

This module sits below ``agentrl.config`` and imports neither torch nor Ray: a record names its
class as ``"module:Class"``, imported when a sync first uses it. Adding a transport (docs/architecture.md,
"Where to add"): a ``Transport`` subclass in a file of its own, and its record,

    register_transport(TransportRecord("mine", "my_package.mine:Mine", route="my route"))

built-in ones in ``sync/transports/`` with their records below.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

OBJECT_STORE = "object_store"
"""The default transport, the one every placement can use (and a replacement worker's copy takes)."""


@dataclass(frozen=True)
class TransportRecord:
    name: str
    transport: str | type
    """The class with both ends: ``"module:Class"`` (imported when first used) or the class itself."""
    route: str
    """The way the weights travel, as ``agentrl plan`` shows it."""
    route_on_gpu: str | None = None
    """The same on a CUDA launch, where it differs (None: ``route``)."""
    own_gpu_each: bool = False
    """On a CUDA launch every member, trainer rank 0 and each worker, needs a GPU of its own (NCCL
    refuses two ranks on one device)."""
    trainer_gpu: bool = False
    """The workers open trainer rank 0's GPU memory: each must run on that GPU."""

    def route_for(self, cuda: bool) -> str:
        return (self.route_on_gpu or self.route) if cuda else self.route

    def load(self) -> type:
        """The transport's class (its module imported on first use)."""
        if isinstance(self.transport, type):
            return self.transport
        module, _, name = self.transport.partition(":")
        cls = getattr(importlib.import_module(module), name)
        assert isinstance(cls, type), self.transport
        return cls


TRANSPORTS: dict[str, TransportRecord] = {}


def register_transport(record: TransportRecord) -> TransportRecord:
    """Add a transport; a name already taken is refused."""
    if record.name in TRANSPORTS:
        raise ValueError(
            f"weight transport {record.name!r} is already registered ({TRANSPORTS[record.name].transport}); "
            "pick another name"
        )
    TRANSPORTS[record.name] = record
    return record


def transport_record(name: str) -> TransportRecord:
    """The record of ``rollout.sync.transport=name``; an unknown name raises naming the choices."""
    try:
        return TRANSPORTS[name]
    except KeyError:
        raise ValueError(
            f"rollout.sync.transport={name!r} is not a registered weight transport; choose one of "
            f"{', '.join(TRANSPORTS)} (or register yours: agentrl/sync/registry.py)"
        ) from None


def make_transport(name: str) -> Any:
    """A new ``Transport`` of ``name`` (the same class serves the trainer's end and a worker's)."""
    return transport_record(name).load()(name)


register_transport(
    TransportRecord(
        OBJECT_STORE, "agentrl.sync.transports.object_store:ObjectStore", "Ray object store (host memory)"
    )
)
register_transport(
    TransportRecord(
        "broadcast",
        "agentrl.sync.transports.broadcast:Broadcast",
        "gloo broadcast",
        route_on_gpu="NCCL broadcast",
        own_gpu_each=True,
    )
)
register_transport(
    TransportRecord(
        "cuda_ipc",
        "agentrl.sync.transports.cuda_ipc:CudaIpc",
        "CUDA IPC (the worker copies from rank 0's GPU memory)",
        trainer_gpu=True,
    )
)
