"""The chat template an export carries when training wrote the tools into the system message
(``models/tool_template.py``): plain transformers then renders what the policy was trained on."""

from __future__ import annotations

import copy

import pytest

from agentrl.assembly.export import training_chat_template
from agentrl.config import config_to_yaml, load_config
from agentrl.models.chat import ChatRenderer
from agentrl.models.tool_template import with_tools
from agentrl.rollout.agent_ledger import as_shown
from tests.helpers.real_models import smollm2  # at import: the cache `agentrl models install` filled

# SmolLM2's kind of template: ChatML with no tools section (it drops `tools` without a word)
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            },
        },
    }
]
CALL = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}


def chatml(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = CHATML
    return tok


@pytest.mark.parametrize("system", [None, "Answer in one word."])
def test_the_wrapped_template_renders_the_training_prompt(tiny_tokenizer, system):
    """A multi-turn conversation with a tool call and its result, with and without a system message:
    ``apply_chat_template(messages, tools=...)`` on the wrapped template equals training's render
    (``ChatRenderer`` with the tools placed in the system message, calls written as the model's text)."""
    tok = chatml(tiny_tokenizer)
    messages = [
        *([{"role": "system", "content": system}] if system else []),
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "Let me add.", "tool_calls": [CALL]},
        {"role": "tool", "content": "5"},
    ]
    training = ChatRenderer(tok, TOOLS, "auto", "json")
    assert training.tools_text is not None  # the template has no tools section: training placed them
    want = training.render_text(training.prompt_messages(as_shown(messages, None)), True)
    plain = tok.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert "add" not in plain.split("What is")[0]  # the plain template drops the tools
    tok.chat_template = with_tools(CHATML)
    got = tok.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert got == want
    assert '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>' in got
    # without tools it is the model's own template, unchanged
    no_tools = [m for m in messages if m["role"] in ("system", "user")]
    assert tok.apply_chat_template(no_tools, tokenize=False) == chatml(tiny_tokenizer).apply_chat_template(
        no_tools, tokenize=False
    )
    assert with_tools(tok.chat_template) == tok.chat_template  # wrapping twice changes nothing


@pytest.mark.parametrize(
    "tools_prompt, template, wrapped",
    [("auto", "chatml", True), ("system", "chatml", True), ("auto", "own", False), ("system", "own", True)],
)
def test_the_export_takes_the_runs_tools_prompt(
    tmp_path, tiny_model_dir, tiny_tokenizer, tools_prompt, template, wrapped
):
    """The run's config.yaml decides, as training did: ``system`` always wraps the template; ``auto``
    wraps a template without a tools section (ChatML) and keeps one that shows tools (the tiny
    model's own, Qwen2.5's kind)."""
    run = tmp_path / "run"
    ckpt = run / "checkpoints" / "step_1"
    ckpt.mkdir(parents=True)
    overrides = [f"model.path={tiny_model_dir}", f"rollout.tools_prompt={tools_prompt}"]
    (run / "config.yaml").write_text(config_to_yaml(load_config("configs/quickstart.yaml", overrides)))
    tok = chatml(tiny_tokenizer) if template == "chatml" else copy.deepcopy(tiny_tokenizer)
    before, lines = tok.chat_template, []
    training_chat_template(ckpt, tok, lines.append)
    assert (tok.chat_template != before) == wrapped, lines
    assert any("as in training" in line for line in lines) == wrapped
    missing = chatml(tiny_tokenizer)
    training_chat_template(tmp_path / "elsewhere" / "checkpoints" / "step_1", missing, lines.append)
    assert missing.chat_template == CHATML and "no config.yaml" in lines[-1]


def test_smollm2s_export_template_renders_the_calculator_prompt_it_was_trained_on():
    """The reported case: SmolLM2 trained with the calculator's tools; plain transformers on the
    export, given the same tools, renders the training prompt (before: no tools at all)."""
    from agentrl.env import make_env
    from agentrl.models.tokenizer import load_tokenizer

    tok = load_tokenizer(str(smollm2()))
    tools = make_env("calculator").tool_schemas()
    messages = [{"role": "user", "content": "What is 12 * 7?"}]
    training = ChatRenderer(tok, tools, "auto", "json")
    want = training.render_text(training.prompt_messages(messages), True)
    before = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    assert "calculate" not in before and "calculate" in want
    tok.chat_template = with_tools(tok.chat_template)
    assert tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True) == want
