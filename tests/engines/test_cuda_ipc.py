"""CUDA IPC blobs between processes of one node (``engines/vllm_worker.py``), without a GPU: torch's
device queries are stood in for, and a handle's rebuild records what it opened. A blob may carry a
copy of a bucket per GPU (a tensor-parallel vLLM engine in a Ray worker, ``BucketRoute.per_gpu``):
each vLLM worker opens the copy on its own GPU, never memory on another worker's GPU (which would
make it a CUDA context there after vLLM had measured that GPU's memory)."""

from __future__ import annotations

import pickle
import types

import pytest
import torch

from agentrl.engines import vllm_worker
from agentrl.engines.vllm import BucketRoute


def opened(*args):
    """A handle's rebuild: which sender's tensor, on which local device index."""
    return f"{args[0]} on cuda:{args[6]}"


def blob(*uuids: str) -> bytes:
    return pickle.dumps([(u, [("w", (opened, [f"{u}'s w", 0, 0, 0, 0, 0, 99]))]) for u in uuids])


@pytest.fixture
def two_gpus(monkeypatch):
    """A process that sees GPUs GPU-a and GPU-b (indices 0 and 1); ``current`` is its device."""
    uuids = ["GPU-a", "GPU-b"]
    state = {"current": 0}
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: state["current"])
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(uuid=uuids[i]))
    return state


def test_each_worker_opens_the_copy_on_its_own_gpu(two_gpus):
    both = blob("GPU-a", "GPU-b")
    assert vllm_worker.open_cuda_ipc_blob(both) == {"w": "GPU-a's w on cuda:0"}
    two_gpus["current"] = 1  # tensor-parallel worker 1
    assert vllm_worker.open_cuda_ipc_blob(both) == {"w": "GPU-b's w on cuda:1"}


def test_one_copy_is_opened_where_it_is_and_an_unseen_gpu_is_named(two_gpus):
    two_gpus["current"] = 1  # e.g. an HF worker whose only bucket is on the trainer's GPU-a
    assert vllm_worker.open_cuda_ipc_blob(blob("GPU-a")) == {"w": "GPU-a's w on cuda:0"}
    with pytest.raises(RuntimeError, match="the trainer's GPU GPU-z is not visible to this process"):
        vllm_worker.open_cuda_ipc_blob(blob("GPU-z"))


def test_a_tensor_parallel_engine_copies_the_bucket_to_each_of_its_gpus():
    class Tensor:  # stands in for a CUDA tensor: where .to() would put it
        def __init__(self, where: str) -> None:
            self.where = where

        def to(self, device: str) -> Tensor:
            return Tensor(device)

    items = [("a", Tensor("cuda:0")), ("b", Tensor("cuda:0"))]
    tp2 = BucketRoute("cpu", 2, in_process=False)  # "cpu": no CUDA context made here
    copies = tp2.per_gpu(items)  # type: ignore[arg-type]
    assert [[t.where for _, t in c] for c in copies] == [["cuda:0", "cuda:0"], ["cuda:1", "cuda:1"]]
    assert BucketRoute("cpu", 1, in_process=False).per_gpu(items) == [items]  # type: ignore[arg-type]
    assert BucketRoute("cpu", 2, in_process=True).per_gpu(items) == [items]  # type: ignore[arg-type]
