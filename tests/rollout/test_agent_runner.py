"""The OpenAI-compatible endpoint in front of the engine: agents written against the ``openai``
client, recorded token by token (agentrl.rollout.agent_runner, agentrl.agents)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import signal
import threading
import time
from typing import Any

import httpx
import openai
import pytest

from agentrl.agents import AgentEnvironment
from agentrl.engines.base import SamplingParams
from agentrl.engines.hf import HFEngine
from agentrl.engines.scripted import ScriptedEngine
from agentrl.env import Reward, Task, register
from agentrl.episode import Episode
from agentrl.rollout.agent_runner import AgentRunner, Endpoint
from agentrl.rollout.drift import diagnose
from agentrl.rollout.runner import Budgets, EpisodeRequest, EpisodeRunner, RunnerSettings
from agentrl.tools import ToolCall, format_tool_call
from environments.calculator import Calculator
from tests.helpers import ROOT
from tests.helpers.invariants import check_invariants
from tests.helpers.real_models import smollm2  # at import: the cache `agentrl models install` filled

TASK = Task(id="t1", prompt="What is 3 * 4 + 5?", answer=17, metadata={"expression": "3 * 4 + 5"})
CALL = format_tool_call("calculate", {"expression": "3 * 4 + 5"})


def scripted(tokenizer, replies):
    """A scripted engine whose log-probs differ per token (-0.1, -0.2, ...), so equal log-probs mean
    the same tokens went to the same places."""
    texts = list(replies)

    def reply(prompt, index):
        ids = tokenizer(texts[index], add_special_tokens=False)["input_ids"]
        return ids, [-0.1 * (k + 1) - index for k in range(len(ids))]

    return ScriptedEngine(reply, tokenizer=tokenizer)


async def calculator_agent(client, task, edit=None):
    """The calculator episode as an OpenAI-client agent: the same messages, tool schemas and tool
    outputs as the native ``Calculator`` environment."""
    calc = Calculator()
    messages = calc.reset(task, 0)
    tools = calc.tool_schemas()
    reply = None
    for turn in range(4):
        if edit is not None and turn == 1:
            edit(messages)
        r = await client.chat.completions.create(
            model="policy", messages=messages, tools=tools, logprobs=True
        )
        reply = r.choices[0].message
        messages.append(reply)  # the pydantic message, as agents commonly append it
        if not reply.tool_calls:
            break
        for c in reply.tool_calls:
            out = calc.call_tool(ToolCall(c.function.name, json.loads(c.function.arguments)))
            messages.append({"role": "tool", "tool_call_id": c.id, "content": out["content"]})
    return 1.0 if reply is not None and "17" in (reply.content or "") else 0.0


@register
class CalculatorAgent(AgentEnvironment):
    name = "test_calculator_agent"
    edit = None

    async def run(self, client, task):
        return await calculator_agent(client, task, type(self).edit)


def agent_run(engine, tokenizer, env=CalculatorAgent, n=1, tasks=(TASK,), on_drift="split", **settings):
    if settings.get("sampling") is None:
        settings.pop("sampling", None)
    runner = AgentRunner(engine, tokenizer, env, RunnerSettings(**settings), Endpoint(on_drift=on_drift))
    try:
        reqs = [EpisodeRequest(t, seed=i, group=t.id) for t in tasks for i in range(n)]
        return runner.run(reqs)
    finally:
        runner.close()


def native_run(engine, tokenizer, n=1, budgets=None, sampling=None):
    runner = EpisodeRunner(
        engine,
        tokenizer,
        Calculator,
        RunnerSettings(budgets=budgets or Budgets(), sampling=sampling or SamplingParams()),
    )
    try:
        return runner.run([EpisodeRequest(TASK, seed=i, group=TASK.id) for i in range(n)])
    finally:
        runner.close()


def test_an_openai_agent_records_what_a_native_episode_records(tiny_tokenizer):
    replies = [CALL + "<|im_end|>", "The answer is \\boxed{17}.<|im_end|>"]
    (native,) = native_run(scripted(tiny_tokenizer, replies), tiny_tokenizer)
    engine = scripted(tiny_tokenizer, replies)
    (agent,) = agent_run(engine, tiny_tokenizer)
    check_invariants(agent, tiny_tokenizer)
    assert agent.failure is None and agent.stop_reason == "answered" and agent.env == "test_calculator_agent"
    assert agent.token_ids() == native.token_ids()
    assert agent.roles() == native.roles() and agent.loss_mask() == native.loss_mask()
    assert agent.turns() == native.turns()
    assert agent.engine_logprobs() == native.engine_logprobs()
    assert agent.reward == 1.0 and agent.reward_components == {"agent": 1.0}
    assert agent.metrics["tool_calls"] == 1 and agent.num_samples == 1
    # what the engine sampled is what was recorded: each call's completion is a policy segment
    policy = [s for s in agent.segments if s.role == "policy"]
    for (prompt, _), seg in zip(engine.calls, policy):
        assert (
            seg.token_ids == tiny_tokenizer(replies[policy.index(seg)], add_special_tokens=False)["input_ids"]
        )
        assert prompt == agent.token_ids()[: len(prompt)]  # each turn extends the ledger, never re-tokenized
    # the client's view of the conversation: the reply's tool call in OpenAI form, then the tool output
    assert agent.messages[2]["tool_calls"][0]["function"]["name"] == "calculate"
    assert agent.messages[3] == {"role": "tool", "tool_call_id": "call_0_0", "content": "17"}


def test_a_sampled_episode_matches_the_native_runner_token_for_token(tiny_policy):
    """A real engine: the HF engine samples with the turn's seed, so the native runner and the endpoint
    get the same completion; the response carries the same ids and log-probs as the ledger."""
    model, tok = tiny_policy
    budgets = Budgets(max_turns=1, max_tokens_per_turn=12)
    from agentrl.engines.base import SamplingParams

    sampling = SamplingParams(temperature=1.0, seed=5)
    (native,) = native_run(HFEngine(model, tokenizer=tok), tok, budgets=budgets, sampling=sampling)
    seen = {}

    @register
    class Once(AgentEnvironment):
        name = "test_once_agent"

        async def run(self, client, task):
            r = await client.chat.completions.create(
                model="m",
                messages=Calculator().reset(task, 0),
                tools=Calculator().tool_schemas(),
                logprobs=True,
            )
            seen["ids"] = r.model_extra["agentrl"]["token_ids"]
            seen["logprobs"] = [x.logprob for x in r.choices[0].logprobs.content]
            return 0.0

    (agent,) = agent_run(HFEngine(model, tokenizer=tok), tok, env=Once, budgets=budgets, sampling=sampling)
    assert agent.failure is None
    policy = next(s for s in agent.segments if s.role == "policy")
    assert policy.token_ids == next(s for s in native.segments if s.role == "policy").token_ids
    assert agent.token_ids()[: len(agent.token_ids())] == native.token_ids()[: len(agent.token_ids())]
    assert seen["ids"] == policy.token_ids
    assert seen["logprobs"] == pytest.approx(policy.logprobs, abs=1e-6)


def test_concurrent_agents_never_mix_ledgers(tiny_tokenizer):
    """Eight agents at once, each with its own task; the engine answers with the number in the prompt
    it was given, so an answer recorded in the wrong ledger shows."""

    def reply(prompt, index):
        text = tiny_tokenizer.decode(prompt)
        n = re.findall(r"What is (\d+)\?", text)[-1]
        return tiny_tokenizer(f"\\boxed{{{n}}}<|im_end|>", add_special_tokens=False)["input_ids"]

    @register
    class Echo(AgentEnvironment):
        name = "test_echo_agent"

        async def run(self, client, task):
            r = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": task.prompt}]
            )
            return float(r.choices[0].message.content == f"\\boxed{{{task.answer}}}")

    tasks = [Task(f"t{i}", f"What is {100 + i}?", answer=100 + i) for i in range(8)]
    episodes = agent_run(
        ScriptedEngine(reply, tokenizer=tiny_tokenizer), tiny_tokenizer, env=Echo, tasks=tasks
    )
    assert [e.task_id for e in episodes] == [t.id for t in tasks]
    for ep, t in zip(episodes, tasks):
        policy = next(s for s in ep.segments if s.role == "policy")
        assert policy.text == f"\\boxed{{{t.answer}}}<|im_end|>" and ep.reward == 1.0
        assert f"What is {t.answer}?" in ep.segments[0].text


def _edit_user(messages):
    messages[1] = {"role": "user", "content": messages[1]["content"] + " Show your work."}


@pytest.mark.parametrize("policy", ["split", "fail", "retokenize"])
def test_a_client_that_edits_history_is_recorded_and_handled(tiny_tokenizer, policy, monkeypatch):
    monkeypatch.setattr(CalculatorAgent, "edit", staticmethod(_edit_user))
    replies = [CALL + "<|im_end|>", "The answer is \\boxed{17}.<|im_end|>"]
    (ep,) = agent_run(scripted(tiny_tokenizer, replies), tiny_tokenizer, on_drift=policy)
    (drift,) = ep.metrics["drift"]
    assert drift["message"] == 1 and drift["turn"] == 0 and drift["action"] == policy
    assert drift["kind"] == "other"  # new words in the user's message: not a template quirk
    first_policy = tiny_tokenizer(replies[0], add_special_tokens=False)["input_ids"]
    if policy == "fail":
        assert (
            ep.failure is not None
            and ep.failure.boundary == "agent"
            and "history drift" in ep.failure.message
        )
        assert ep.num_turns == 1
        return
    check_invariants(ep, tiny_tokenizer)
    assert ep.failure is None and ep.reward == 1.0 and ep.num_turns == 2
    if policy == "split":
        assert ep.num_samples == 2 and ep.sample_breaks[0]["reason"] == "drift:other"
        first, second = ep.sample_views()
        assert [s.token_ids for s in first.segments if s.role == "policy"] == [first_policy]
        # the new sample's prompt is the client's edited history, ready for the next turn
        prompt = "".join(s.text for s in itertools.takewhile(lambda s: s.role != "policy", second.segments))
        assert "Show your work." in prompt and prompt.endswith(
            "<|im_start|>tool\n17<|im_end|>\n<|im_start|>assistant\n"
        )
        assert second.messages[1]["content"].endswith("Show your work.") and len(second.messages) == 5
        # the first sample keeps the history it was generated under, so the doctor finds it clean
        assert first.messages[1]["content"] == TASK.prompt and len(first.messages) == 3
        assert Episode.from_json(ep.to_json()).sample_views()[0].messages == first.messages
        assert diagnose(ep, tiny_tokenizer).drifts == []
    else:  # retokenize: one sample, the first reply's tokens survive with their log-probs
        assert ep.num_samples == 1
        policy_segs = [s for s in ep.segments if s.role == "policy"]
        assert policy_segs[0].token_ids == first_policy
        assert policy_segs[0].logprobs == pytest.approx([-0.1 * (k + 1) for k in range(len(first_policy))])
        assert drift["policy_tokens_kept"] == len(first_policy) and drift["policy_tokens_dropped"] == 0
        assert "Show your work." in ep.segments[0].text or "Show your work." in ep.text()


def test_a_client_that_changes_its_tools_gets_a_sample_the_doctor_checks_with_its_own_tools(tiny_tokenizer):
    extra = {"type": "function", "function": {"name": "note", "description": "Take a note.", "parameters": {"type": "object", "properties": {}}}}  # fmt: skip

    @register
    class MoreTools(CalculatorAgent):
        name = "test_more_tools_agent"

        async def run(self, client, task):
            calc = Calculator()
            messages, tools = calc.reset(task, 0), calc.tool_schemas()
            r = await client.chat.completions.create(model="m", messages=messages, tools=tools)
            messages.append(r.choices[0].message)
            messages.append(
                {"role": "tool", "tool_call_id": r.choices[0].message.tool_calls[0].id, "content": "17"}
            )
            r = await client.chat.completions.create(model="m", messages=messages, tools=[*tools, extra])
            return 1.0 if "17" in (r.choices[0].message.content or "") else 0.0

    replies = [CALL + "<|im_end|>", "The answer is \\boxed{17}.<|im_end|>"]
    (ep,) = agent_run(scripted(tiny_tokenizer, replies), tiny_tokenizer, env=MoreTools)
    assert ep.failure is None and ep.reward == 1.0 and ep.num_samples == 2
    first, second = ep.sample_views()
    assert [t["function"]["name"] for t in first.metrics["tools"]] == ["calculate"]
    assert [t["function"]["name"] for t in second.metrics["tools"]] == ["calculate", "note"]
    assert diagnose(ep, tiny_tokenizer).drifts == []


def test_the_endpoint_refuses_what_it_cannot_honour(tiny_tokenizer):
    engine = scripted(tiny_tokenizer, ["Hi.<|im_end|>"] * 8)
    runner = AgentRunner(
        engine, tiny_tokenizer, CalculatorAgent, RunnerSettings(budgets=Budgets(max_turns=1))
    )
    try:
        lv = runner.open(EpisodeRequest(TASK, seed=0), key="ep-1")
        client = openai.OpenAI(base_url=runner.url, api_key="ep-1", max_retries=0)
        msgs = [{"role": "user", "content": "hello"}]
        with pytest.raises(openai.BadRequestError, match=r"rollout\.temperature"):
            client.chat.completions.create(model="m", messages=msgs, temperature=0.3)
        with pytest.raises(openai.BadRequestError, match="seed"):
            client.chat.completions.create(model="m", messages=msgs, seed=1)
        with pytest.raises(openai.NotFoundError, match="no episode is open"):
            openai.OpenAI(base_url=runner.url, api_key="nope", max_retries=0).chat.completions.create(
                model="m", messages=msgs
            )
        r = client.chat.completions.create(model="m", messages=msgs, temperature=1.0)  # the run's own: fine
        assert r.choices[0].message.content == "Hi." and r.choices[0].finish_reason == "stop"
        # max_turns=1: the next turn ends the episode with an error the agent can read
        with pytest.raises(openai.BadRequestError, match="max_turns"):
            client.chat.completions.create(
                model="m", messages=[*msgs, r.choices[0].message, {"role": "user", "content": "more"}]
            )
        assert lv.episode.stop_reason == "max_turns" and lv.episode.failure is None
        assert httpx.get(runner.url.removesuffix("/v1") + "/health").status_code == 200
    finally:
        runner.close()


def test_budget_errors_end_an_agent_episode_without_failing_it(tiny_tokenizer):
    @register
    class Chatty(AgentEnvironment):
        name = "test_chatty_agent"

        def rewards(self):
            return [Reward("said_hi", lambda task, state: float(state.final_text == "Hi."))]

        async def run(self, client, task):
            msgs = [{"role": "user", "content": task.prompt}]
            while True:  # never stops on its own: the endpoint's max_turns does
                r = await client.chat.completions.create(model="m", messages=msgs)
                msgs += [r.choices[0].message, {"role": "user", "content": "again"}]

    engine = scripted(tiny_tokenizer, ["Hi.<|im_end|>"] * 8)
    (ep,) = agent_run(engine, tiny_tokenizer, env=Chatty, budgets=Budgets(max_turns=3))
    assert ep.failure is None and ep.stop_reason == "max_turns" and ep.num_turns == 3
    assert ep.reward == 1.0 and ep.reward_components == {"said_hi": 1.0}
    assert "has ended (max_turns)" in ep.metrics["agent_error"]


def test_an_agent_that_raises_fails_its_episode_only(tiny_tokenizer):
    @register
    class Flaky(AgentEnvironment):
        name = "test_flaky_agent"

        async def run(self, client, task):
            if task.id == "bad":
                raise RuntimeError("agent bug")
            r = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
            return float(bool(r.choices[0].message.content))

    engine = scripted(tiny_tokenizer, ["Hi.<|im_end|>"] * 4)
    good, bad = agent_run(engine, tiny_tokenizer, env=Flaky, tasks=(Task("good", "x"), Task("bad", "x")))
    assert good.failure is None and good.reward == 1.0
    assert bad.failure is not None and bad.failure.boundary == "agent" and "agent bug" in bad.failure.message


def test_a_sync_agent_gets_a_sync_client(tiny_tokenizer):
    @register
    class Plain(AgentEnvironment):
        name = "test_sync_agent"

        def run(self, client, task):  # not async: runs in a thread with openai.OpenAI
            assert isinstance(client, openai.OpenAI)
            r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
            return 0.5 if r.choices[0].message.content == "Hi." else 0.0

    (ep,) = agent_run(scripted(tiny_tokenizer, ["Hi.<|im_end|>"]), tiny_tokenizer, env=Plain)
    assert ep.failure is None and ep.reward == 0.5


def test_serve_mode_opens_episodes_by_key_and_writes_them_when_finished(tiny_tokenizer):
    from agentrl.cli.serve import ServedEpisode, ServedRunner

    engine = scripted(tiny_tokenizer, ["Hi.<|im_end|>"] * 4)
    done: list[Episode] = []
    runner = ServedRunner(engine, tiny_tokenizer, ServedEpisode, on_finish=done.append)
    try:
        base = runner.url
        for key in ("a", "b"):
            r = httpx.post(
                f"{base}/chat/completions",
                headers={"X-Episode-Key": key},
                json={"model": "m", "messages": [{"role": "user", "content": f"hello {key}"}]},
            )
            assert r.status_code == 200 and r.json()["agentrl"]["episode"] == key
        shown = httpx.get(f"{base}/episodes/a").json()
        assert Episode.from_dict(shown).num_turns == 1
        # a bare NaN or Infinity (not JSON, but what json.dumps writes and Python reads): refused with
        # 400, the episode left open; before, 200 with "reward": 0.0 and a failed episode written
        for bare in ("NaN", "Infinity", "-Infinity"):
            r = httpx.post(
                f"{base}/episodes/a/finish",
                content=f'{{"reward": {bare}}}',
                headers={"content-type": "application/json"},
            )
            assert r.status_code == 400 and "finite" in r.json()["error"]["message"], (bare, r.text)
        assert done == []
        r = httpx.post(f"{base}/episodes/a/finish", json={"reward": 0.25})
        assert r.status_code == 200 and r.json()["reward"] == 0.25
        assert [e.id for e in done] == ["a"] and done[0].reward == 0.25
        assert "hello a" in done[0].segments[0].text
        left = runner.abandon_open("stopped")
        assert [e.id for e in left] == ["b"] and left[0].failure.boundary == "agent"
    finally:
        runner.close()


def test_serve_mode_a_rejected_request_opens_no_episode(tiny_tokenizer):
    """The trial's report: a request refused with 400 opened an episode, which /finish then wrote
    with no turn. Refused by the backend (sampling fixed, no thinking switch) or by the schema (n),
    a request leaves nothing under its key; on an episode with a turn, it leaves the episode as it was."""
    from agentrl.cli.serve import ServedEpisode, ServedRunner

    done: list[Episode] = []
    runner = ServedRunner(scripted(tiny_tokenizer, ["Hi.<|im_end|>"] * 2), tiny_tokenizer, ServedEpisode, on_finish=done.append)  # fmt: skip
    base, msgs = runner.url, [{"role": "user", "content": "hello"}]

    def post(key, messages, **extra):
        body = {"model": "m", "messages": messages, **extra}
        return httpx.post(f"{base}/chat/completions", headers={"X-Episode-Key": key}, json=body)

    try:
        for extra in ({"temperature": 0.3}, {"seed": 1}, {"reasoning_effort": "low"}, {"n": 2}):
            assert post("a", msgs, **extra).status_code == 400, extra
            assert httpx.get(f"{base}/episodes/a").status_code == 404, extra
        assert httpx.post(f"{base}/episodes/a/finish", json={"reward": 1.0}).status_code == 404
        first = post("b", msgs)
        assert first.status_code == 200
        before = httpx.get(f"{base}/episodes/b").json()
        more = [*msgs, first.json()["choices"][0]["message"], {"role": "user", "content": "more"}]
        assert post("b", more, temperature=0.3).status_code == 400
        assert httpx.get(f"{base}/episodes/b").json() == before
        assert httpx.post(f"{base}/episodes/b/finish", json={"reward": 1.0}).json()["turns"] == 1
        assert [e.id for e in done] == ["b"] and runner.abandon_open("stopped") == []
    finally:
        runner.close()


def test_reasoning_effort_switches_a_thinking_template_and_is_recorded():
    """``reasoning_effort`` (OpenAI's values) sets a template's ``enable_thinking``: "none" turns
    thinking off (Qwen3 writes an empty think block after the generation prompt), any other value
    leaves it on; each turn's value is recorded. A value OpenAI does not define is refused."""
    from agentrl.models.chat_templates import family_tokenizer

    tok = family_tokenizer("qwen3")
    runner = AgentRunner(scripted(tok, ["Hi.<|im_end|>"] * 3), tok, CalculatorAgent)
    empty_think = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    try:
        lv = runner.open(EpisodeRequest(TASK, seed=0), key="k")
        client = openai.OpenAI(base_url=runner.url, api_key="k", max_retries=0)
        msgs: list = [{"role": "user", "content": "x"}]
        with pytest.raises(openai.BadRequestError, match="reasoning_effort") as refused:
            client.chat.completions.create(model="m", messages=msgs, reasoning_effort="extreme")
        assert refused.value.body["param"] == "reasoning_effort" and lv.episode.segments == []
        for effort in ("none", "high", "none"):
            r = client.chat.completions.create(model="m", messages=msgs, reasoning_effort=effort)
            msgs += [r.choices[0].message, {"role": "user", "content": "again"}]
        ep = lv.episode
        # the text each turn's generation prompt ends: the prompt, then the observations before turns 1, 2
        ends = [s.text for s in ep.segments if s.role in ("prompt", "scaffold") and "assistant" in s.text]
        assert [t.endswith(empty_think) for t in ends] == [True, False, True]
        assert ep.metrics["reasoning_effort"] == [
            {"turn": 0, "effort": "none", "enable_thinking": False},
            {"turn": 1, "effort": "high", "enable_thinking": True},
            {"turn": 2, "effort": "none", "enable_thinking": False},
        ]
    finally:
        runner.close()


def test_reasoning_effort_without_a_thinking_switch_is_refused_as_openai_does(tiny_tokenizer):
    runner = AgentRunner(scripted(tiny_tokenizer, ["Hi.<|im_end|>"]), tiny_tokenizer, CalculatorAgent)
    try:
        lv = runner.open(EpisodeRequest(TASK, seed=0), key="k")
        r = httpx.post(f"{runner.url}/chat/completions", headers={"X-Episode-Key": "k"},
                       json={"model": "m", "messages": [{"role": "user", "content": "x"}], "reasoning_effort": "low"})  # fmt: skip
        error = r.json()["error"]
        assert r.status_code == 400 and error["type"] == "invalid_request_error"
        assert error["param"] == "reasoning_effort" and error["code"] == "unsupported_parameter"
        assert error["message"].startswith(
            "Unsupported parameter: 'reasoning_effort' is not supported with this model"
        )
        assert lv.episode.segments == [] and "reasoning_effort" not in lv.episode.metrics
    finally:
        runner.close()


def test_concurrent_requests_on_one_episode_are_refused(tiny_tokenizer):
    gate = threading.Event()

    def reply(prompt, index):
        gate.wait(5)
        return tiny_tokenizer("Hi.<|im_end|>", add_special_tokens=False)["input_ids"]

    runner = AgentRunner(ScriptedEngine(reply, tokenizer=tiny_tokenizer), tiny_tokenizer, CalculatorAgent)
    try:
        runner.open(EpisodeRequest(TASK, seed=0), key="k")
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
        first = threading.Thread(target=lambda: httpx.post(f"{runner.url}/chat/completions", json=body, headers={"Authorization": "Bearer k"}, timeout=10))  # fmt: skip
        first.start()
        for _ in range(100):
            if runner._ledgers["k"].busy:
                break
            threading.Event().wait(0.01)
        r = httpx.post(f"{runner.url}/chat/completions", json=body, headers={"Authorization": "Bearer k"})
        assert r.status_code == 409 and r.json()["error"]["code"] == "agentrl_episode_busy"
        gate.set()
        first.join(10)
    finally:
        gate.set()
        runner.close()


def test_the_guides_agent_runs_through_the_endpoint_as_written(tiny_tokenizer):
    """docs/examples/agent_env.py (docs/environments.md): with an engine that calls the tool and then
    answers with its result, the agent's own loop earns reward 1."""
    from agentrl.env import import_environment_module, registered

    import_environment_module(str(ROOT / "docs" / "examples" / "agent_env.py"))
    env_cls = registered()["arithmetic_agent"]
    (task,) = env_cls.load_tasks("train", n=1)
    a, b = map(int, re.findall(r"\d+", task.prompt))

    def reply(prompt, index):
        text = tiny_tokenizer.decode(prompt)
        if index == 0:
            out = format_tool_call("add", {"a": a, "b": b}) + "<|im_end|>"
        else:
            out = text.rsplit("<|im_start|>tool\n", 1)[1].split("<|im_end|>")[0] + "<|im_end|>"
        return tiny_tokenizer(out, add_special_tokens=False)["input_ids"]

    (ep,) = agent_run(
        ScriptedEngine(reply, tokenizer=tiny_tokenizer), tiny_tokenizer, env=env_cls, tasks=(task,)
    )
    assert ep.failure is None and ep.reward == 1.0 and ep.num_turns == 2
    assert [s.role for s in ep.segments].count("tool") == 1 and ep.metrics["tool_calls"] == 1


def test_a_stuck_plain_agent_fails_its_episode_and_does_not_hold_the_run(tiny_tokenizer):
    release = threading.Event()

    @register
    class Stuck(AgentEnvironment):
        name = "test_stuck_sync_agent"

        def run(self, client, task):
            if task.id == "stuck":
                release.wait(30)  # a hung agent: never returns within agent_run_s
            r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
            return float(bool(r.choices[0].message.content))

    engine = scripted(tiny_tokenizer, ["Hi.<|im_end|>"] * 4)
    t0 = time.perf_counter()
    try:
        ok, stuck = agent_run(
            engine,
            tiny_tokenizer,
            env=Stuck,
            tasks=(Task("ok", "x"), Task("stuck", "x")),
            agent_timeout_s=1.0,
        )
        # the stuck agent's thread is a daemon: it cannot hold the process at exit either
        stuck_threads = [t for t in threading.enumerate() if t.name == "agentrl-agent"]
        assert stuck_threads and all(t.daemon for t in stuck_threads)
    finally:
        release.set()
    assert time.perf_counter() - t0 < 10  # bounded by the timeout, not by the agent
    assert ok.failure is None and ok.reward == 1.0
    assert stuck.failure is not None and stuck.failure.boundary == "agent"
    assert "timeouts.agent_run_s=1s" in stuck.failure.message


class BoundedScripted(ScriptedEngine):
    """A scripted engine that says it can bound its calls, as ``HFEngine`` does: the endpoint then
    generates in the thread that called ``run`` (``RequestBatcher.drive``)."""

    def bounded(self, timeout_s, what, setting=None):
        return contextlib.nullcontext()


@pytest.mark.parametrize("engine_cls", [BoundedScripted, ScriptedEngine], ids=["driven", "batcher-thread"])
def test_a_second_ctrl_c_stops_the_run_at_once(tiny_tokenizer, engine_cls, ctrl_c):
    """A real SIGINT mid-rollout (the trainer's second Ctrl-C raises KeyboardInterrupt in the main
    thread, which generates or waits): the run raises it within seconds, not after the requests'
    timeouts, with every agent stopped, no ledger left open and every environment closed."""
    closed = []

    @register
    class Closing(CalculatorAgent):
        name = "test_closing_calculator_agent"

        def close(self):
            closed.append(self.task.id)

    def reply(prompt, index):
        if index == 4:  # the second turn's first generation
            os.kill(os.getpid(), signal.SIGINT)
        return tiny_tokenizer(CALL + "<|im_end|>", add_special_tokens=False)["input_ids"]

    engine = engine_cls(reply, tokenizer=tiny_tokenizer)
    runner = AgentRunner(
        engine, tiny_tokenizer, Closing, RunnerSettings(budgets=Budgets(), request_timeout_s=120)
    )
    tasks = [Task(f"t{i}", TASK.prompt, answer=17) for i in range(4)]
    t0 = time.perf_counter()
    try:
        with pytest.raises(KeyboardInterrupt):
            runner.run([EpisodeRequest(t, seed=0, group=t.id) for t in tasks])
        assert time.perf_counter() - t0 < 20  # not the 120 s request timeout
        assert not runner._ledgers and sorted(closed) == ["t0", "t1", "t2", "t3"]
        deadline = time.monotonic() + 10
        while any(t.name == "agentrl-agents" for t in threading.enumerate()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(t.name == "agentrl-agents" for t in threading.enumerate())
        engine.script = lambda prompt, index: reply(prompt, 0)  # the runner still works afterwards
        closed.clear()
        (ep,) = runner.run([EpisodeRequest(TASK, seed=0, group=TASK.id)])
        assert ep.failure is None and ep.num_turns == 4
    finally:
        runner.close()


def test_tool_call_arguments_reach_the_template_as_objects():
    """Stock templates apply ``tojson`` to a call's arguments: JSON text would be encoded twice."""
    from agentrl.rollout.agent_ledger import canonical, for_template

    msg = {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}]}  # fmt: skip
    shown = for_template(msg)
    assert shown["tool_calls"][0]["function"]["arguments"] == {"a": 1}
    assert msg["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'  # the client's copy is untouched
    assert canonical(shown) == canonical(msg)


@pytest.mark.slow
def test_agentrl_serve_records_episodes_that_inspect_and_doctor_read(
    tmp_path, tiny_model_dir, capsys, monkeypatch
):
    import signal
    import subprocess
    import sys

    from agentrl.cli import main

    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentrl.cli", "serve", str(ROOT / "configs" / "quickstart.yaml"),
         f"model.path={tiny_model_dir}", "sft.enabled=false", f"run.output_dir={run}", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        line = proc.stdout.readline()  # "agentrl serve: MODEL at URL (episodes -> ...)"
        url = re.search(r"at (http://127\.0\.0\.1:\d+/v1)", line)[1]
        client = openai.OpenAI(base_url=url, api_key="episode-1", max_retries=0)
        reply = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
        assert reply.model_extra["agentrl"]["episode"] == "episode-1"
        openai.OpenAI(base_url=url, api_key="episode-2", max_retries=0).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Hello"}], max_tokens=4
        )
        assert httpx.post(f"{url}/episodes/episode-1/finish", json={"reward": 0.5}).json()["reward"] == 0.5
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
    assert proc.returncode == 0
    episodes = {
        e.id: e
        for e in map(Episode.from_json, (run / "serve" / "transcripts.jsonl").read_text().splitlines())
    }
    assert episodes["episode-1"].reward == 0.5 and episodes["episode-1"].failure is None
    assert episodes["episode-2"].failure.boundary == "agent"  # still open at Ctrl-C: written, not lost
    # in this process (a fresh one cost ~10 s of imports, issue 51), from where serve ran
    monkeypatch.chdir(ROOT)
    capsys.readouterr()
    code = main(["doctor", str(run / "serve")])
    out = capsys.readouterr()
    # it found the tokenizer and the history policy (1 = a random model's cut-off tokens re-render differently)
    assert code in (0, 1) and "history: merge" in out.out, out.out + out.err


CHATML = (  # SmolLM2's kind of template: no tools section, tool calls dropped
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def chatml(tokenizer):
    import copy

    tok = copy.deepcopy(tokenizer)
    tok.chat_template = CHATML
    return tok


def test_a_template_without_tools_gets_them_in_the_system_message_as_in_training(tiny_tokenizer):
    """A template that renders neither tools nor tool calls (SmolLM2's ChatML): the endpoint writes the
    schemas and the call format into the system message and parses the calls from the text, exactly
    as a training episode does (before, a request with tools was refused with 400)."""
    tok = chatml(tiny_tokenizer)
    replies = [f"{CALL}<|im_end|>", "It is 17.<|im_end|>"]
    (agent,) = agent_run(scripted(tok, replies), tok)
    (native,) = native_run(scripted(tok, replies), tok)  # rollout.tools_prompt: auto, as in training
    assert agent.failure is None and agent.reward == 1.0 and agent.metrics["tool_calls"] == 1
    assert agent.metrics["tools_prompt"] == native.metrics["tools_prompt"] == "system"
    prompt = agent.segments[0]
    assert "<tools>" in prompt.text and '"calculate"' in prompt.text  # what the model read
    # the same prompt, tool call and tool output tokens as the native episode
    assert [(s.role, s.token_ids) for s in agent.segments] == [(s.role, s.token_ids) for s in native.segments]  # fmt: skip


def test_tools_prompt_system_puts_them_in_the_system_message_for_any_template(tiny_tokenizer):
    """``rollout.tools_prompt: system`` with a template that has a tools section: the endpoint follows
    the setting, as training does."""
    replies = [f"{CALL}<|im_end|>", "It is 17.<|im_end|>"]
    (agent,) = agent_run(scripted(tiny_tokenizer, replies), tiny_tokenizer, tools_prompt="system")
    runner = EpisodeRunner(scripted(tiny_tokenizer, replies), tiny_tokenizer, Calculator, RunnerSettings(tools_prompt="system"))  # fmt: skip
    (native,) = runner.run([EpisodeRequest(TASK, seed=0, group=TASK.id)])
    assert agent.failure is None and agent.metrics["tool_calls"] == 1
    assert agent.metrics["tools_prompt"] == native.metrics["tools_prompt"] == "system"
    assert [(s.role, s.token_ids) for s in agent.segments] == [(s.role, s.token_ids) for s in native.segments]  # fmt: skip


@pytest.mark.parametrize("policy", ["split", "retokenize"])
def test_an_edited_history_on_a_chatml_template_keeps_the_tool_calls_as_written(tiny_tokenizer, policy, monkeypatch):  # fmt: skip
    """Drift re-renders the client's history: the assistant's tool call, which this template cannot
    render, goes back as the text the policy wrote, so its tokens survive a retokenize."""
    monkeypatch.setattr(CalculatorAgent, "edit", staticmethod(_edit_user))
    tok = chatml(tiny_tokenizer)
    replies = [CALL + "<|im_end|>", "The answer is \\boxed{17}.<|im_end|>"]
    (ep,) = agent_run(scripted(tok, replies), tok, on_drift=policy)
    assert ep.failure is None and ep.reward == 1.0 and ep.metrics["drift"][0]["kind"] == "other"
    check_invariants(ep, tok)
    assert ep.text().count("<tools>") == ep.num_samples  # each sample's prompt shows the tools once
    if policy == "retokenize":
        first_policy = tok(replies[0], add_special_tokens=False)["input_ids"]
        assert ep.metrics["drift"][0]["policy_tokens_kept"] == len(first_policy)
    else:
        second = ep.sample_views()[1]  # prompted with the client's history: the call as written
        assert CALL in "".join(
            s.text for s in itertools.takewhile(lambda s: s.role != "policy", second.segments)
        )


def test_tool_choice_none_leaves_the_tools_out_and_parses_no_calls(tiny_tokenizer):
    tok = chatml(tiny_tokenizer)
    runner = AgentRunner(scripted(tok, [f"{CALL}<|im_end|>"]), tok, CalculatorAgent)
    try:
        lv = runner.open(EpisodeRequest(TASK, seed=0), key="k")
        client = openai.OpenAI(base_url=runner.url, api_key="k", max_retries=0)
        tools = Calculator().tool_schemas()
        r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], tools=tools, tool_choice="none")  # fmt: skip
        assert r.choices[0].message.tool_calls is None and r.choices[0].message.content == CALL
        assert "<tools>" not in lv.episode.segments[0].text and "calculate" not in lv.episode.segments[0].text
    finally:
        runner.close()


def test_tool_calls_parsed_from_text_stream_as_openai_tool_calls(tiny_tokenizer):
    tok = chatml(tiny_tokenizer)
    runner = AgentRunner(scripted(tok, [f"Let me compute.{CALL}<|im_end|>"]), tok, CalculatorAgent)
    try:
        runner.open(EpisodeRequest(TASK, seed=0), key="k")
        client = openai.OpenAI(base_url=runner.url, api_key="k", max_retries=0)
        tools = Calculator().tool_schemas()
        chunks = list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], tools=tools, stream=True))  # fmt: skip
        calls = [c for ch in chunks if ch.choices for c in ch.choices[0].delta.tool_calls or ()]
        assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [("calculate", {"expression": "3 * 4 + 5"})]  # fmt: skip
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == "Let me compute."
        assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "tool_calls"
    finally:
        runner.close()


def test_a_template_without_tool_calls_serves_agents_without_tools(tiny_tokenizer):
    """A chat template that cannot render tool calls still serves plain chat."""
    tok = chatml(tiny_tokenizer)
    runner = AgentRunner(scripted(tok, ["Hi.<|im_end|>"] * 2), tok, CalculatorAgent)
    try:
        runner.open(EpisodeRequest(TASK, seed=0), key="k")
        client = openai.OpenAI(base_url=runner.url, api_key="k", max_retries=0)
        r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        assert r.choices[0].message.content == "Hi." and r.choices[0].message.tool_calls is None
    finally:
        runner.close()


def smollm2_engine():
    import transformers

    path = smollm2()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    return tok, HFEngine(model, tok)


@pytest.mark.slow
def test_smollm2_served_with_tools_starts_as_its_training_episode_does():
    """The real SmolLM2 checkpoint behind the endpoint, asked through the ``openai`` client with the
    calculator's tools: served (before: 400 "cannot carry tool calls"), with the schemas in the system
    message, and greedy decoding gives the native training episode's prompt and reply token for token."""
    settings = RunnerSettings(budgets=Budgets(max_tokens_per_turn=24, max_turns=1), sampling=SamplingParams(temperature=0.0))  # fmt: skip
    tok, engine = smollm2_engine()
    (native,) = EpisodeRunner(engine, tok, Calculator, settings).run([EpisodeRequest(TASK, seed=0)])
    runner = AgentRunner(engine, tok, CalculatorAgent, settings)
    try:
        lv = runner.open(EpisodeRequest(TASK, seed=0), key="k")
        client = openai.OpenAI(base_url=runner.url, api_key="k", max_retries=0)
        calc = Calculator()
        r = client.chat.completions.create(model="m", messages=calc.reset(TASK, 0), tools=calc.tool_schemas())  # fmt: skip
        served = lv.episode
    finally:
        runner.close()
    assert native.metrics["tools_prompt"] == served.metrics["tools_prompt"] == "system"
    assert "<tools>" in served.segments[0].text and '"calculate"' in served.segments[0].text
    policy = lambda ep: next(s.token_ids for s in ep.segments if s.role == "policy")  # noqa: E731
    assert served.segments[0].token_ids == native.segments[0].token_ids and policy(served) == policy(native)
    assert r.choices[0].message.content or r.choices[0].message.tool_calls


@pytest.mark.slow
@pytest.mark.parametrize("streamed", [False, True], ids=["run_sync", "run_streamed"])
def test_openai_agents_runs_a_tool_through_the_endpoint_on_a_chatml_template(tiny_tokenizer, streamed):
    """An agent framework users have (openai-agents) against a template without a tools section: its
    function tool is called from the policy's text and its result comes back as a tool message. Also
    streamed (``Runner.run_streamed``: its model asks with ``stream: true`` and reads the endpoint's
    server-sent events, the tool call assembled from them)."""
    agents = pytest.importorskip("agents", reason="openai-agents is not installed (pip install openai-agents)")  # fmt: skip
    tok = chatml(tiny_tokenizer)
    replies = [f"{CALL}<|im_end|>", "It is 17.<|im_end|>"]
    runner = AgentRunner(scripted(tok, replies), tok, CalculatorAgent)
    seen = []

    @agents.function_tool
    def calculate(expression: str) -> str:
        """Evaluate an integer arithmetic expression."""
        seen.append(expression)
        return "17"

    try:
        lv = runner.open(EpisodeRequest(TASK, seed=0), key="k")
        client = openai.AsyncOpenAI(base_url=runner.url, api_key="k", max_retries=0)
        model = agents.OpenAIChatCompletionsModel(model="m", openai_client=client)
        agents.set_tracing_disabled(True)
        agent = agents.Agent(
            name="calc", instructions="Use the calculate tool.", model=model, tools=[calculate]
        )
        if streamed:

            async def run_streamed() -> tuple[Any, list[str]]:
                result = agents.Runner.run_streamed(agent, TASK.prompt)
                return result, [event.type async for event in result.stream_events()]

            result, events = asyncio.run(run_streamed())
            assert "raw_response_event" in events and "run_item_stream_event" in events, events
        else:
            result = agents.Runner.run_sync(agent, TASK.prompt)
    finally:
        runner.close()
    assert seen == ["3 * 4 + 5"] and result.final_output == "It is 17."
    assert "<tools>" in lv.episode.segments[0].text and lv.calls == 1  # one call parsed from the text
    assert any(s.role == "tool" and "17" in s.text for s in lv.episode.segments)  # its result, recorded
