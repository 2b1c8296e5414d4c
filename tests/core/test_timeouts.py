"""Nothing waits forever: a stuck engine, a stuck Ray worker and a collective that a rank never joins
each end in an error naming what was waited for and how long, within the timeout plus a margin
(docs/scaling.md, "Timeouts"). Timeouts here are 1-2 s; a stuck call sleeps for a minute."""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from agentrl.assembly import build
from agentrl.config import load_config
from agentrl.config.schema_runtime import TimeoutsConfig
from agentrl.engines.base import SamplingParams
from agentrl.engines.scripted import ScriptedEngine
from agentrl.env import Task
from agentrl.rollout.async_runner import AsyncEpisodeRunner
from agentrl.rollout.runner import ENGINE_REQUEST_S, ENV_STEP_S, EpisodeRequest, RunnerSettings
from agentrl.timeouts import WaitTimeout, call_with_timeout
from environments.calculator import Calculator
from tests.helpers import HELPERS
from tests.helpers.configs import free_port

MARGIN_S = 2.0  # thread start-up, the episodes' bookkeeping and a loaded CI machine
STUCK_S = 60.0  # how long a stuck call blocks: far past every timeout below


class StuckEngine(ScriptedEngine):
    """An engine whose ``generate`` blocks until the test releases it (never, within the timeout)."""

    def __init__(self, tokenizer) -> None:
        super().__init__([], tokenizer=tokenizer)
        self.release = threading.Event()
        self.entered = 0

    def generate(self, prompts, params):
        self.entered += 1
        self.release.wait(STUCK_S)
        raise RuntimeError("released by the test")


def requests(n: int) -> list[EpisodeRequest]:
    return [EpisodeRequest(Task(f"t{i}", "What is 2 + 3?", answer=5), seed=i) for i in range(n)]


def test_runner_default_is_the_configs():
    assert TimeoutsConfig().engine_request_s == ENGINE_REQUEST_S  # direct users get the config's bound
    assert TimeoutsConfig().env_step_s == ENV_STEP_S


class HangsInStep(Calculator):
    """An environment whose ``step`` never returns for even seeds (a user bug, not a tool)."""

    def step(self, action):
        if self.seed % 2 == 0:
            time.sleep(STUCK_S)
        return super().step(action)


@pytest.mark.parametrize("runner_kind", ["lockstep", "async"])
def test_stuck_environment_step_fails_its_episode_within_the_timeout(tiny_tokenizer, runner_kind):
    """``timeouts.env_step_s`` = 1 s: the stuck episodes fail at the env boundary naming the
    environment, the call and the wait; the others finish normally."""
    cfg = load_config(None, [f"rollout.runner={runner_kind}", "timeouts.env_step_s=1", "rollout.max_turns=2"])
    engine = ScriptedEngine(lambda prompt, i: "The answer is 5.", tokenizer=tiny_tokenizer)
    runner = build.build_runner(cfg, engine, tiny_tokenizer, seed=0)
    runner.env_factory = HangsInStep
    try:
        t0 = time.monotonic()
        eps = runner.run(requests(4))
        elapsed = time.monotonic() - t0
    finally:
        runner.close()
    assert 1.0 <= elapsed < 1.0 + MARGIN_S, elapsed
    for ep in eps:
        if ep.seed % 2 == 0:
            assert ep.failed and ep.failure.boundary == "env", ep.failure
            assert "environment 'calculator' step" in ep.failure.message
            assert "timeouts.env_step_s=1s" in ep.failure.message and "waiting 1.0s" in ep.failure.message
        else:
            assert not ep.failed, ep.failure


@pytest.mark.parametrize("runner_kind", ["lockstep", "async"])
def test_stuck_engine_fails_the_episodes_within_the_timeout(tiny_tokenizer, runner_kind):
    """The runner built from the config waits ``timeouts.engine_request_s`` = 1 s, then the episodes
    fail at the model boundary naming the engine and the wait; the call returns (the step goes on)."""
    cfg = load_config(None, [f"rollout.runner={runner_kind}", "timeouts.engine_request_s=1"])
    engine = StuckEngine(tiny_tokenizer)
    runner = build.build_runner(cfg, engine, tiny_tokenizer, seed=0)
    try:
        t0 = time.monotonic()
        eps = runner.run(requests(3))
        elapsed = time.monotonic() - t0
    finally:
        runner.close()
        engine.release.set()
    assert 1.0 <= elapsed < 1.0 + MARGIN_S, elapsed
    assert engine.entered >= 1
    for ep in eps:
        assert ep.failed and ep.stop_reason == "error" and ep.failure.boundary == "model"
        msg = ep.failure.message
        assert msg.startswith("agentrl.timeouts.WaitTimeout: engine StuckEngine: generate for "), msg
        assert "timeouts.engine_request_s=1s" in msg and "waiting 1.0s" in msg and "abandoned" in msg
    if runner_kind == "lockstep":  # one batched call for the round
        assert "generate for 3 episodes" in eps[0].failure.message
    else:  # one request per episode, through the batcher
        assert {ep.failure.message.split(": ")[2] for ep in eps} == {
            f"generate for episode {ep.id} (turn 0)" for ep in eps
        }


def test_engine_with_its_own_scheduler_times_out_per_request(tiny_tokenizer):
    """An engine with ``submit`` (vLLM's path) whose futures never resolve."""

    class NeverAnswers(ScriptedEngine):
        def submit(self, prompt, params):
            return concurrent.futures.Future()  # nobody will ever set it

    engine = NeverAnswers([], tokenizer=tiny_tokenizer)
    runner = AsyncEpisodeRunner(engine, tiny_tokenizer, Calculator, RunnerSettings(request_timeout_s=1.0))
    t0 = time.monotonic()
    eps = runner.run(requests(2))
    elapsed = time.monotonic() - t0
    runner.close()
    assert 1.0 <= elapsed < 1.0 + MARGIN_S, elapsed
    assert all(ep.failure.boundary == "model" and "NeverAnswers" in ep.failure.message for ep in eps)


def test_a_timeout_raised_by_the_call_itself_is_not_a_wait_timeout():
    def raises():
        raise TimeoutError("the sandbox's own timeout")

    with pytest.raises(TimeoutError, match="the sandbox's own timeout") as info:
        call_with_timeout(raises, 5.0, "a call")
    assert not isinstance(info.value, WaitTimeout)
    assert call_with_timeout(lambda: 42, 5.0, "a call") == 42


# -- Ray ---------------------------------------------------------------------------------------------
STUCK_ENVS = HELPERS / "timeout_envs.py"


def hanging(n: int, hang_s: float) -> list[EpisodeRequest]:
    return [
        EpisodeRequest(Task(f"h{i}", "Say something.", metadata={"hang_s": hang_s}), seed=i, group="g")
        for i in range(n)
    ]


@pytest.mark.ray
@pytest.mark.slow  # 25-56 s: in the full tier (.ci/run), not the fast one
def test_stuck_ray_worker_is_killed_and_its_episodes_fail(ray_local, tmp_path, tiny_model_dir):
    """One worker. A shard whose environment hangs: after ``ray_call_s`` = 2 s the worker is killed
    and the episodes fail at the worker boundary naming it; the next run replaces it and succeeds.
    Then a ``generate`` queued behind a stuck call raises ``WaitTimeout`` after 2 s."""
    from agentrl.assembly import components

    cfg = load_config(
        None,
        [
            f"model.path={tiny_model_dir}",
            "env.name=test_stuck",
            f"env.module={STUCK_ENVS}",
            f"run.output_dir={tmp_path / 'run'}",
            "run.device=cpu",
            "rollout.workers=1",
            "rollout.max_tokens_per_turn=4",
            "rollout.max_episode_tokens=64",
            "timeouts.ray_call_s=180",  # starting a worker (imports, the policy) takes 15-60 s on 2 busy cores
        ],
    )
    pool = components.rollout_pool(cfg, str(tiny_model_dir))
    try:
        pool.call_timeout_s = 2.0  # the same setting, tightened once the worker is up
        t0 = time.monotonic()
        eps = pool.run_episodes(hanging(2, STUCK_S))
        elapsed = time.monotonic() - t0
        assert 2.0 <= elapsed < 2.0 + MARGIN_S, elapsed
        for ep in eps:
            assert ep.failure.boundary == "worker" and ep.stop_reason == "error"
            assert ep.failure.message.startswith(
                "rollout worker 0 did not answer run within timeouts.ray_call_s=2s (waited 2."
            ), ep.failure.message
            assert ep.failure.message.endswith("killed it")

        pool.call_timeout_s = (
            180.0  # the replacement loads the policy (15-60 s alone, more beside other jobs)
        )
        eps = pool.run_episodes(hanging(2, 0.0))
        assert not any(ep.failed for ep in eps), [ep.failure for ep in eps]
        assert "replaced dead worker 0" in pool.events

        busy = pool.workers[0].run.remote(hanging(1, STUCK_S), None, None)  # occupies the actor
        pool.call_timeout_s = 2.0
        t0 = time.monotonic()
        with pytest.raises(WaitTimeout, match=r"rollout workers \[0\]: generate for 1 prompts") as info:
            pool.generate([[5, 6, 7]], SamplingParams(max_tokens=2))
        elapsed = time.monotonic() - t0
        assert 2.0 <= elapsed < 2.0 + MARGIN_S, elapsed
        assert "timeouts.ray_call_s=2s" in str(info.value) and "killed them" in str(info.value)
        with pytest.raises(ray_local.exceptions.RayActorError):  # the stuck call died with its worker
            ray_local.get(busy, timeout=30)
    finally:
        pool.shutdown()


@pytest.mark.ray
@pytest.mark.slow  # a Ray worker process starts and is killed: ~5-20 s
def test_workers_too_slow_to_start_stop_the_pool_with_the_timeout(ray_local, tmp_path, tiny_model_dir):
    """No worker can load the policy within ``ray_call_s``: the pool kills its workers and raises the
    timeout naming them and the setting (it raised an AttributeError from its own cleanup, found when
    a busy machine made a worker take over 60 s to start)."""
    from agentrl.assembly import components

    cfg = load_config(
        None,
        [f"model.path={tiny_model_dir}", f"run.output_dir={tmp_path / 'run'}", "run.device=cpu",
         "rollout.workers=1", "timeouts.ray_call_s=0.5"],
    )  # fmt: skip
    with pytest.raises(
        WaitTimeout, match=r"rollout workers \[0\] loading the policy .*ray_call_s=0.5s.*stopped the pool"
    ):
        components.rollout_pool(cfg, str(tiny_model_dir))


# -- sandboxes ---------------------------------------------------------------------------------------
@pytest.mark.docker
def test_a_container_that_stops_reading_cannot_block_a_cell():
    """A paused container never reads its stdin: sending it a 4 MiB cell filled the pipes and blocked
    forever (Docker hands over the attached socket without a timeout). Now the send gives up after
    ``start_timeout_s`` = 2 s, the cell fails with the reason and the next cell runs in a fresh one."""
    from tests.helpers.sandbox_fixtures import FAST, make_or_skip

    sandbox = make_or_skip("docker", FAST, start_timeout_s=2.0)
    try:
        session = sandbox.session()
        assert session.run("x = 1").error is None
        worker = session._worker  # type: ignore[attr-defined]
        worker.api.pause(worker.cid)
        t0 = time.monotonic()
        res = session.run("y = '" + "a" * (4 << 20) + "'")
        elapsed = time.monotonic() - t0
        assert 2.0 <= elapsed < 2.0 + MARGIN_S, elapsed
        assert res.restarted and res.error is not None and res.error.name == "TimeoutError"
        assert res.error.value == "the sandbox did not take the cell within 2s and was restarted"
        assert session.run("print(1 + 1)").stdout == "2\n"  # a fresh container
        session.close()
    finally:
        sandbox.close()


# -- collectives -------------------------------------------------------------------------------------
RANK_SCRIPT = """
import json, os, sys, time
from pathlib import Path
from agentrl.parallel import ranks

rank, world = ranks.init_from_env(timeout_s=2.0)
done = Path(sys.argv[1])
if rank == 1:  # never joins rank 0's all-reduce; leaves once rank 0 has reported
    deadline = time.monotonic() + 60
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    os._exit(0)
t0 = time.monotonic()
try:
    ranks.any_rank(True)
    out = {"error": None}
except ranks.CollectiveError as e:
    out = {"error": str(e)}
out["waited"] = time.monotonic() - t0
print(json.dumps(out), flush=True)
done.touch()
os._exit(0)
"""


@pytest.mark.slow
def test_collective_a_rank_never_joins_raises_naming_it(tmp_path):
    """Two gloo processes with ``timeouts.collective_s`` = 2 s: rank 1 never joins the all-reduce of
    ``ranks.any_rank``; rank 0 raises ``CollectiveError`` naming the collective within 2 s + margin."""
    port, done = free_port(), tmp_path / "rank0-reported"
    base = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    base.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK_SCRIPT, str(done)],
            env={**base, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    try:
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            p.kill()
    out, err = outs[0]
    assert procs[0].returncode == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert 2.0 <= result["waited"] < 2.0 + MARGIN_S, result
    msg = result["error"]
    assert msg.startswith("collective all_reduce (ranks.any_rank) on rank 0 of 2: not every rank joined "), (
        msg
    )
    assert "within timeouts.collective_s=2s" in msg and "waited 2." in msg
    assert "Timed out" in msg  # gloo's own message follows


def test_bounded_calls_reuse_one_helper_thread_and_replace_a_stuck_one():
    from agentrl.timeouts import BoundedCalls

    calls = BoundedCalls()
    names = {calls.call(lambda: threading.current_thread().ident, 5.0, "a call") for _ in range(5)}
    assert len(names) == 1 and threading.get_ident() not in names  # one helper, not the caller
    release = threading.Event()
    t0 = time.monotonic()
    with pytest.raises(WaitTimeout, match="a stuck call: no answer after waiting"):
        calls.call(lambda: release.wait(STUCK_S), 0.5, "a stuck call")
    assert time.monotonic() - t0 < 0.5 + MARGIN_S
    after = calls.call(lambda: threading.current_thread().ident, 5.0, "a call")
    assert after not in names  # the stuck helper is abandoned; the next call gets a new one
    release.set()
    calls.close()


def test_hf_engine_generate_stops_at_its_deadline_in_the_callers_thread(tiny_policy):
    """The HF engine computes in the runner's own thread (a second torch thread slows a 2-core
    machine's rollouts): the runner's bound is checked at every decode step instead."""
    from agentrl.engines.hf import HFEngine

    model, tok = tiny_policy
    engine = HFEngine(model, tok, lean_decode=False)
    forward = model.forward

    def slow_forward(*args, **kwargs):
        time.sleep(0.05)
        return forward(*args, **kwargs)

    model.forward = slow_forward  # 64 decode steps: ~3 s, far past the 0.5 s bound
    cfg = load_config(None, ["timeouts.engine_request_s=0.5", "rollout.max_tokens_per_turn=64"])
    runner = build.build_runner(cfg, engine, tok, seed=0)
    caller = threading.get_ident()
    seen: set[int] = set()
    generate = engine.generate
    engine.generate = lambda *a, **k: (seen.add(threading.get_ident()), generate(*a, **k))[1]  # type: ignore[method-assign]
    try:
        t0 = time.monotonic()
        eps = runner.run(requests(2))
        elapsed = time.monotonic() - t0
    finally:
        runner.close()
    assert seen == {caller}
    assert 0.5 <= elapsed < 0.5 + MARGIN_S, elapsed
    for ep in eps:
        assert ep.failure.boundary == "model" and "stopped at decode step" in ep.failure.message, ep.failure
        assert "timeouts.engine_request_s=0.5s" in ep.failure.message
