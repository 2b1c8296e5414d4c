"""The colocated engine's sleep/wake cycle (agentrl/sync/colocate.py): the exact order of the phases over
two training steps with no two overlapping, a hanging phase that raises naming itself, out-of-order
use, ``VLLMEngine``'s sleep mode on the real vLLM call names (a stand-in ``vllm`` module), and the
config errors."""

from __future__ import annotations

import sys
import threading
import time
import types
from functools import partial

import pytest
import torch

from agentrl.assembly.records import push_settings
from agentrl.config import Config, ConfigError, load_config
from agentrl.engines.base import Completion, SamplingParams
from agentrl.sync import colocate, weight_sync
from agentrl.sync.colocate import SleepWakeCycle
from agentrl.timeouts import WaitTimeout
from agentrl.training.weight_push import WeightPush

MARGIN_S = 2.0
STUCK_S = 60.0


class RecordingEngine:
    """Records every call as (name, start, end); each call takes a few ms, so overlaps would show.
    Like ``VLLMEngine`` it refuses to generate while any part of it is asleep."""

    def __init__(self, hang: str | None = None) -> None:
        self.calls: list[tuple[str, float, float]] = []
        self.asleep: set[str] = set()
        self.hang, self.release = hang, threading.Event()
        self.version = 0

    def _record(self, name: str) -> None:
        t0 = time.monotonic()
        if name == self.hang:
            self.release.wait(STUCK_S)
        time.sleep(0.005)
        self.calls.append((name, t0, time.monotonic()))

    def sleep(self, level: int) -> None:
        self._record(f"sleep({level})")
        self.asleep = {"weights", "kv_cache"}

    def wake_up(self, tags=None) -> bool:
        self._record(f"wake_up({','.join(tags)})")
        self.asleep -= set(tags)
        return not self.asleep

    def load_weights(self, weights) -> int:
        assert "weights" not in self.asleep, "weights pushed into released memory"
        self._record("load_weights")
        self.version += 1
        return self.version

    def generate(self, prompts, params) -> list[Completion]:
        assert not self.asleep, "generate while asleep"
        self._record("generate")
        return [Completion([1], [-1.0], "stop") for _ in prompts]


def colocated_config(level: int = 2, timeout_s: float = 2.0) -> Config:
    """A config with the cycle on, built without ``load_config``: its checks refuse sleep mode on this
    CPU machine (tested below); here only the trainer's wiring is under test."""
    cfg = Config()
    cfg.trainer.bf16 = False  # auto is decided by a run's start (assembly/precision.py)
    cfg.rollout.colocate.sleep, cfg.rollout.colocate.sleep_level = True, level
    cfg.timeouts.sleep_wake_s = timeout_s
    return cfg


def test_two_steps_run_the_phases_in_order_without_overlap(monkeypatch):
    """The trainer's weight push around an update (``WeightPush.around``, the real body) for two steps, with rollouts before each: the engine sees
    generate, sleep, (update), wake weights, load weights, wake KV cache, then the sync's
    verification (its probe generates, so it waits for the KV cache), twice, one at a time."""
    engine = RecordingEngine()

    def learner_update(batch, step):
        engine._record(f"update[{step}]")  # stands in for the optimizer steps
        return {"loss": float(step)}

    def sync(defer_verify: bool = False) -> weight_sync.SyncReport:
        assert defer_verify, "the probe cannot run before the KV cache wakes"
        engine.load_weights({"w": torch.zeros(2)})
        return weight_sync.SyncReport(0.0, 8, 1, 8, 1, engine.version, False, pending={})

    def verify(eng, report, settings, probe):
        assert report.pending is not None
        eng._record("verify")
        report.pending, report.verified = None, True
        return report

    monkeypatch.setattr(weight_sync, "verify_synced", verify)
    push = WeightPush(push_settings(colocated_config(level=2)), learner=None, engine=engine)
    push.sync, push.settings = sync, lambda: (None, None)  # type: ignore[method-assign, assignment]
    for step in range(2):
        engine.generate([[1, 2]], SamplingParams())  # the step's rollouts
        metrics = push.around(partial(learner_update, None, step))
        assert metrics["loss"] == step and metrics["sync/buckets"] == 1.0 and metrics["sync/verified"] == 1.0
        assert {"time/engine_sleep_s", "time/engine_wake_weights_s", "time/engine_wake_kv_cache_s"} <= set(
            metrics
        )
        assert all(metrics[f"time/engine_{p}_s"] >= 0.005 for p in ("sleep", "wake_weights", "wake_kv_cache"))
    names = [name for name, _, _ in engine.calls]
    one = [
        "generate",
        "sleep(2)",
        "update[{}]",
        "wake_up(weights)",
        "load_weights",
        "wake_up(kv_cache)",
        "verify",
    ]
    assert names == [n.format(0) for n in one] + [n.format(1) for n in one]
    for (a, _, end), (b, start, _) in zip(engine.calls, engine.calls[1:]):
        assert end <= start, f"{a} overlaps {b}"
    cycle = colocate.cycle_for(engine, 2, 60.0)  # already made: the arguments only make a new one
    assert cycle.phase == "generate" and len(cycle.history) == 10  # the same cycle carried both steps


def test_torchs_cached_memory_goes_back_before_each_wake(monkeypatch):
    """vLLM's wake maps physical memory itself, so the blocks the update left in torch's caching
    allocator must be handed back first, or the wake runs out of memory on a GPU (TRL empties the
    cache before every wake for this reason). No GPU here: torch.cuda's calls are recorded."""
    engine = RecordingEngine()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: engine._record("empty_cache"))
    cycle = SleepWakeCycle(engine, level=1, timeout_s=10.0)

    def update() -> dict[str, float]:
        engine._record("update")
        return {}

    def sync() -> dict[str, float]:
        engine._record("sync")
        return {}

    cycle.around_update(update, sync)
    names = [name for name, _, _ in engine.calls]
    assert names == [
        "sleep(1)",
        "update",
        "empty_cache",
        "wake_up(weights)",
        "sync",
        "empty_cache",
        "wake_up(kv_cache)",
    ]


@pytest.mark.parametrize(
    ("hang", "phase"),
    [("sleep(1)", "sleep"), ("wake_up(weights)", "wake_weights"), ("wake_up(kv_cache)", "wake_kv_cache")],
)
def test_a_hanging_phase_raises_naming_it(hang, phase):
    engine = RecordingEngine(hang=hang)
    cycle = SleepWakeCycle(engine, level=1, timeout_s=1.0)
    t0 = time.monotonic()
    try:
        with pytest.raises(WaitTimeout) as info:
            cycle.around_update(lambda: {}, lambda: {})
        elapsed = time.monotonic() - t0
    finally:
        engine.release.set()
    assert 1.0 <= elapsed < 1.0 + MARGIN_S, elapsed
    msg = str(info.value)
    assert msg.startswith(f"colocated engine RecordingEngine: phase '{phase}'"), msg
    assert "waiting 1.0s" in msg and "timeouts.sleep_wake_s=1s" in msg
    # the engine's memory state is unknown now: every later phase refuses, naming the failed one
    with pytest.raises(RuntimeError, match=rf"cycle is broken \(phase '{phase}' failed after 1\.\ds"):
        cycle.wake_kv_cache()


def test_out_of_order_and_overlapping_phases_raise():
    engine = RecordingEngine()
    cycle = SleepWakeCycle(engine, level=1, timeout_s=2.0)
    with pytest.raises(RuntimeError, match="'update' called out of order: after 'generate' comes 'sleep'"):
        cycle.update(lambda: None)
    cycle.sleep()
    with pytest.raises(RuntimeError, match="'sleep' called out of order: after 'sleep' comes 'update'"):
        cycle.sleep()
    with pytest.raises(
        RuntimeError, match="'wake_kv_cache' called out of order: after 'sleep' comes 'update'"
    ):
        cycle.wake_kv_cache()

    # a phase requested while another runs (another thread) is refused, not queued
    started, finish = threading.Event(), threading.Event()

    def long_update() -> str:
        started.set()
        finish.wait(10)
        return "updated"

    result: list[str] = []
    worker = threading.Thread(target=lambda: result.append(cycle.update(long_update)))
    worker.start()
    assert started.wait(10)
    with pytest.raises(RuntimeError, match="'wake_weights' started while 'update' is running"):
        cycle.wake_weights()
    finish.set()
    worker.join(10)
    assert result == ["updated"]
    # refused calls changed nothing: the cycle goes on from where it was
    cycle.wake_weights()
    cycle.sync(lambda: engine.load_weights({}))
    cycle.wake_kv_cache()
    assert cycle.phase == "generate" and not engine.asleep
    assert [n for n, _, _ in engine.calls] == [
        "sleep(1)",
        "wake_up(weights)",
        "load_weights",
        "wake_up(kv_cache)",
    ]


def test_a_failing_update_breaks_the_cycle():
    cycle = SleepWakeCycle(RecordingEngine(), level=1, timeout_s=2.0)

    def update():
        raise ValueError("optimizer blew up")

    with pytest.raises(ValueError, match="optimizer blew up"):
        cycle.around_update(update, lambda: {})
    with pytest.raises(RuntimeError, match=r"phase 'update' failed .*ValueError: optimizer blew up"):
        cycle.wake_weights()


def test_cycle_for_refuses_an_engine_without_sleep_mode():
    from agentrl.engines.scripted import ScriptedEngine

    with pytest.raises(TypeError, match="ScriptedEngine has no sleep mode"):
        colocate.cycle_for(ScriptedEngine([]), 1, 60.0)


# -- VLLMEngine's sleep mode, on a stand-in vllm module that records the calls -------------------------
class FakeLLM:
    def __init__(self, **kwargs) -> None:
        self.kwargs, self.calls = kwargs, []

    def sleep(self, level=1):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tags))


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.LLM = FakeLLM  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", module)
    return module


def test_vllm_engine_sleep_mode_uses_the_vllm_api(fake_vllm, monkeypatch):
    from agentrl.assembly.components import vllm_engine
    from agentrl.engines.vllm import VLLMEngine

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # vllm_engine picks the GPU path
    cfg = colocated_config(level=2)
    engine = vllm_engine(cfg, "some/model")
    assert engine.llm.kwargs["enable_sleep_mode"] is True
    # the KV cache vLLM checks at start is for the longest rollout, not the model's whole context
    assert engine.llm.kwargs["max_model_len"] == cfg.rollout.max_episode_tokens
    plain = VLLMEngine("some/model", device="cuda")
    assert "enable_sleep_mode" not in plain.llm.kwargs  # off unless asked for

    engine.sleep(2)
    with pytest.raises(RuntimeError, match=r"asleep \(kv_cache, weights released\)"):
        engine.generate([[1, 2]], SamplingParams())
    with pytest.raises(RuntimeError, match="asleep"):
        engine.submit([1, 2], SamplingParams())
    assert engine.wake_up(["weights"]) is False
    with pytest.raises(RuntimeError, match=r"asleep \(kv_cache released\)"):
        engine.generate([[1, 2]], SamplingParams())
    assert engine.wake_up(["kv_cache"]) is True
    assert engine.llm.calls == [("sleep", 2), ("wake_up", ["weights"]), ("wake_up", ["kv_cache"])]
    with pytest.raises(ValueError, match="sleep level must be 1 or 2"):
        engine.sleep(3)
    with pytest.raises(ValueError, match="wake_up tags"):
        engine.wake_up(["scheduling"])


def test_vllm_engine_refuses_sleep_mode_on_cpu(fake_vllm):
    from agentrl.assembly.components import vllm_engine
    from agentrl.engines.vllm import VLLMEngine

    cfg = colocated_config()
    cfg.run.device = "cpu"
    with pytest.raises(
        ConfigError, match=r"rollout\.colocate\.sleep needs a GPU: vLLM's sleep mode runs on CUDA"
    ):
        vllm_engine(cfg, "some/model")
    with pytest.raises(ValueError, match="enable_sleep_mode needs a GPU"):
        VLLMEngine("some/model", device="cpu", enable_sleep_mode=True)


# -- config errors ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["rollout.engine=hf"], "rollout.engine='hf' has none"),
        (["rollout.engine=vllm", "trainer.mode=async"], "trainer.mode=async generates during updates"),
        (["rollout.engine=vllm", "rollout.workers=2"], "rollout.workers=2 runs the engines in Ray workers"),
        (
            ["rollout.engine=vllm", "run.device=cpu"],
            "needs a GPU: vLLM's sleep mode runs on CUDA and ROCm only",
        ),
    ],
)
def test_config_errors(overrides, expected):
    with pytest.raises(ConfigError) as info:
        load_config(None, ["rollout.colocate.sleep=true", *overrides])
    assert expected in str(info.value)
    assert "rollout.colocate.sleep=true" in str(info.value)  # the message says where it came from


def test_auto_device_without_a_gpu_is_a_config_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    ok = ["rollout.colocate.sleep=true", "rollout.engine=vllm", "rollout.sync.verify='off'"]
    with pytest.raises(ConfigError, match=r"run\.device=auto found no GPU here"):
        load_config(None, ok)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # on a GPU machine it loads
    cfg = load_config(None, [*ok, "rollout.colocate.sleep_level=2"])
    assert cfg.rollout.colocate.sleep and cfg.rollout.colocate.sleep_level == 2
