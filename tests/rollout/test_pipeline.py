"""Asynchronous off-policy training (``trainer.mode: async``, agentrl/rollout/pipeline.py): K = 0 is the sync
loop exactly; with K = 2 and a slow engine no episode trains past the bound while partial rollouts
carry several weight versions; a killed async run resumes with no transcript lost or duplicated;
the pipeline's own contract (grant order, timeouts, errors, checkpoint state)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from agentrl.assembly import components, make_trainer
from agentrl.config import ConfigError
from agentrl.env import Task
from agentrl.env.data import TaskSampler
from agentrl.episode import Episode
from agentrl.rollout.pipeline import EngineGate, PipelineTimeout, RolloutPipeline
from tests.helpers import HELPERS
from tests.helpers.configs import cli_args, small_config, torchrun_cli
from tests.helpers.jsonl import lines

ENVS = str(HELPERS / "distributed_envs.py")


def _rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in lines(run / "metrics.jsonl")]


def _comparable(run: Path) -> list[dict]:
    """Metrics that do not depend on timing or on the mode's own bookkeeping."""
    skip = ("time/", "tokens/s", "async/")
    return [{k: v for k, v in r.items() if not k.startswith(skip)} for r in _rows(run)]


def _episodes(run: Path) -> list[Episode]:
    return [Episode.from_json(x) for x in lines(run / "transcripts.jsonl")]


@pytest.mark.slow
def test_async_with_k0_is_the_sync_loop(tmp_path, tiny_model_dir):
    """Same metrics, same transcripts, same final weights: with K = 0 nothing samples during an
    update, so async mode is the sync loop run from another thread."""
    extra = (
        "trainer.total_steps=3",
        "env.name=test_turns",
        f"env.module={ENVS}",
        "rollout.max_turns=3",
        "rollout.max_episode_tokens=256",
    )
    runs = {}
    for mode in ("sync", "async"):
        cfg = small_config(tmp_path / mode, tiny_model_dir, *extra, f"trainer.mode={mode}")
        trainer = make_trainer(cfg, log=lambda *_: None)
        trainer.train()
        runs[mode] = trainer
    a, b = tmp_path / "sync" / "run", tmp_path / "async" / "run"
    assert _comparable(a) == _comparable(b)
    assert all(r["async/queued_batches"] + r["async/running_batches"] <= 1 for r in _rows(b))
    strip = lambda run: [{**json.loads(x), "metrics": None} for x in lines(run / "transcripts.jsonl")]  # noqa: E731
    assert strip(a) == strip(b)
    wa, wb = runs["sync"].model.state_dict(), runs["async"].model.state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


class SlowEngine:
    """An engine whose every call takes ``delay`` seconds longer (a busy GPU)."""

    def __init__(self, engine, delay: float) -> None:
        self.engine, self.delay = engine, delay

    def generate(self, prompts, params):
        time.sleep(self.delay)
        return self.engine.generate(prompts, params)

    def __getattr__(self, name):
        return getattr(self.engine, name)


def _slow_engines(monkeypatch, delay: float) -> None:
    real = components.local_engine
    monkeypatch.setattr(components, "local_engine", lambda *a, **k: SlowEngine(real(*a, **k), delay))


def _trained_lags(run: Path) -> list[int]:
    """Per trained episode: versions between the trainer's weights at its step and its oldest token."""
    version_at = {0: 0}  # the trainer's version while training step s = the version after step s-1
    for r in _rows(run):
        version_at[r["step"] + 1] = int(r["weights/version"])
    out = []
    for ep in _episodes(run):
        if ep.overlays:  # trained on
            oldest = min(s.weight_version for s in ep.segments if s.role == "policy")
            out.append(version_at[ep.step] - oldest)
    return out


@pytest.mark.parametrize("runner", ["lockstep", "async"])
@pytest.mark.slow
def test_async_k2_bounds_staleness_and_records_partial_rollouts(
    tmp_path, tiny_model_dir, monkeypatch, runner
):
    """Either episode runner inside the pipeline (the async one batches through the engine gate).
    A batch's three turns (environment steps of 0.4 s, sleeping) outlast a training step (~0.6 s on
    2 cores): the batch granted at a push is still running at the next push, so it is partial every
    time. With steps of 0.05 s a batch took about as long as a step, and the lockstep case found no
    partial episode in 2 runs of 5 (2026-11-29, one of them in CI)."""
    _slow_engines(monkeypatch, 0.03)
    cfg = small_config(
        tmp_path,
        tiny_model_dir,
        f"rollout.runner={runner}",
        "trainer.total_steps=6",
        "env.name=test_turns",
        f"env.module={ENVS}",
        "env.options.delay_s=0.4",
        "rollout.max_turns=3",
        "rollout.max_episode_tokens=256",
        "trainer.mode=async",
        "rollout.max_staleness=2",
    )
    make_trainer(cfg, log=lambda *_: None).train()
    run = tmp_path / "run"
    rows = _rows(run)
    lags = _trained_lags(run)
    assert lags and max(lags) <= 2, lags
    assert max(lags) >= 1, "with K = 2 some batches should run ahead of training"
    eps = [e for e in _episodes(run) if e.overlays]
    partial = [e for e in eps if len({s.weight_version for s in e.segments if s.role == "policy"}) >= 2]
    assert partial, "an episode in flight across a weight push continues on the new weights"
    assert any(r["offpolicy/partial_frac"] > 0 for r in rows)
    assert all(r["offpolicy/stale_dropped"] == 0 for r in rows)  # wait mode: nothing runs past the bound
    for key in (
        "async/trainer_wait_s",
        "async/engine_idle_s",
        "async/engine_blocked_s",
        "async/queued_batches",
    ):
        assert all(key in r for r in rows), key
    # the histogram counts every episode of the step
    for r in rows:
        assert sum(v for k, v in r.items() if k.startswith("staleness/lag_")) == 2 * 4


def test_drop_mode_drops_what_is_past_the_bound(tmp_path, tiny_model_dir, monkeypatch):
    _slow_engines(monkeypatch, 0.03)
    cfg = small_config(
        tmp_path,
        tiny_model_dir,
        "trainer.total_steps=5",
        "env.name=test_turns",
        f"env.module={ENVS}",
        "env.options.delay_s=0.05",
        "rollout.max_turns=3",
        "rollout.max_episode_tokens=256",
        "trainer.mode=async",
        "rollout.max_staleness=1",
        "rollout.on_stale=drop",
    )
    make_trainer(cfg, log=lambda *_: None).train()
    run = tmp_path / "run"
    assert max(_trained_lags(run)) <= 1
    rows = _rows(run)
    # batches are granted as soon as one is taken: the one for step 2 starts on version 0 while step 0
    # trains, and is two versions old when step 2 takes it
    assert sum(r["offpolicy/stale_dropped"] for r in rows) > 0
    for r in rows:  # every episode past the bound is dropped, and only those
        past = sum(v for k, v in r.items() if k.startswith("staleness/lag_") and int(k.rsplit("_", 1)[1]) > 1)
        assert r["offpolicy/stale_dropped"] == past


def test_drop_with_k0_is_a_config_error(tmp_path, tiny_model_dir):
    with pytest.raises(ConfigError, match=r"rollout\.on_stale"):
        small_config(tmp_path, tiny_model_dir, "trainer.mode=async", "rollout.on_stale=drop")


def test_the_old_lag_setting_is_renamed(tmp_path, tiny_model_dir):
    with pytest.warns(
        FutureWarning, match="'rollout.max_weight_lag' is deprecated, use 'rollout.max_staleness'"
    ):
        cfg = small_config(tmp_path, tiny_model_dir, "rollout.max_weight_lag=2")
    assert cfg.rollout.max_staleness == 2


@pytest.mark.slow
def test_kill_minus_9_in_async_mode_then_resume(tmp_path, tiny_model_dir, capsys):
    """Batches granted but not trained on at the checkpoint are granted again on resume: the run's
    episodes are exactly the uninterrupted run's, each written once. Only the killed run needs a
    process of its own: the uninterrupted run and the resume run in this one (each fresh process
    cost ~10 s of imports, issue 51)."""
    from agentrl.cli import main

    common = (
        "trainer.total_steps=6",
        "trainer.checkpoint_every=1",
        "trainer.mode=async",
        "rollout.max_staleness=2",
        "env.name=test_turns",
        "env.options.delay_s=0.02",
        "rollout.max_turns=3",
        "rollout.max_episode_tokens=256",
    )
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    whole = tmp_path / "whole"
    assert main(["train", *cli_args(whole, tiny_model_dir, *common)]) == 0, capsys.readouterr().err[-2000:]
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentrl.cli", "train", *cli_args(run, tiny_model_dir, *common)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.time() + 300
    while not (run / "checkpoints" / "step_2" / "trainer_state.pt").exists():
        assert proc.poll() is None, "the run ended before it could be killed"
        assert time.time() < deadline, "no second checkpoint within 300 s"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    state = torch.load(run / "checkpoints" / "step_2" / "trainer_state.pt", weights_only=False)
    assert state["pipeline"]["grants"], "the checkpoint records the batches still pending"
    capsys.readouterr()
    assert main(["train", "--resume", str(run)]) == 0, capsys.readouterr().err[-2000:]
    assert [r["step"] for r in _rows(run)] == list(range(6))
    ids = [e.id for e in _episodes(run)]
    assert len(ids) == len(set(ids)) == 6 * 2 * 2
    assert sorted(ids) == sorted(e.id for e in _episodes(whole))


# -- the pipeline alone ------------------------------------------------------------------------------
def _sampler(n: int = 20) -> TaskSampler:
    return TaskSampler([Task(id=f"t{i}", prompt=str(i)) for i in range(n)], seed=0)


def _fake_episodes(label, tasks):
    return [Episode(id=f"s{label[0]}r{label[1]}-{t.id}", env="", task_id=t.id, seed=0) for t in tasks]


def test_wait_mode_grants_k_plus_one_steps_then_one_per_finished_step():
    started: list = []

    def run(label, tasks):
        started.append(label)
        return _fake_episodes(label, tasks)

    p = RolloutPipeline(_sampler(), 2, 10, 1, "wait", run, data_wait_s=10)
    _, label, _ = p.take()
    assert label == (0, 0)
    time.sleep(0.2)
    assert started == [(0, 0), (1, 0)], "K = 1: only steps 0 and 1 may start before step 0's push"
    p.grant_round(0, 1)  # dynamic sampling wants another round for step 0
    assert p.take()[1] == (1, 0)  # takes are in grant order
    p.step_done(0)
    assert p.take()[1] == (0, 1)
    assert p.take()[1] == (2, 0)
    st = p.state()
    assert st["grants"] == [] and st["next_step"] == 3
    p.close()


def test_state_names_the_pending_batches_and_the_sampler_before_them():
    release = threading.Event()

    def run(label, tasks):
        release.wait(10)
        return _fake_episodes(label, tasks)

    sampler = _sampler()
    p = RolloutPipeline(sampler, 3, 10, 2, "wait", run, data_wait_s=10)
    time.sleep(0.2)
    st = p.state()
    assert st["grants"] == [[0, 0], [1, 0], [2, 0]] and st["sampler"] == {"epoch": 0, "pos": 0}
    release.set()
    first = [e.task_id for e in p.take()[0]]
    p.close()
    resumed = RolloutPipeline(_sampler(), 3, 10, 2, "wait", _fake_episodes, data_wait_s=10, state=st)
    assert [e.task_id for e in resumed.take()[0]] == first  # the same tasks again
    resumed.close()


def test_take_times_out_naming_the_batch():
    stuck = threading.Event()
    p = RolloutPipeline(_sampler(), 2, 10, 0, "wait", lambda label, tasks: stuck.wait(30), data_wait_s=0.5)
    t0 = time.perf_counter()
    with pytest.raises(PipelineTimeout, match=r"timeouts.data_wait_s.*step 0 round 0"):
        p.take()
    assert time.perf_counter() - t0 < 0.5 + 1.0
    stuck.set()
    p.close()


def test_a_batch_that_raises_reaches_the_trainer():
    def run(label, tasks):
        raise ValueError("boom")

    p = RolloutPipeline(_sampler(), 2, 10, 0, "wait", run, data_wait_s=5)
    with pytest.raises(RuntimeError, match=r"batch \(0, 0\) failed") as err:
        p.take()
    assert isinstance(err.value.__cause__, ValueError)
    p.close()


def test_engine_gate_never_overlaps_a_push_with_generation():
    events: list[str] = []

    class Recorder:
        version = 0

        def generate(self, prompts, params):
            events.append("gen+")
            time.sleep(0.05)
            events.append("gen-")
            return []

        def load_weights(self, w):
            events.append("load")
            return 1

    gate = EngineGate(Recorder())  # type: ignore[arg-type]
    assert not hasattr(gate, "submit")
    threads = [threading.Thread(target=gate.generate, args=([[1]], [])) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.01)
    with gate.hold():
        events.append("push")
        time.sleep(0.05)
        events.append("pushed")
    for t in threads:
        t.join()
    text = " ".join(events)
    assert "gen+ gen-" in text and text.count("gen+ gen-") == 3  # calls never interleave
    i = events.index("push")
    assert events[i + 1] == "pushed"  # nothing ran inside the push


@pytest.mark.slow
def test_async_under_torchrun_ranks_take_the_same_batches(tmp_path, tiny_model_dir):
    """2 gloo ranks: each runs its share of every batch in its own pipeline, the trainer's take
    gathers them, so both ranks train on the same episodes in the same steps."""

    run = tmp_path / "dp"
    overrides = cli_args(
        run,
        tiny_model_dir,
        "trainer.total_steps=3",
        "trainer.mode=async",
        "rollout.max_staleness=1",
        "env.name=test_turns",
        "env.options.delay_s=0.02",
        "rollout.max_turns=3",
        "rollout.max_episode_tokens=256",
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    proc = subprocess.run(
        torchrun_cli("train", *overrides), env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rank0, rank1 = _rows(run), _rows(run / "ranks" / "1")
    assert [r["step"] for r in rank0] == [0, 1, 2]
    assert [r["reward/mean"] for r in rank0] == [r["reward/mean"] for r in rank1]
    assert [e.id for e in _episodes(run)] == [e.id for e in _episodes(run / "ranks" / "1")]
    assert max(_trained_lags(run)) <= 1


@pytest.mark.ray
@pytest.mark.slow
def test_async_on_ray_workers(ray_local, tmp_path, tiny_model_dir):
    """A pool of Ray workers under async mode: batches overlap on the workers, each worker takes new
    weights between its shards, and the bound holds."""
    cfg = small_config(
        tmp_path,
        tiny_model_dir,
        "rollout.workers=2",
        "trainer.total_steps=3",
        "trainer.mode=async",
        "rollout.max_staleness=1",
        "env.name=test_turns",
        f"env.module={ENVS}",
        "rollout.max_turns=3",
        "rollout.max_episode_tokens=256",
    )
    trainer = make_trainer(cfg, log=lambda *_: None)
    try:
        trainer.train()
    finally:
        trainer.engine.shutdown()
    run = tmp_path / "run"
    assert [r["step"] for r in _rows(run)] == [0, 1, 2]
    assert max(_trained_lags(run)) <= 1
    assert all(r["weights/version"] == i + 1 for i, r in enumerate(_rows(run)))
