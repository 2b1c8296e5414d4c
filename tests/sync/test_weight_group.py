"""The weight-sync group's NCCL branch (``sync/weight_group.py``), which CPU wheels cannot run (they
have no ``ProcessGroupNCCL``): a recording stand-in for torch's class checks the calls against the
API torch declares for it (``torch/_C/_distributed_c10d.pyi``: ``ProcessGroupNCCL(store, rank, size,
options)``, ``Options()._timeout``, ``Backend.eager_connect_single_device(device)``, ``abort()``).
The gloo branch runs for real in tests/sync/test_weight_sync.py; the NCCL one on a GPU in the GPU
check (a group of one rank, tests/test_gpu.py) and on several GPUs in scripts/gpu_check_multi.sh."""

from __future__ import annotations

import inspect
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from agentrl.sync import weight_group


def declared(cls: str) -> str:
    """The text of ``cls``'s declaration in torch's stub of its C++ bindings."""
    stub = (Path(torch.__file__).parent / "_C" / "_distributed_c10d.pyi").read_text()
    start = min(i for i in (stub.find(f"class {cls}("), stub.find(f"class {cls}:")) if i >= 0)
    end = stub.find("\nclass ", start + 1)
    return stub[start:end]


@pytest.fixture
def nccl(monkeypatch):
    """A ``ProcessGroupNCCL`` that records how it is built, connected, used and left."""
    calls: list[tuple] = []

    class Options:
        def __init__(self, is_high_priority_stream: bool = False) -> None:
            self._timeout = timedelta(0)

    class ProcessGroupNCCL:
        def __init__(self, store, rank, size, options) -> None:
            assert isinstance(options, Options)
            calls.append(("init", type(store).__name__, rank, size, options._timeout))

        def eager_connect_single_device(self, device) -> None:
            calls.append(("connect", device))

        def abort(self) -> None:
            calls.append(("abort",))

    ProcessGroupNCCL.Options = Options  # type: ignore[attr-defined]
    monkeypatch.setattr(dist, "ProcessGroupNCCL", ProcessGroupNCCL, raising=False)
    return calls


def test_the_nccl_calls_are_those_torch_declares():
    pg, backend = declared("ProcessGroupNCCL"), declared("Backend")
    assert "store: Store,\n        rank: int,\n        size: int,\n        options: Options," in pg
    assert "def __init__(self, is_high_priority_stream: bool = False)" in pg  # Options()
    assert "def _timeout(self, val: timedelta) -> None" in backend  # Options._timeout's setter
    assert "def eager_connect_single_device(self, device: torch.device | None)" in backend
    assert "def abort(self) -> None" in pg
    assert list(inspect.signature(weight_group.make_group).parameters) == [
        "store",
        "rank",
        "size",
        "device",
        "timeout_s",
    ]


def test_a_cuda_member_is_an_nccl_group_connected_eagerly_on_its_device(nccl):
    store = dist.HashStore()
    device = torch.device("cuda", 0)
    group = weight_group.make_group(store, 1, 3, device, timeout_s=42.0)
    # built from the store directly (never the default group), with the sync's timeout, and connected
    # at once on the member's own device, so a rank that cannot join fails here, not in a bucket
    assert nccl == [("init", "HashStore", 1, 3, timedelta(seconds=42.0)), ("connect", device)]
    weight_group.leave(group)
    assert nccl[-1] == ("abort",)  # its peers may be gone: aborted, not drained


def test_a_cpu_member_is_gloo_and_the_backends_are_named():
    assert weight_group.backend_for(torch.device("cpu")) == "gloo"
    assert weight_group.backend_for(torch.device("cuda", 1)) == "nccl"
    with pytest.raises(ValueError, match="no backend for tensors on meta"):
        weight_group.backend_for(torch.device("meta"))
