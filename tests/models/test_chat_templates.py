"""Chat-template families (chatml, qwen2_5, llama3, qwen3): exact renders, the history probe, tool-call
formats and parsers, observation deltas, and the family tokenizers.

Every expected render below is written out by hand from the family's documented behaviour (see the
comments in ``agentrl/assets/templates/*.jinja``), not produced by the template under test.
"""

from __future__ import annotations

import copy

import pytest

from agentrl.models.chat import ChatRenderer
from agentrl.models.chat_templates import (
    FAMILIES,
    VOCAB_SIZE,
    family_tokenizer,
    probe_history,
    resolve_history,
    save_family_tokenizer,
    tool_call_format,
)
from agentrl.models.tokenizer import load_tokenizer
from agentrl.rollout.runner import RunnerSettings
from agentrl.tools import ToolCall, parse_tool_calls, strip_tool_calls
from tests.helpers.conversations import ADD, ADD_JSON, PREFIX, RUNS, THINKING, TOOL_CONVERSATION, TOOL_OBS

QWEN_TOOLS_SYSTEM = (
    "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou can call the functions below to help with the "
    "request. Their JSON schemas are inside <tools></tools>:\n<tools>\n" + ADD_JSON + "\n</tools>\n\n"
    "To call a function, write its name and arguments as one JSON object inside <tool_call></tool_call> "
    'tags:\n<tool_call>\n{"name": <function name>, "arguments": <arguments as a JSON object>}\n'
    "</tool_call><|im_end|>\n"
)


def render(
    family: str, messages: list[dict], tools: list[dict] | None = None, gen: bool = False, **kw
) -> str:
    tok = family_tokenizer(family)
    return tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=gen, **kw)


# -- exact renders ----------------------------------------------------------------------------------
def test_qwen2_5_renders_a_tool_conversation():
    want = (
        QWEN_TOOLS_SYSTEM + "<|im_start|>user\n2+3?<|im_end|>\n"
        # calls after the content, one per line, each JSON between newlines inside the tags
        '<|im_start|>assistant\nI add.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n'
        '</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 1}}\n</tool_call><|im_end|>\n'
        # the two tool messages are ONE user turn
        "<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\n2\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n5 and 2.<|im_end|>\n"
    )
    assert render("qwen2_5", TOOL_CONVERSATION, [ADD]) == want
    # No default system prompt; the generation prompt opens an assistant turn.
    assert render("qwen2_5", [{"role": "user", "content": "hi"}], gen=True) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_llama3_renders_a_tool_conversation():
    want = (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        # the tools are described in the first user message, before its text
        "<|start_header_id|>user<|end_header_id|>\n\nYou can call these functions, described by their "
        "JSON schemas:\n" + ADD_JSON + "\n\nTo call a function, answer with only a JSON object of the form "
        '{"name": function name, "parameters": dictionary of argument name and its value}. Otherwise '
        "answer in plain text.\n\n2+3?<|eot_id|>"
        # the calls replace the content ("I add." is not rendered), joined by "; "
        '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "add", "parameters": {"a": 2, "b": 3}}; '
        '{"name": "add", "parameters": {"a": 1, "b": 1}}<|eot_id|>'
        "<|start_header_id|>ipython<|end_header_id|>\n\n5<|eot_id|>"
        "<|start_header_id|>ipython<|end_header_id|>\n\n2<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n5 and 2.<|eot_id|>"
    )
    assert render("llama3", TOOL_CONVERSATION, [ADD]) == want
    assert render("llama3", [{"role": "user", "content": "hi"}], gen=True) == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_qwen3_keeps_reasoning_only_after_the_last_user_query():
    a2 = '<|im_start|>assistant\n{think}a2\n<tool_call>\n{{"name": "add", "arguments": {{"a": 2, "b": 3}}}}\n</tool_call><|im_end|>\n'  # fmt: skip
    head = "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\na1<|im_end|>\n<|im_start|>user\nq2<|im_end|>\n"
    tool = "<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n"
    # q2 is the last query: a1 (before it) loses r1; a2 (reasoning_content) and a3 (<think> in content)
    # come after it and keep theirs. The tool turn is not a query.
    assert render("qwen3", THINKING) == (
        head + a2.format(think="<think>\nr2\n</think>\n\n") + tool
        + "<|im_start|>assistant\n<think>\nr3\n</think>\n\na3<|im_end|>\n"
    )  # fmt: skip
    # One more user query: every earlier turn is stripped.
    assert render("qwen3", [*THINKING, {"role": "user", "content": "q3"}], gen=True) == (
        head + a2.format(think="") + tool + "<|im_start|>assistant\na3<|im_end|>\n"
        "<|im_start|>user\nq3<|im_end|>\n<|im_start|>assistant\n"
    )


def test_qwen3_details():
    # No reasoning after the last query: an empty think block.
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert render("qwen3", msgs).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\na<|im_end|>\n")
    # A user message that is a wrapped tool response is not a query: r1 survives it.
    wrapped = {"role": "user", "content": "<tool_response>\n5\n</tool_response>"}
    msgs = [THINKING[0], THINKING[1], wrapped, {"role": "assistant", "content": "done"}]
    assert "<think>\nr1\n</think>\n\na1" in render("qwen3", msgs)
    # enable_thinking=false appends an empty think block to the generation prompt.
    q = [{"role": "user", "content": "q"}]
    assert render("qwen3", q, gen=True).endswith("<|im_start|>assistant\n")
    assert render("qwen3", q, gen=True, enable_thinking=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


# -- probes -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("family", "policy", "fmt"),
    [("chatml", "merge", "json"), ("qwen2_5", "merge", "json"), ("llama3", "merge", "llama3"),
     ("qwen3", "split", "json")],
)  # fmt: skip
def test_probes(family, policy, fmt):
    tok = family_tokenizer(family)
    probe = probe_history(tok)
    assert probe.policy == policy and probe.strips_thinking == (policy == "split")
    assert ("strips the reasoning" if policy == "split" else "keeps the reasoning") in probe.reason
    assert "<think> block" in probe.reason  # names what was probed
    assert probe_history(tok) is probe  # probed once per template
    assert tool_call_format(tok) == fmt


def test_resolve_history_explains_the_setting():
    qwen3, qwen2_5 = family_tokenizer("qwen3"), family_tokenizer("qwen2_5")
    assert resolve_history("auto", qwen3) == probe_history(qwen3)
    merged = resolve_history("merge", qwen3)
    assert merged.policy == "merge" and merged.strips_thinking
    assert "set in the config" in merged.reason and "differs from the history a server" in merged.reason
    split = resolve_history("split", qwen2_5)
    assert split.policy == "split" and not split.strips_thinking and "set in the config" in split.reason
    assert resolve_history("merge", qwen2_5).reason == "rollout.history: merge was set in the config"
    with pytest.raises(ValueError, match="auto"):
        resolve_history("sometimes", qwen3)  # type: ignore[arg-type]


def test_tool_call_format_rejects_an_unknown_template():
    tok = copy.deepcopy(family_tokenizer("chatml"))
    tok.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    with pytest.raises(ValueError, match="neither known format"):
        tool_call_format(tok)


# -- parsers ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "want"),
    [
        ('{"name": "add", "parameters": {"a": 1, "b": 2}}', [("add", {"a": 1, "b": 2})]),
        (' {"name": "add", "parameters": {"a": 1}}; {"name": "mul", "arguments": {"b": 2}} ',
         [("add", {"a": 1}), ("mul", {"b": 2})]),
        ('<|python_tag|>{"name": "add", "parameters": {}}<|eom_id|>', [("add", {})]),
        ('{"name": "add", "parameters": "{\\"a\\": 1}"}', [("add", {"a": 1})]),  # a JSON string
        ("The answer is 3.", []),
        ('{"answer": 3}', []),  # JSON, but not a call
        ("{ not json and no name", []),
    ],
)  # fmt: skip
def test_llama3_calls(text, want):
    calls = parse_tool_calls(text, "llama3")
    assert [(c.name, c.arguments) for c in calls] == want
    assert all(c.error is None for c in calls)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('{"name": "add", "parameters": {"a": 1}', "not valid JSON"),
        ('{"name": "add", "parameters": {}} and more', "whole turn"),
        ('{"name": "add", "parameters": {}}; {"x": 1}', "must be an object"),
        ('{"name": 3, "parameters": {}}', "`name` must be a string"),
        ('{"name": "add", "parameters": [1]}', "must be a JSON object"),
    ],
)
def test_llama3_bad_calls_are_feedback(text, error):
    (call,) = parse_tool_calls(text, "llama3")
    assert call.error is not None and error in call.error


def test_strip_tool_calls():
    text = 'I add.\n<tool_call>\n{"name": "add", "arguments": {}}\n</tool_call>\n'
    assert strip_tool_calls(text, "json") == "I add."
    assert strip_tool_calls("A <tool_call>x</tool_call> B <tool_call>y", "json") == "A  B"
    assert strip_tool_calls('{"name": "add", "parameters": {}}', "llama3") == ""
    assert strip_tool_calls('{"name": "add", "parameters": {', "llama3") == ""  # a (broken) call
    assert strip_tool_calls(" The answer is 3. ", "llama3") == "The answer is 3."
    assert strip_tool_calls("x\n```python\nprint(1)\n```", "python") == "x"
    with pytest.raises(ValueError, match="llama3"):
        strip_tool_calls("x", "xml")


def test_parsers_never_raise():
    deep = '{"name": "f", "parameters": ' + '{"a": ' * 100_000  # deeper than json's recursion limit
    odd = ["", "{", "}", ";", "{};{}", '{"name"', "[1, 2]", "<|python_tag|>", "{" * 50, '{"name": null}', deep,
           f"<tool_call>{deep}</tool_call>"]  # fmt: skip
    for fmt in ("json", "python", "llama3"):
        for text in odd:
            assert all(isinstance(c, ToolCall) for c in parse_tool_calls(text, fmt))


# -- ChatRenderer -----------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_observation_delta_is_the_full_render_after_the_prefix(family):
    tok = family_tokenizer(family)
    r = ChatRenderer(tok, [ADD])
    prefix = tok.apply_chat_template(PREFIX, tools=[ADD], tokenize=False)
    full = tok.apply_chat_template(PREFIX + TOOL_OBS, tools=[ADD], tokenize=False, add_generation_prompt=True)
    if family == "qwen3":  # as Qwen3's own template: only the last message gets an empty think block
        prefix = prefix.replace("<think>\n\n</think>\n\nAdding.", "Adding.")
    assert full.startswith(prefix)  # otherwise tool observations never change earlier text
    pieces = r.render_observation(TOOL_OBS)
    assert "".join(p.text for p in pieces) == full[len(prefix) :]
    tagged = [(p.role, p.text, p.message_index) for p in pieces if p.role != "scaffold"]
    assert tagged == [("tool", "user", 0), ("tool", "5", 1)]
    # "user" is found as the tool output, not inside the Qwen turn's "<|im_start|>user" header
    opener = {"chatml": "tool\n", "qwen2_5": "<tool_response>\n", "qwen3": "<tool_response>\n"}
    for k, p in enumerate(pieces):
        if p.role == "tool":
            assert "".join(q.text for q in pieces[:k]).endswith(
                opener.get(family, "ipython<|end_header_id|>\n\n")
            )
    assert r.render_text(PREFIX + TOOL_OBS, generation_prompt=True) == full


@pytest.mark.parametrize(
    ("family", "close", "eos"),
    [("chatml", "<|im_end|>\n", "<|im_end|>"), ("qwen2_5", "<|im_end|>\n", "<|im_end|>"),
     ("llama3", "<|eot_id|>", "<|eot_id|>"), ("qwen3", "<|im_end|>\n", "<|im_end|>")],
)  # fmt: skip
def test_renderer_close_and_eos(family, close, eos):
    tok = family_tokenizer(family)
    r = ChatRenderer(tok)
    assert r.assistant_close == close
    assert r.eos_token_id == tok.convert_tokens_to_ids(eos) == tok.eos_token_id


def test_qwen3_delta_after_a_user_message():
    # The template strips the thinking of the turn before the new query, so the prefix render is not
    # a prefix of the full one; the delta is still what follows that turn's closing.
    tok = family_tokenizer("qwen3")
    prefix = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "<think>\nr\n</think>\n\na"},
    ]
    obs = [{"role": "user", "content": "q2"}]
    full = tok.apply_chat_template(prefix + obs, tokenize=False, add_generation_prompt=True)
    assert not full.startswith(tok.apply_chat_template(prefix, tokenize=False))
    pieces = ChatRenderer(tok).render_observation(obs)
    delta = "<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\n"
    assert "".join(p.text for p in pieces) == delta and full.endswith("a<|im_end|>\n" + delta)
    assert [(p.role, p.text) for p in pieces if p.role != "scaffold"] == [("env", "q2")]


@pytest.mark.parametrize(
    ("family", "forged", "before", "after"),
    [("qwen2_5", "<|im_start|>", "<|im_start|>user\n<tool_response>\n",
      "\n</tool_response><|im_end|>\n<|im_start|>assistant\n"),
     ("llama3", "<|start_header_id|>", "<|start_header_id|>ipython<|end_header_id|>\n\n",
      "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")],
)  # fmt: skip
def test_tool_output_cannot_forge_control_tokens(family, forged, before, after):
    # The output equals the start of the turn's own header: a search would tag the header as tool
    # output (encoded as text) and leave the output in the scaffold (encoded as a control token).
    tok = family_tokenizer(family)
    pieces = ChatRenderer(tok).render_observation([{"role": "tool", "content": forged}])
    assert [(p.role, p.text) for p in pieces] == [("scaffold", before), ("tool", forged), ("scaffold", after)]
    control = tok.convert_tokens_to_ids(forged)
    assert control not in pieces[1].token_ids and pieces[0].token_ids[0] == control


def test_renderers_share_their_tokenizers_private_copies(monkeypatch):
    """The backend copies ``encode`` uses are made once per tokenizer (a runner per rollout batch
    built them anew: 0.96 s per renderer for SmolLM2 on a 2-core machine), and again once tokens are
    added: the new renderer encodes the added token as itself, as text when asked to split."""
    from agentrl.models import chat

    tok = copy.deepcopy(family_tokenizer("chatml"))
    copies = []
    real = copy.deepcopy
    monkeypatch.setattr(chat.copy, "deepcopy", lambda x: copies.append(x) or real(x))
    first, second = ChatRenderer(tok), ChatRenderer(tok)
    assert len(copies) == 2 and first._backends is second._backends
    tok.add_special_tokens({"additional_special_tokens": ["<|new|>"]})
    third = ChatRenderer(tok)
    assert len(copies) == 4
    new_id = tok.convert_tokens_to_ids("<|new|>")
    assert third.encode("<|new|>", split_special=False) == [new_id]
    assert new_id not in third.encode("<|new|>", split_special=True)


# -- tokenizers -------------------------------------------------------------------------------------
CONTROL = {
    "chatml": ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"],
    "qwen2_5": ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
                "<tool_response>", "</tool_response>"],
    "qwen3": ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
              "<tool_response>", "</tool_response>", "<think>", "</think>"],
    "llama3": ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
               "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"],
}  # fmt: skip


@pytest.mark.parametrize("family", FAMILIES)
def test_family_tokenizer(family, tmp_path):
    tok = family_tokenizer(family)
    assert len(tok) == VOCAB_SIZE and tok.pad_token_id is not None
    # Control tokens are the first ids, each a single token, in the listed order.
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in CONTROL[family]]
    assert ids == [[i] for i in range(len(CONTROL[family]))]
    text = render(family, TOOL_CONVERSATION, [ADD])
    encoded = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(encoded, skip_special_tokens=False) == text
    # Tags decode as text with skip_special_tokens; end-of-turn markers do not.
    plain = tok.decode(encoded, skip_special_tokens=True)
    assert tok.eos_token not in plain and ("<tool_call>" in plain) == (family != "llama3")
    # save_pretrained + load_tokenizer gives the same tokenizer back.
    loaded = load_tokenizer(save_family_tokenizer(family, tmp_path / family))
    assert type(loaded) is type(tok) and loaded.chat_template == tok.chat_template
    assert loaded(text, add_special_tokens=False)["input_ids"] == encoded
    assert (loaded.eos_token_id, loaded.pad_token_id, len(loaded)) == (
        tok.eos_token_id,
        tok.pad_token_id,
        1024,
    )


def test_family_tokenizers_are_deterministic_and_cached():
    from agentrl.models.chat_templates import family_tokenizer as cached

    first = cached("qwen3")
    assert cached("qwen3") is first
    cached.cache_clear()
    again = cached("qwen3")
    assert again is not first and again.get_vocab() == first.get_vocab()
    with pytest.raises(ValueError, match="unknown chat-template family"):
        cached("mistral")


@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_model_generates_with_a_family_tokenizer(family, tiny_model_dir):
    """The tiny model (vocab 1024) runs on any family's ids; stop on the family's end of turn."""
    from agentrl.engines.base import SamplingParams
    from agentrl.engines.hf import HFEngine
    from agentrl.models import load_policy

    model, _ = load_policy(tiny_model_dir)
    tok = family_tokenizer(family)
    r = ChatRenderer(tok, [ADD])
    prompt = r.render_prompt([{"role": "user", "content": "What is 2+3?"}])
    stop = (r.eos_token_id,)
    (out,) = HFEngine(model).generate([prompt.token_ids], SamplingParams(8, 1.0, seed=0, stop_token_ids=stop))
    assert 1 <= len(out.token_ids) <= 8 and all(0 <= t < VOCAB_SIZE for t in out.token_ids)
    assert isinstance(tok.decode(out.token_ids), str)


def test_build_tiny_model_with_a_qwen3_tokenizer(tmp_path):
    from agentrl.models import build_tiny_model, load_policy

    tok = family_tokenizer("qwen3")
    path = build_tiny_model(tmp_path / "m", "h128-L8", num_layers=1, tokenizer=tok, seed=0)
    model, loaded = load_policy(path)
    assert model.config.vocab_size == 1024 and model.config.eos_token_id == tok.eos_token_id
    assert loaded.chat_template == tok.chat_template


# -- end to end -------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", sorted(RUNS))
def test_runner_episode_equals_a_full_render(family):
    """A scripted two-turn tool episode through the EpisodeRunner: the call parses in the family's
    format, the tool output is tagged, and the doctor finds the ids identical to a full re-render."""
    from agentrl.engines.scripted import ScriptedEngine
    from agentrl.env import Task
    from agentrl.rollout.drift import diagnose
    from agentrl.rollout.runner import EpisodeRequest, EpisodeRunner
    from environments.calculator import Calculator

    tok = family_tokenizer(family)
    env_cls = type("FamilyCalculator", (Calculator,), {"tool_format": tool_call_format(tok)})
    engine = ScriptedEngine([reply + tok.eos_token for reply in RUNS[family]], tokenizer=tok)
    runner = EpisodeRunner(engine, tok, env_cls)
    task = Task(id="t", prompt="What is 3 * 4 + 5?", answer=17, metadata={"expression": "3 * 4 + 5"})
    try:
        (ep,) = runner.run([EpisodeRequest(task, seed=0)])
    finally:
        runner.close()
    assert (ep.stop_reason, ep.failure, ep.reward_components) == (
        "answered",
        None,
        {"correct": 1.0, "used_tool": 1.0},
    )
    assert [s.text for s in ep.segments if s.role == "tool"] == ["17"]
    d = diagnose(ep, tok)
    assert (d.error, d.drifts) == (None, [])


CHATML_NO_TOOLS = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)  # SmolLM2-135M-Instruct's template does the same: no tools section


def test_a_template_without_a_tools_section_gets_them_in_the_system_message(tiny_tokenizer):
    """Before: the calculator's schemas went to a template that ignores them, and the model was told
    to use a tool it was never shown. Now: auto puts them in the system message, the episode records
    it, the doctor finds no drift, and SFT demonstrations see the same prompt."""
    from agentrl.engines.scripted import ScriptedEngine
    from agentrl.env import Task
    from agentrl.models.chat import renders_tools
    from agentrl.rollout.drift import diagnose
    from agentrl.rollout.runner import EpisodeRequest, EpisodeRunner
    from agentrl.training.sft import tokenize_conversation
    from environments.calculator import Calculator

    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = CHATML_NO_TOOLS
    schemas = Calculator().tool_schemas()
    assert not renders_tools(tok, schemas) and renders_tools(tiny_tokenizer, schemas)
    call = '<tool_call>{"name": "calculate", "arguments": {"expression": "3 * 4 + 5"}}</tool_call>'
    script = [call + "<|im_end|>", "\\boxed{17}<|im_end|>"]
    task = Task(id="t", prompt="What is 3 * 4 + 5?", answer=17, metadata={"expression": "3 * 4 + 5"})
    for placement, shown in (("auto", "system"), ("system", "system")):
        runner = EpisodeRunner(
            ScriptedEngine(list(script), tokenizer=tok),
            tok,
            Calculator,
            RunnerSettings(tools_prompt=placement),
        )
        try:
            (ep,) = runner.run([EpisodeRequest(task, seed=0)])
        finally:
            runner.close()
        assert (
            ep.metrics["tools_prompt"] == shown
            and ep.failure is None
            and ep.reward_components["correct"] == 1.0
        )
        system = ep.messages[0]
        assert system["role"] == "system" and '"name": "calculate"' in system["content"]
        assert system["content"].startswith(Calculator.system_prompt) and "<tool_call>" in system["content"]
        assert diagnose(ep, tok).drifts == []
        renderer = runner._renderer(schemas, "json")
        demo = Calculator.demonstrations([task])[0]
        ids, _ = tokenize_conversation(renderer, demo)
        assert ids[: len(ep.segments[0].token_ids)] == ep.segments[0].token_ids  # SFT's prompt is RL's
    # a template with a tools section keeps it under auto, and system overrides it
    runner = EpisodeRunner(ScriptedEngine(list(script), tokenizer=tiny_tokenizer), tiny_tokenizer, Calculator, RunnerSettings(tools_prompt="auto"))  # fmt: skip
    try:
        (ep,) = runner.run([EpisodeRequest(task, seed=0)])
    finally:
        runner.close()
    assert ep.metrics["tools_prompt"] == "template" and "<tools>" not in ep.messages[0]["content"]
