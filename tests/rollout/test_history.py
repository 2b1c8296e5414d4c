"""rollout.history with a thinking template: split and merge samples, and how a split episode trains
(one group member, every sample its row, overlays joined back)."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch

from agentrl.engines.scripted import ScriptedEngine
from agentrl.env import Environment, Reward, StepResult, Task
from agentrl.episode import Episode, Segment
from agentrl.models.chat_templates import family_tokenizer
from agentrl.rollout.runner import Budgets, EpisodeRequest, EpisodeRunner, RunnerSettings
from agentrl.training.batch import build_batch
from agentrl.training.learner import Learner
from environments.calculator import Calculator
from tests.helpers.invariants import check_invariants

TASK = Task(id="g", prompt="Guess my number.", answer="4")
REPLIES = [
    "<think>\nfirst idea\n</think>\n\nIs it 3?<|im_end|>",
    "<think>\nsecond idea\n</think>\n\n\\boxed{4}<|im_end|>",
]


class Guess(Environment):
    """Answers a wrong guess with a user message: a new user query, after which a Qwen3-style
    template drops the earlier turn's reasoning from the history."""

    name = "test_guess"

    def step(self, action):
        if "\\boxed{4}" in action:
            return StepResult([], 0.0, True, False, {"answer": "4"})
        return StepResult([{"role": "user", "content": "Try again."}], 0.0, False, False, {})

    def rewards(self):
        return [Reward("correct", lambda task, state: float(state.info.get("answer") == task.answer))]


def run(tokenizer, replies=REPLIES, env=Guess, history="auto", task=TASK):
    engine = ScriptedEngine(list(replies), tokenizer=tokenizer)
    runner = EpisodeRunner(
        engine, tokenizer, env, RunnerSettings(budgets=Budgets(max_turns=4), history=history)
    )
    try:
        (ep,) = runner.run([EpisodeRequest(task, seed=0, group="g")])
    finally:
        runner.close()
    check_invariants(ep, tokenizer)
    assert ep.failure is None, ep.failure
    return ep, engine


def test_split_starts_a_sample_where_the_served_history_drops_thinking():
    tok = family_tokenizer("qwen3")
    ep, engine = run(tok)
    assert ep.num_samples == 2 and ep.sample_breaks[0]["reason"] == "history"
    assert (
        ep.metrics["history"]["policy"] == "split"
        and "strips the reasoning" in ep.metrics["history"]["reason"]
    )
    first, second = ep.sample_views()
    # the model's own thinking stays in the sample that produced it, with its log-probs
    assert "first idea" in "".join(s.text for s in first.segments if s.role == "policy")
    # the next sample's prompt is what a server would show: the template's render, reasoning stripped
    prompt = list(itertools.takewhile(lambda s: s.role != "policy", second.segments))
    served = tok.apply_chat_template(ep.messages[:3], tokenize=False, add_generation_prompt=True)
    assert "".join(s.text for s in prompt) == served and "first idea" not in served
    assert all(s.role == "prompt" for s in prompt)
    assert engine.calls[1][0] == second.token_ids()[: len(engine.calls[1][0])]  # the model saw that
    assert "second idea" in "".join(s.text for s in second.segments if s.role == "policy")
    assert [v.num_policy_tokens for v in (first, second)] == [
        len(tok(r, add_special_tokens=False)["input_ids"]) for r in REPLIES
    ]
    assert ep.sample_ranges() == [(0, len(first.token_ids())), (len(first.token_ids()), len(ep.token_ids()))]
    assert ep.reward == 1.0 and Episode.from_json(ep.to_json()) == ep


def test_merge_keeps_one_sample_with_the_thinking_in_context():
    tok = family_tokenizer("qwen3")
    ep, engine = run(tok, history="merge")
    assert ep.num_samples == 1 and ep.metrics["history"]["policy"] == "merge"
    assert "server would show" in ep.metrics["history"]["reason"]  # it says what merge costs here
    assert engine.calls[1][0] == ep.token_ids()[: len(engine.calls[1][0])]
    assert "first idea" in tok.decode(engine.calls[1][0])  # the model saw its earlier thinking


def test_templates_that_keep_thinking_never_split():
    ep, _ = run(family_tokenizer("qwen2_5"))
    assert ep.num_samples == 1 and "history" not in ep.metrics  # nothing to report: merge by probe


def test_tool_turns_after_the_last_user_query_keep_thinking_and_do_not_split():
    """Qwen3 keeps reasoning for assistant turns after the last user query: a tool-calling episode with
    no new user message is one sample under auto."""
    tok = family_tokenizer("qwen3")
    call = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "3 * 4 + 5"}}\n</tool_call>'
    replies = [
        f"<think>\nuse the tool\n</think>\n\n{call}<|im_end|>",
        "<think>\ndone\n</think>\n\n\\boxed{17}<|im_end|>",
    ]
    task = Task("t1", "What is 3 * 4 + 5?", answer=17, metadata={"expression": "3 * 4 + 5"})
    ep, _ = run(tok, replies, env=Calculator, task=task)
    assert ep.num_samples == 1 and ep.num_turns == 2 and ep.reward_components["correct"] == 1.0
    assert ep.metrics["history"]["policy"] == "split"  # the policy applies; the history just never differed


def _split_episode(id_: str, reward: float, group: str = "g") -> Episode:
    ep = Episode(id_, "e", "t", group=group, reward=reward)
    ep.add(Segment("prompt", 0, [1, 2], "ab"))
    ep.add(Segment("policy", 0, [3, 4], "cd", [-0.5, -0.5]))
    ep.messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    return ep


def test_a_split_episode_is_one_group_member_and_every_sample_trains_with_its_advantage():
    split = _split_episode("a", 1.0)
    split.begin_sample(messages=2, reason="history")
    split.add(Segment("prompt", 1, [1, 2, 5], "abe"))
    split.add(Segment("policy", 1, [6], "f", [-0.1]))
    other = _split_episode("b", 0.0)
    batch = build_batch([split, other], torch.zeros(2), [1.0, 1.0], pad_id=0)
    assert batch.size == 3 and [e.id for e in batch.episodes] == ["a", "a", "b"]
    assert batch.ids[1, :4].tolist() == [1, 2, 5, 6] and batch.mask[1, :3].tolist() == [0, 0, 1]
    # GRPO over the two episodes (not three rows): rewards (1, 0), mean 0.5, unbiased std sqrt(0.5):
    # A = +-0.5 / (sqrt(0.5) + 1e-6); over three rows the mean would be 2/3 and the std different
    fake = SimpleNamespace(
        settings=SimpleNamespace(algorithm=SimpleNamespace(advantage="grpo", kl_in="loss"))
    )
    stats = SimpleNamespace(logp=torch.zeros_like(batch.mask))
    adv, _ = Learner.advantages(fake, batch, stats, None)  # type: ignore[arg-type]
    s = 0.5 / (0.5**0.5 + 1e-6)
    assert adv.tolist() == pytest.approx([s, s, -s], abs=1e-7)
    # overlays land on the episode, aligned with all of its tokens
    from agentrl import algorithms as alg
    from agentrl.training.overlays import attach_overlays

    batch.advantages = adv.float()
    zeros = torch.zeros_like(batch.mask)
    tw = alg.TokenWeights(weights=torch.ones_like(batch.mask), mask=batch.mask > 0)
    attach_overlays(batch, zeros, zeros, zeros, tw, zeros)
    assert split.overlays is not None and len(split.overlays["advantage"]) == len(split.token_ids()) == 8
    assert split.overlays["advantage"] == [
        None,
        None,
        pytest.approx(s),
        pytest.approx(s),
        None,
        None,
        None,
        pytest.approx(s),
    ]
