"""A chat template that shows tools the way training did, for a model exported after training with
its tools in the system message (``rollout.tools_prompt: system``, or ``auto`` on a template with no
tools section, such as SmolLM2's ChatML).

Training writes the tools section (``chat.tools_section``) into the conversation's system message
and parses calls from the model's text; plain transformers, given ``tools=``, would render nothing
for such a template, and the exported model would answer without calling a tool. ``with_tools``
wraps the model's own template: when ``tools`` are given it writes the same tools section into the
system message (appended to the first one, or as a new first message), writes each assistant
message's ``tool_calls`` as the ``<tool_call>`` text the model produced, and renders the rest with
the original template, tools withheld. Without ``tools`` it renders exactly as the original.
"""

from __future__ import annotations

from typing import Any

from agentrl.models.chat import tools_section

_MARK = "{#- agentrl: tools in the system message, as in training #}"

# Jinja, rendered by transformers' chat-template environment (its ``tojson`` is json.dumps with
# ensure_ascii=False, as ``tools_section`` writes the listing). HEAD and HOW are filled in by
# ``with_tools`` from ``tools_section``'s own text, so the two cannot drift apart.
_PREAMBLE = """{#- agentrl: tools in the system message, as in training #}
{%- if tools %}
{%- set ns = namespace(listing=[], out=[], text="") %}
{%- for t in tools %}{%- set ns.listing = ns.listing + [t | tojson] %}{%- endfor %}
{%- set tools_text = HEAD + (ns.listing | join("\\n")) + HOW %}
{%- for m in messages %}
{%- if m.role == "assistant" and m.tool_calls %}
{%- set ns.text = m.content or "" %}
{%- for c in m.tool_calls %}
{%- set f = c.function if c.function is defined else c %}
{%- set args = f.arguments if f.arguments is string else (f.arguments | tojson) %}
{%- set ns.text = ns.text + OPEN + (f.name | tojson) + ARGKEY + args + CLOSE %}
{%- endfor %}
{%- set ns.out = ns.out + [{"role": "assistant", "content": ns.text}] %}
{%- else %}
{%- set ns.out = ns.out + [m] %}
{%- endif %}
{%- endfor %}
{%- if ns.out and ns.out[0].role == "system" %}
{%- set first = ns.out[0].content or "" %}
{%- set messages = [{"role": "system", "content": (first + "\\n\\n" + tools_text) if first else tools_text}] + ns.out[1:] %}
{%- else %}
{%- set messages = [{"role": "system", "content": tools_text}] + ns.out %}
{%- endif %}
{%- set tools = none %}
{%- endif %}
"""


CALL_TEXT = {
    "json": ('<tool_call>{"name": ', ', "arguments": ', "}</tool_call>"),
    "llama3": ('{"name": ', ', "parameters": ', "}"),
}
"""How an assistant's tool call reads as the text the model wrote, per ``tool_format``
(``agentrl.tools``): the text before the name, between the name and the arguments, after them."""


def with_tools(template: str, tool_format: str = "json") -> str:
    """``template`` wrapped so that ``apply_chat_template(messages, tools=...)`` renders what training
    rendered with the tools in the system message (module docstring). Idempotent."""
    if _MARK in template:
        return template
    probe = tools_section([{"PROBE": 1}], tool_format)
    head, how = probe.split('{"PROBE": 1}')
    opening, key, closing = CALL_TEXT[tool_format]
    preamble = _PREAMBLE.replace("HEAD", _jinja_string(head)).replace("HOW", _jinja_string(how))
    for name, text in (("OPEN", opening), ("ARGKEY", key), ("CLOSE", closing)):
        preamble = preamble.replace(name, _jinja_string(text))
    return preamble + template


def _jinja_string(text: str) -> str:
    """``text`` as a Jinja string literal."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def wants_wrapper(tokenizer: Any, tools_prompt: str, tools: list[dict[str, Any]], tool_format: str) -> bool:
    """Whether training put the tools in the system message for this tokenizer (``ChatRenderer``'s
    rule): ``system``, or ``auto`` on a template that renders no tools; never for ``python`` calls."""
    from agentrl.models.chat import renders_tools

    if tool_format == "python" or tools_prompt == "template" or not tools:
        return False
    return tools_prompt == "system" or not renders_tools(tokenizer, tools)
