"""``rollout.sync.transport: cuda_ipc``: the workers, on trainer rank 0's GPU (the record's
``trainer_gpu``, which ``parallel/placement.py`` checks), open CUDA IPC handles to the bucket's tensors
and copy from them; the tensors stay referenced in the trainer until every worker has answered.
What has run on a GPU: docs/scaling.md ("Beyond one process per GPU")."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentrl.sync.transports.base import Link, Transport

if TYPE_CHECKING:
    from torch import Tensor

    from agentrl.engines.base import WeightReceiver


class CudaIpc(Transport):
    def send(self, link: Link, workers: list[Any], bucket: list[tuple[str, Tensor]]) -> None:
        from agentrl.engines.vllm_worker import cuda_ipc_blob

        alive = [(n, t.contiguous()) for n, t in bucket]
        if not all(t.is_cuda for _, t in alive):
            raise ValueError(
                f"rollout.sync.transport={self.name} needs the trainer's weights on a GPU; these are on "
                f"{alive[0][1].device}: use rollout.sync.transport=object_store"
            )
        blob = cuda_ipc_blob(alive)
        link.answers(
            [w.receive_weights.remote(self.name, blob) for w in workers], f"receive_weights({self.name})"
        )
        del alive

    def receive(self, engine: WeightReceiver, payload: Any) -> int:
        """Copied into the engine, and the copy finished, before this returns and the trainer may free
        the tensors. A vLLM engine takes a copy of its own first (its worker process cannot reopen
        memory this process opened)."""
        import torch

        from agentrl.engines.hf import HFEngine
        from agentrl.engines.vllm_worker import open_cuda_ipc_blob

        bucket = open_cuda_ipc_blob(payload)
        if not isinstance(engine, HFEngine):
            bucket = {n: t.clone() for n, t in bucket.items()}
        engine.load_weight_bucket(bucket.items())
        torch.cuda.synchronize()
        return len(bucket)
