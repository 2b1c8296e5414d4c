"""``rollout.sync.transport: object_store``, the default: each bucket is put in Ray's object store once,
as one safetensors blob, every worker copies it in place, and the ref is dropped, so the sender and
the store hold about one bucket at a time. Any placement can use it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentrl.engines.vllm import safetensors_blob
from agentrl.sync.transports.base import Link, Transport

if TYPE_CHECKING:
    from torch import Tensor

    from agentrl.engines.base import WeightReceiver


class ObjectStore(Transport):
    def send(self, link: Link, workers: list[Any], bucket: list[tuple[str, Tensor]]) -> None:
        """A blob rather than the tensors: put and loaded as tensors, buckets grew the sender's heap
        well past one bucket (docs/performance.md, "Weight sync")."""
        import ray

        ref = ray.put(safetensors_blob(dict(bucket)))
        link.answers(
            [w.receive_weights.remote(self.name, ref) for w in workers], f"receive_weights({self.name})"
        )

    def receive(self, engine: WeightReceiver, payload: Any) -> int:
        """``payload``: the blob, which Ray has fetched from the object store."""
        from safetensors.torch import load

        bucket = load(payload)
        engine.load_weight_bucket(bucket.items())
        return len(bucket)
