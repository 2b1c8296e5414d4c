"""The code-interpreter environment through the EpisodeRunner on each sandbox backend: multi-turn
episodes on the tiny model's tokenizer (scripted policy, exact expectations) and on the tiny model
itself (HF engine: whatever it writes, every episode completes or fails cleanly, nothing leaks)."""

from __future__ import annotations

import functools
import os

import pytest

from agentrl.engines.base import SamplingParams
from agentrl.engines.hf import HFEngine
from agentrl.engines.scripted import ScriptedEngine
from agentrl.env import Task
from agentrl.rollout.runner import Budgets, EpisodeRequest, EpisodeRunner, RunnerSettings
from environments.code_interpreter import CodeInterpreter
from sandboxes import SandboxSpec, close_shared_pools
from sandboxes.e2b_local import LocalCodeInterpreterServer
from tests.helpers.sandbox_fixtures import FAST, assert_nothing_left, docker_options, make_or_skip

TASK = Task(id="t", prompt="What is 6 * 7?", answer=42)


@pytest.fixture(params=["bwrap", pytest.param("docker", marks=pytest.mark.docker), "e2b"])
def factory(request):
    backend, extra, cleanup = request.param, {}, []
    if backend == "e2b":
        inner = make_or_skip("bwrap", FAST)
        server = LocalCodeInterpreterServer(inner)
        extra = {"debug": True, "sandbox_url": server.url}
        cleanup = [server.close, inner.close]
    elif backend == "docker":
        make_or_skip("docker").close()
        extra = docker_options()
    yield functools.partial(
        CodeInterpreter, sandbox=SandboxSpec(backend, {"limits": FAST.to_json(), **extra})
    )
    close_shared_pools()
    for fn in cleanup:
        fn()
    assert_nothing_left()


def test_scripted_multi_turn_episodes(factory, tiny_tokenizer):
    # each round, active episodes generate in request order: ep0, ep1, ep0, ep1 (ep1 answers), ep0
    script = [
        "```python\nx = 6 * 7\nprint(x)\n```<|im_end|>",
        "```python\n1 / 0\n```<|im_end|>",
        "```python\nx + 1\n```<|im_end|>",
        "\\boxed{41}<|im_end|>",
        "\\boxed{42}<|im_end|>",
    ]
    runner = EpisodeRunner(
        ScriptedEngine(script, tokenizer=tiny_tokenizer),
        tiny_tokenizer,
        factory,
        RunnerSettings(budgets=Budgets(max_turns=4)),
    )
    try:
        eps = runner.run([EpisodeRequest(TASK, seed=s, group="g") for s in range(2)])
    finally:
        runner.close()
    good, bad = eps
    tools = [m["content"] for m in good.messages if m["role"] == "tool"]
    assert tools == ["42", "43"] and good.stop_reason == "answered" and good.reward == 1.0
    assert [s.role for s in good.segments].count("tool") == 2
    assert "ZeroDivisionError" in next(m["content"] for m in bad.messages if m["role"] == "tool")
    assert bad.failure is None and bad.reward == 0.0
    for e in eps:
        assert e.loss_mask() == [int(r == "policy") for r in e.roles()]
        assert tiny_tokenizer.decode(e.token_ids(), skip_special_tokens=False) == e.text()


def test_tiny_model_episodes(factory, tiny_policy):
    model, tokenizer = tiny_policy
    engine = HFEngine(model, tokenizer=tokenizer)
    runner = EpisodeRunner(
        engine,
        tokenizer,
        factory,
        RunnerSettings(budgets=Budgets(max_turns=2, max_tokens_per_turn=24), sampling=SamplingParams(seed=0)),
    )
    try:
        eps = runner.run([EpisodeRequest(TASK, seed=s, group="g") for s in range(4)])
    finally:
        runner.close()
    assert len(eps) == 4
    for e in eps:
        assert e.failure is None, e.failure
        assert e.stop_reason in ("answered", "void_turn", "max_turns", "token_budget")


@pytest.mark.skipif(
    not os.environ.get("E2B_API_KEY"), reason="E2B_API_KEY is not set: the live E2B cloud test needs it"
)
def test_live_e2b_cloud_episode(tiny_tokenizer):
    factory = functools.partial(CodeInterpreter, sandbox=SandboxSpec("e2b", {"limits": FAST.to_json()}))
    engine = ScriptedEngine(
        ["```python\nprint(6 * 7)\n```<|im_end|>", "\\boxed{42}<|im_end|>"], tokenizer=tiny_tokenizer
    )
    runner = EpisodeRunner(engine, tiny_tokenizer, factory, RunnerSettings(budgets=Budgets(max_turns=3)))
    try:
        (ep,) = runner.run([EpisodeRequest(TASK, seed=0)])
    finally:
        runner.close()
        close_shared_pools()
    assert [m["content"] for m in ep.messages if m["role"] == "tool"] == ["42"] and ep.reward == 1.0


def test_more_episodes_than_sessions_run_in_waves(tiny_tokenizer):
    """An evaluation's tasks × k can exceed the sandbox pool (one session per episode in flight):
    the lock-step runner runs them in waves of ``max_concurrent_episodes``. Before, it started all of
    them at once and the episodes past the pool's size waited for a session no running episode
    could free, then failed (a third of a 384-episode evaluation, after ``acquire_timeout_s``)."""
    spec = SandboxSpec("bwrap", {"limits": FAST.to_json()}, max_sessions=2, acquire_timeout_s=3.0)
    make_or_skip("bwrap", FAST).close()
    runner = EpisodeRunner(
        ScriptedEngine(["\\boxed{42}<|im_end|>"] * 6, tokenizer=tiny_tokenizer),
        tiny_tokenizer,
        functools.partial(CodeInterpreter, sandbox=spec),
        RunnerSettings(max_concurrent_episodes=2),
    )
    try:
        eps = runner.run([EpisodeRequest(TASK, seed=s, group="g") for s in range(6)])
    finally:
        runner.close()
        close_shared_pools()
    assert [e.failure for e in eps] == [None] * 6 and [e.reward for e in eps] == [1.0] * 6
    assert [e.seed for e in eps] == list(range(6))
    assert_nothing_left()
