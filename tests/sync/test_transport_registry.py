"""Weight transports by name (``sync/registry.py``): a transport registered here, in the test, is
one class with both ends that the config accepts, the placement judges by its record, and a pool's
update runs end to end (the trainer's ``PoolWeights`` into a plain ``RolloutWorker``, no Ray)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
import torch

from agentrl.assembly import components
from agentrl.config import ConfigError, load_config
from agentrl.config.schema import SyncConfig
from agentrl.parallel.placement import Launch, Rollouts, place
from agentrl.rollout.ray_worker import RolloutWorker
from agentrl.sync.ray_pool import PoolWeights
from agentrl.sync.registry import TRANSPORTS, TransportRecord, register_transport
from agentrl.sync.transports.base import Link, Transport


class Recording(Transport):
    """Hands each bucket to the workers as it is (copies of the tensors) and records both ends."""

    calls: ClassVar[list[tuple[str, str, list[str]]]] = []

    def send(self, link: Link, workers: list[Any], bucket: list[tuple[str, torch.Tensor]]) -> None:
        Recording.calls.append(("send", self.name, [n for n, _ in bucket]))
        copies = [(n, t.clone()) for n, t in bucket]
        link.answers([w.receive_weights.remote(self.name, copies) for w in workers], "receive_weights")

    def receive(self, engine: Any, payload: Any) -> int:
        Recording.calls.append(("receive", self.name, [n for n, _ in payload]))
        engine.load_weight_bucket(payload)
        return len(payload)


@pytest.fixture
def recording():
    Recording.calls.clear()
    yield register_transport(TransportRecord("recording", Recording, route="handed over as tensors"))
    del TRANSPORTS["recording"]


class InProcess:
    """A Ray actor handle's stand-in: ``handle.method.remote(*args)`` runs the plain worker's method
    at once and its answer stands for the ref."""

    def __init__(self, worker: RolloutWorker) -> None:
        self.worker = worker

    def __getattr__(self, name: str) -> SimpleNamespace:
        return SimpleNamespace(remote=lambda *args: getattr(self.worker, name)(*args))


def worker_config(tmp_path, model_dir, transport: str):
    overrides = [f"model.path={model_dir}", "run.device=cpu", f"run.output_dir={tmp_path}"]
    return load_config(None, [*overrides, "rollout.workers=1", f"rollout.sync.transport={transport}"])


def test_a_transport_registered_in_a_test_carries_an_update_into_a_worker(
    recording, tmp_path, tiny_model_dir
):
    cfg = worker_config(tmp_path, tiny_model_dir, "recording")
    worker = RolloutWorker(components.worker_spec(cfg, str(tiny_model_dir)))
    answered: list[str] = []

    def answers(calls: list, what: str, limit_s: float | None = None, setting: str | None = None) -> list:
        answered.append(what)
        return list(calls)  # the stand-in's calls have answered already

    pool = PoolWeights(cfg.rollout.sync.transport, 60.0, False, lambda: [InProcess(worker)], answers, [])
    state = worker.engine.model.state_dict()
    names = list(state)[:3]
    new = {n: state[n] + 1.0 for n in names}
    pool.begin()
    pool.load_bucket(list(new.items())[:2])
    pool.load_bucket(list(new.items())[2:])
    assert pool.finish() == 1 and worker.version() == 1
    assert all(torch.equal(worker.engine.model.state_dict()[n], t) for n, t in new.items())
    assert Recording.calls == [
        ("send", "recording", names[:2]),
        ("receive", "recording", names[:2]),
        ("send", "recording", names[2:]),
        ("receive", "recording", names[2:]),
    ]
    assert answered == ["begin_weight_update", "receive_weights", "receive_weights", "finish_weight_update"]
    assert pool.lock.acquire(blocking=False)  # the update let go of its lock
    pool.lock.release()
    pool.close()


def test_a_name_already_taken_is_refused(recording):
    with pytest.raises(ValueError, match="'broadcast' is already registered"):
        register_transport(TransportRecord("broadcast", Recording, route="again"))
    with pytest.raises(ValueError, match="'recording' is already registered"):
        register_transport(TransportRecord("recording", Recording, route="again"))
    assert TRANSPORTS["broadcast"].transport != Recording


def test_the_config_takes_its_choices_from_the_registry(recording, tmp_path, tiny_model_dir):
    (field,) = [f for f in dataclasses.fields(SyncConfig) if f.name == "transport"]
    assert field.metadata["choices"]() == ["object_store", "broadcast", "cuda_ipc", "recording"]
    assert worker_config(tmp_path, tiny_model_dir, "recording").rollout.sync.transport == "recording"
    with pytest.raises(ConfigError) as err:
        worker_config(tmp_path, tiny_model_dir, "pigeon")
    msg = str(err.value)
    assert "rollout.sync.transport" in msg and "pigeon" in msg, msg
    assert all(name in msg for name in ("object_store", "broadcast", "cuda_ipc", "recording")), msg


def test_a_pool_refuses_an_unknown_transport_naming_the_choices():
    with pytest.raises(
        ValueError, match=r"'pigeon' is not a registered .* object_store, broadcast, cuda_ipc"
    ):
        PoolWeights("pigeon", 60.0, False, list, lambda *a: [], [])


def test_the_placement_reads_what_a_transport_needs_from_its_record():
    """A transport's needs are its record's fields, not its name: a new one that needs a GPU per
    member, or the trainer's GPU, is refused where the map cannot give it."""
    register_transport(TransportRecord("own", Recording, "own GPUs", own_gpu_each=True))
    register_transport(
        TransportRecord("near", Recording, "on the host", route_on_gpu="near", trainer_gpu=True)
    )
    try:
        one, two = Launch(1, 1, 1), Launch(1, 2, 1)

        def refused(launch: Launch, transport: str, worker_gpus: float) -> str:
            p = place(launch, Rollouts(workers=1, worker_gpus=worker_gpus, transport=transport))
            return " ".join(q.message for q in p.problems if q.key == "rollout.sync.transport")

        assert "rollout worker 0 shares GPU 0 with trainer rank 0" in refused(one, "own", 0.5)
        assert refused(two, "own", 1.0) == ""
        msg = refused(two, "near", 1.0)
        assert "transport=near (near) needs every worker on trainer rank 0's GPU" in msg, msg
        assert "object_store or broadcast or own" in msg, msg  # the registered ones that would do
        assert refused(one, "near", 0.5) == ""
        assert place(two, Rollouts(workers=1, worker_gpus=1.0, transport="near")).groups[-1].backend == "near"
        assert (
            place(Launch(1, 0, 1), Rollouts(workers=1, transport="near")).groups[-1].backend == "on the host"
        )
    finally:
        del TRANSPORTS["own"], TRANSPORTS["near"]


def test_the_registry_imports_neither_torch_nor_ray():
    """The config reads the names from it: it sits below ``agentrl.config`` and stays light."""
    code = "import sys, agentrl.sync.registry as r; print(sorted(m for m in ('torch', 'ray') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"
