"""The compaction samples a warm start adds around a demonstration (``with_summaries``), with an
environment that says what a summary keeps: each one the exact shape a compacting run trains on."""

from __future__ import annotations

from agentrl.config import load_config
from agentrl.env.demos import with_summaries
from environments.recall import QUESTION, Recall


def test_each_observation_gives_a_summary_and_its_continuation():
    (task,) = Recall.load_tasks("train", n=1, fillers=2, filler_words=3)
    (demo,) = Recall.demonstrations([task])
    assert demo[-1]["content"] == f"\\boxed{{{task.answer}}}" and demo[-2]["content"] == QUESTION
    out = with_summaries(demo, lambda m: Recall.summary_demonstration(task, m), "Summarise.")
    replies = sum(m["role"] == "assistant" for m in demo)
    assert out[0] == demo and len(out) == 1 + 2 * (replies - 1)
    for asked, resumed in zip(out[1::2], out[2::2]):
        assert asked[-2] == {"role": "user", "content": "Summarise."} and asked[-1]["role"] == "assistant"
        assert asked[:-2] == demo[: len(asked) - 2]  # the chat so far, up to an observation
        # the continuation: the task, the summary as the model's turn, that observation, the reply
        assert resumed[:2] == demo[:2] and resumed[2] == asked[-1]
        assert resumed[3] == asked[-3] and resumed[4] == demo[len(asked) - 2]
    # the first observation tells the code, so every summary keeps it; before it there is none
    assert all(a[-1]["content"] == f"The code is {task.answer}." for a in out[1::2])
    assert Recall.summary_demonstration(task, demo[:2]) == "No code yet."


def test_the_warm_start_adds_them_only_when_the_run_compacts(tiny_tokenizer):
    from agentrl.assembly.sft import build_examples

    base = ["env.name=recall", "sft.enabled=true", "sft.num_demos=2", "rollout.max_episode_tokens=4000"]
    plain = build_examples(load_config(None, base), tiny_tokenizer, log=lambda _: None)
    compact = build_examples(
        load_config(None, [*base, "rollout.context.policy=compact", "rollout.context.max_tokens=2000"]),
        tiny_tokenizer,
        log=lambda _: None,
    )
    assert len(plain) == 2 and len(compact) == 2 * (1 + 2 * 6)  # 7 replies with the default 4 fillers
