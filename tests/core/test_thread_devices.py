"""Every thread agentrl starts runs on the process's CUDA device (``timeouts.start_thread``).

The current CUDA device is per thread and a new thread starts on device 0, so on trainer rank r > 0
a helper thread that steps an engine would launch Triton kernels, ``torch.cuda.synchronize()`` and
graph streams on GPU 0. No GPU here: ``fake_cuda`` replaces torch.cuda's device calls with a
per-thread record (a new thread reads 0, as CUDA's runtime does), and each test asks, from inside
the threads that call an engine, which device they were on."""

from __future__ import annotations

import ast
import threading

import pytest
import torch

from agentrl import timeouts
from agentrl.engines.base import Completion, SamplingParams
from tests.helpers import ROOT, fake_vllm

RANK_DEVICE = 1


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda as on trainer rank 1 of a 2-GPU node: ``init_from_env`` made GPU 1 current on the
    main thread and bound it for the process; every other thread starts on 0."""
    local = threading.local()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: getattr(local, "device", 0))
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: setattr(local, "device", int(d)))
    torch.cuda.set_device(RANK_DEVICE)
    monkeypatch.setattr(timeouts, "_process_device", RANK_DEVICE, raising=False)  # bind_cuda_device's
    return local


class RecordingEngine:
    """A list-taking engine that records the CUDA device of each thread that calls it."""

    def __init__(self) -> None:
        self.devices: list[int] = []

    def generate(self, prompts, params):
        self.devices.append(torch.cuda.current_device())
        return [Completion([1], [-0.5], "length") for _ in prompts]


def test_the_request_batchers_thread_is_on_the_ranks_device(fake_cuda):
    from agentrl.rollout.async_runner import RequestBatcher

    engine = RecordingEngine()
    batcher = RequestBatcher(engine)  # its own thread (the async runner and agents use it)
    try:
        batcher.submit([1, 2], SamplingParams(max_tokens=1)).result(timeout=10)
    finally:
        batcher.close()
    assert engine.devices == [RANK_DEVICE]


def test_the_pipelines_batch_threads_are_on_the_ranks_device(fake_cuda):
    from agentrl.rollout.pipeline import RolloutPipeline

    class Sampler:
        def state(self):
            return {}

        def next(self, n):
            return list(range(n))

    seen: list[int] = []

    def run_batch(label, tasks):  # a batch thread, started by the dispatcher thread
        seen.append(torch.cuda.current_device())
        return []

    pipe = RolloutPipeline(Sampler(), 2, 2, 1, "drop", run_batch, data_wait_s=10)
    try:
        pipe.take()
    finally:
        pipe.close(timeout=10)
    assert seen and set(seen) == {RANK_DEVICE}


def test_vllms_driver_thread_steps_the_engine_on_the_ranks_device(fake_cuda, monkeypatch, tiny_model_dir):
    monkeypatch.setitem(__import__("sys").modules, "vllm", fake_vllm.install())
    from agentrl.engines.vllm import VLLMEngine

    seen: list[int] = []
    monkeypatch.setattr(fake_vllm, "STEP_HOOKS", [lambda: seen.append(torch.cuda.current_device())])
    engine = VLLMEngine(str(tiny_model_dir), device="cuda")  # the stand-in: nothing runs on a GPU
    out = engine.submit([1, 2, 3], SamplingParams(max_tokens=1, seed=3)).result(timeout=10)
    assert len(out.token_ids) == 1
    assert seen and set(seen) == {RANK_DEVICE}


def test_bounded_calls_and_pools_run_on_the_ranks_device(fake_cuda):
    device = torch.cuda.current_device
    assert timeouts.call_with_timeout(device, 10, "a call") == RANK_DEVICE
    calls = timeouts.BoundedCalls()
    try:
        assert calls.call(device, 10, "a call") == RANK_DEVICE
    finally:
        calls.close()
    pool = timeouts.DaemonThreadPool(2, "test-pool")
    try:
        assert pool.submit(device).result(timeout=10) == RANK_DEVICE
    finally:
        pool.shutdown()
    # a thread started from a helper thread still takes the process's device, not its creator's
    torch.cuda.set_device(0)
    assert timeouts.call_with_timeout(device, 10, "a call") == RANK_DEVICE


def test_without_a_bound_device_a_thread_takes_its_creators(fake_cuda, monkeypatch):
    monkeypatch.setattr(
        timeouts, "_process_device", None, raising=False
    )  # a Ray worker: its one GPU is cuda:0
    torch.cuda.set_device(3)
    assert timeouts.call_with_timeout(torch.cuda.current_device, 10, "a call") == 3


def test_init_from_env_binds_the_ranks_gpu(fake_cuda, monkeypatch):
    from agentrl.parallel import ranks

    monkeypatch.setattr(timeouts, "_process_device", None)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(ranks.dist, "is_initialized", lambda: True)  # joined already: only the device
    monkeypatch.setattr(ranks.dist, "get_rank", lambda: 1)
    monkeypatch.setattr(ranks.dist, "get_world_size", lambda: 2)
    assert ranks.init_from_env() == (1, 2)
    assert timeouts.thread_cuda_device() == 1


def test_agentrl_starts_threads_only_through_start_thread():
    """A ``threading.Thread(...)`` anywhere else would start on device 0 again."""
    found = []
    for path in (ROOT / "agentrl").rglob("*.py"):
        if path == ROOT / "agentrl" / "timeouts.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("threading.Thread", "Thread"):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []
