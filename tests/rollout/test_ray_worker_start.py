"""How a Ray rollout worker starts (``rollout/ray_workers.py``), without Ray: what a worker loads
(a vLLM worker no HF copy of the policy, an HF worker one copy in its engine's dtype, as
``agentrl plan`` counts it), and the order in which a pool starts its workers (those that share a
GPU one after another, ``placement.start_waves``)."""

from __future__ import annotations

import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

from agentrl import plan as planner
from agentrl.assembly import components
from agentrl.config import load_config
from agentrl.parallel.placement import Launch, Rollouts, place, start_waves
from agentrl.rollout import ray_workers
from agentrl.rollout.ray_worker import RolloutWorker
from agentrl.rollout.ray_workers import RolloutPool
from tests.helpers import fake_vllm


@pytest.fixture
def loads(monkeypatch):
    """Every HF model built from a checkpoint in this process: the dtype it was asked for."""
    calls: list[torch.dtype] = []
    real = AutoModelForCausalLM.from_pretrained

    def recording(*args, **kwargs):
        calls.append(kwargs.get("dtype"))
        return real(*args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", recording)
    return calls


def worker_cfg(tmp_path, model_dir, *extra):
    return load_config(
        None,
        [
            f"model.path={model_dir}",
            "run.device=cpu",
            f"run.output_dir={tmp_path}",
            "rollout.workers=1",
            *extra,
        ],
    )


def test_a_vllm_worker_builds_no_hf_model(tmp_path, tiny_model_dir, loads, monkeypatch):
    """vLLM reads the checkpoint itself: a copy of the policy loaded first would sit on the worker's
    GPU while vLLM measures the memory it may take (30 GB for a 7 B fp32 policy)."""
    monkeypatch.setitem(sys.modules, "vllm", fake_vllm.install())
    cfg = worker_cfg(tmp_path, tiny_model_dir, "rollout.engine=vllm", "model.dtype=float32")
    worker = RolloutWorker(components.worker_spec(cfg, str(tiny_model_dir)))
    assert loads == []
    assert fake_vllm.RECORD["llm"]["kwargs"]["model"] == str(tiny_model_dir)
    assert worker.tokenizer.encode("hello") == worker.tokenizer.encode("hello") != []


def test_an_hf_worker_loads_one_copy_in_its_engines_dtype(tmp_path, tiny_model_dir, loads):
    """No policy in ``model.dtype`` first and a cast copy of it after: one load, in ``rollout.dtype``,
    exactly the bytes ``agentrl plan`` counts for a worker's HF engine."""
    cfg = worker_cfg(tmp_path, tiny_model_dir, "model.dtype=float32", "rollout.dtype=bfloat16")
    worker = RolloutWorker(components.worker_spec(cfg, str(tiny_model_dir)))
    assert loads == [torch.bfloat16]
    held = sum(p.numel() * p.element_size() for p in worker.engine.model.parameters())
    a = planner.architecture(cfg)
    terms = planner.hf_engine_terms(a, planner.sizes(cfg, a, 1, 1), 1, "bfloat16")
    assert held == next(t.bytes for t in terms if t.name.startswith("HF engine weights"))


def test_workers_that_share_a_gpu_start_one_after_another():
    node = Launch(nodes=1, gpus_per_node=2, ranks_per_node=1)  # GPU 1 is Ray's
    four = place(node, Rollouts(engine="vllm", workers=4, worker_gpus=0.25)).workers
    assert [w.gpus for w in four] == [(1,)] * 4
    assert start_waves(place(node, Rollouts(engine="vllm", workers=4, worker_gpus=0.25))) == [
        [0],
        [1],
        [2],
        [3],
    ]
    eight = Launch(nodes=1, gpus_per_node=8, ranks_per_node=4)  # GPUs 4-7 are Ray's
    assert start_waves(place(eight, Rollouts(engine="vllm", workers=4, worker_gpus=1.0))) == [[0, 1, 2, 3]]
    # two per GPU on GPUs 4-7: each wave holds one worker per GPU
    waves = start_waves(place(eight, Rollouts(engine="vllm", workers=8, worker_gpus=0.5)))
    assert waves == [[0, 2, 4, 6], [1, 3, 5, 7]]
    cpu = Launch(nodes=1, gpus_per_node=0, ranks_per_node=1)
    assert start_waves(place(cpu, Rollouts(workers=3))) == [[0, 1, 2]]
    # a cluster places fractional workers itself: they may share a GPU, so one at a time
    cluster = place(eight, Rollouts(engine="vllm", workers=3, worker_gpus=0.5, cluster=True))
    assert start_waves(cluster) == [[0], [1], [2]]
    whole = place(eight, Rollouts(engine="vllm", workers=3, worker_gpus=1.0, cluster=True))
    assert start_waves(whole) == [[0, 1, 2]]


def test_a_pool_starts_each_wave_once_the_one_before_has_loaded(monkeypatch):
    """The pool's own start (``RolloutPool._start``) with its Ray calls recorded: a worker of the
    second wave is spawned only after the first wave answered its ping."""
    events: list[str] = []

    class Actor:
        def __init__(self, i: int) -> None:
            self.i = i
            self.pid = type("Call", (), {"remote": staticmethod(lambda: f"pid {i}")})

    def ping(workers, indices, timeout_s):
        events.append(f"loaded {indices}")
        return [], []

    pool = RolloutPool.__new__(RolloutPool)
    pool.call_timeout_s = 60.0
    pool._spawn = lambda i: (events.append(f"spawn {i}"), Actor(i))[1]
    monkeypatch.setattr(ray_workers, "ping", ping)
    monkeypatch.setattr("ray.get", lambda refs: refs)
    pool._start([[0, 2], [1, 3]], "model")
    assert events == ["spawn 0", "spawn 2", "loaded [0, 2]", "spawn 1", "spawn 3", "loaded [1, 3]"]
    assert [a.i for a in pool.workers] == [0, 1, 2, 3]
