"""rollout.context: an episode longer than its context budget stops, compacts (a trained summary,
then a new sample from the task, the summary and the latest observation) or windows (a new sample
from the newest whole turns). A scripted model that answers from whatever its context holds shows
what each policy keeps: the code survives a compaction, not a window."""

from __future__ import annotations

import re

import pytest
import torch

from agentrl.config import ConfigError, load_config
from agentrl.engines.scripted import ScriptedEngine
from agentrl.episode import Episode
from agentrl.rollout.async_runner import AsyncEpisodeRunner
from agentrl.rollout.context import ContextSettings
from agentrl.rollout.drift import diagnose
from agentrl.rollout.runner import Budgets, EpisodeRequest, EpisodeRunner, RunnerSettings
from agentrl.training.batch import build_batch
from environments.recall import QUESTION, Recall
from tests.helpers.invariants import check_invariants

BUDGETS = Budgets(max_turns=32, max_tokens_per_turn=24, max_episode_tokens=400)
BUDGET = 250


def reader(tokenizer):
    """A model that uses its context: ``ok`` to a message, the code it can see when asked, and a
    summary that keeps it; every prompt it was given is recorded by the engine."""

    def reply(prompt: list[int], _i: int) -> str:
        text = tokenizer.decode(prompt, skip_special_tokens=False)
        last_user = text.rsplit("<|im_start|>user\n", 1)[-1]
        seen = re.findall(r"The code is (\d+)", text)
        code = seen[-1] if seen else "0"
        if last_user.startswith("Your context is full"):
            return f"The code is {code}.<|im_end|>"
        if last_user.startswith(QUESTION):
            return f"\\boxed{{{code}}}<|im_end|>"
        return "ok<|im_end|>"

    return reply


def run(tokenizer, context: ContextSettings, runner_cls=EpisodeRunner, fillers: int = 6, budgets=BUDGETS):
    engine = ScriptedEngine(reader(tokenizer), tokenizer=tokenizer)
    settings = RunnerSettings(budgets=budgets, context=context)
    runner = runner_cls(engine, tokenizer, Recall, settings)
    (task,) = Recall.load_tasks("train", n=1, fillers=fillers, filler_words=6)
    try:
        (ep,) = runner.run([EpisodeRequest(task, seed=0, group="g")])
    finally:
        runner.close()
    check_invariants(ep, tokenizer)
    assert ep.failure is None, ep.failure
    return ep, engine, task


def test_without_a_budget_the_whole_conversation_is_one_sample(tiny_tokenizer):
    ep, engine, _ = run(tiny_tokenizer, ContextSettings(), budgets=Budgets(32, 24, 4000))
    assert ep.num_samples == 1 and ep.reward == 1.0 and "context" not in ep.metrics
    assert max(len(p) for p, _ in engine.calls) > BUDGET  # the budget below cuts this


def test_compaction_keeps_the_code_in_a_trained_summary(tiny_tokenizer):
    ep, engine, task = run(tiny_tokenizer, ContextSettings("compact", max_tokens=BUDGET))
    assert ep.stop_reason == "answered" and ep.reward == 1.0
    breaks = [b for b in ep.sample_breaks if b["reason"] == "compaction"]
    assert len(breaks) >= 2 and ep.num_samples == len(breaks) + 1
    assert all(b["summary"] == f"The code is {task.answer}." for b in breaks)
    assert all(b["request"] == Recall.summary_prompt for b in breaks)
    # every regular turn was written with room for a whole turn inside the budget
    for prompt, _params in engine.calls:
        text = tiny_tokenizer.decode(prompt, skip_special_tokens=False)
        if not text.rsplit("<|im_start|>user\n", 1)[-1].startswith("Your context is full"):
            assert len(prompt) + BUDGETS.max_tokens_per_turn <= BUDGET
    # the environment saw only its own conversation: no request, no summary
    actions = [m["content"] for m in ep.messages if m["role"] == "assistant"]
    assert actions == ["ok"] * 8 + [f"\\boxed{{{task.answer}}}"]
    assert not any("Your context is full" in str(m["content"]) for m in ep.messages)
    views = ep.sample_views()
    for k, (view, brk) in enumerate(zip(views[1:], breaks)):
        # the new sample's prompt is the template's render of the task, the summary and the latest
        # observation; the summary that ended the sample before is a policy turn there
        prompt = "".join(
            s.text
            for s in view.segments[: next(i for i, s in enumerate(view.segments) if s.role == "policy")]
        )
        context = brk["context"]
        assert [m["role"] for m in context] == ["system", "user", "assistant", "user"]
        assert context[2]["content"] == brk["summary"] and context[1]["content"] == task.prompt
        assert prompt == tiny_tokenizer.apply_chat_template(
            context, tokenize=False, add_generation_prompt=True
        )
        summary_turn = [s for s in views[k].segments if s.role == "policy"][-1]
        assert summary_turn.text.startswith(brk["summary"])
    assert [e["kind"] for e in ep.metrics["context"]] == ["compaction"] * len(breaks)
    assert all(e["after"] < e["tokens"] for e in ep.metrics["context"])
    assert diagnose(ep, tiny_tokenizer).drifts == []  # each sample is its messages' exact render
    assert Episode.from_json(ep.to_json()) == ep


def test_window_drops_whole_turns_and_the_code_with_them(tiny_tokenizer):
    ep, engine, _ = run(tiny_tokenizer, ContextSettings("window", max_tokens=BUDGET))
    assert ep.stop_reason == "answered" and ep.reward == 0.0  # the code was dropped
    breaks = ep.sample_breaks
    assert breaks and all(b["reason"] == "window" and b["dropped_turns"] >= 1 for b in breaks)
    for brk in breaks:
        rest = brk["context"][2:]
        assert rest[0]["role"] == "assistant"  # a whole turn: the reply, then what answered it
        assert "The code is" not in str(rest)
    assert all(len(p) + BUDGETS.max_tokens_per_turn <= BUDGET for p, _ in engine.calls)
    assert diagnose(ep, tiny_tokenizer).drifts == []


def test_stop_at_a_budget_ends_before_the_question(tiny_tokenizer):
    ep, _, _ = run(tiny_tokenizer, ContextSettings("stop", max_tokens=BUDGET))
    assert ep.stop_reason == "token_budget" and ep.reward == 0.0 and ep.num_samples == 1
    assert ep.metrics["context"][-1]["kind"] == "stop"
    assert not any(QUESTION in str(m["content"]) for m in ep.messages[:-1])


def test_every_sample_trains_with_the_episodes_advantage(tiny_tokenizer):
    ep, _, _ = run(tiny_tokenizer, ContextSettings("compact", max_tokens=BUDGET))
    batch = build_batch([ep], torch.tensor([0.5]), [1.0], pad_id=0)
    assert batch.ids.shape[0] == ep.num_samples
    assert torch.all(batch.advantages == 0.5)
    trained = int(batch.mask.sum())
    assert trained == ep.num_policy_tokens  # the summaries are policy tokens and train


def test_the_async_runner_compacts_the_same_way(tiny_tokenizer):
    ep, _, _ = run(tiny_tokenizer, ContextSettings("compact", max_tokens=BUDGET))
    ep2, _, _ = run(
        tiny_tokenizer, ContextSettings("compact", max_tokens=BUDGET), runner_cls=AsyncEpisodeRunner
    )
    assert ep2.token_ids() == ep.token_ids() and ep2.sample_breaks == ep.sample_breaks


@pytest.mark.parametrize(
    "overrides, key",
    [
        (
            ["rollout.context.max_tokens=5000", "rollout.max_episode_tokens=4000"],
            "rollout.context.max_tokens",
        ),
        (
            ["rollout.context.policy=window", "rollout.context.summary_prompt=hi"],
            "rollout.context.summary_prompt",
        ),
        (
            [
                "rollout.context.policy=compact",
                "rollout.context.max_tokens=BUDGET",
                "rollout.max_tokens_per_turn=256",
            ],
            "rollout.context.max_tokens",
        ),
        (["rollout.context.policy=squash"], "rollout.context.policy"),
    ],
)
def test_bad_context_settings_name_the_key(overrides, key):
    with pytest.raises(ConfigError) as e:
        load_config(None, ["env.name=recall", *overrides])
    assert key in str(e.value)


def test_metrics_replay_and_viewer_show_each_compaction(tiny_tokenizer):
    from io import StringIO

    from rich.console import Console

    from agentrl.training.metrics import episode_metrics
    from agentrl.views.replay import render_episode
    from agentrl.views.viewer.page import PieceDecoder, episode_payload

    ep, _, task = run(tiny_tokenizer, ContextSettings("compact", max_tokens=BUDGET))
    plain, _, _ = run(tiny_tokenizer, ContextSettings(), budgets=Budgets(32, 24, 4000))
    m = episode_metrics([ep, plain])
    n = len(ep.sample_breaks)
    assert m["context/compaction_frac"] == 0.5 and m["context/compactions"] == n / 2
    assert m["context/window_frac"] == 0.0 and m["context/summary_tokens"] > 0
    assert "context/compaction_frac" not in episode_metrics([plain])
    out = StringIO()
    render_episode(ep, Console(file=out, width=200, color_system=None))
    text = out.getvalue()
    assert text.count("new sample: compaction") == n and f"The code is {task.answer}." in text
    payload = episode_payload(ep, PieceDecoder(tiny_tokenizer))
    assert [at for at, _ in payload["breaks"]] == [a for a, _ in ep.sample_ranges()[1:]]
    assert all("compaction" in title for _, title in payload["breaks"])
