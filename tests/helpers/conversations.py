"""Conversations the chat-template tests render (written out by hand)."""

from __future__ import annotations

ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}


ADD_JSON = '{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}'


CALLS = [
    {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}},
    {"type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 1}'}},  # a JSON string
]


TOOL_CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "2+3?"},
    {"role": "assistant", "content": "I add.", "tool_calls": CALLS},
    {"role": "tool", "content": "5"},
    {"role": "tool", "content": "2"},
    {"role": "assistant", "content": "5 and 2."},
]


THINKING = [
    {"role": "user", "content": "q1"},
    {"role": "assistant", "content": "<think>\nr1\n</think>\n\na1"},
    {"role": "user", "content": "q2"},
    {"role": "assistant", "content": "a2", "reasoning_content": "r2", "tool_calls": CALLS[:1]},
    {"role": "tool", "content": "5"},
    {"role": "assistant", "content": "<think>\nr3\n</think>\n\na3"},
]


PREFIX = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "2+3?"},
    {"role": "assistant", "content": "Adding."},
]


TOOL_OBS = [{"role": "tool", "content": "user"}, {"role": "tool", "content": "5"}]


RUNS = {
    "qwen2_5": ['<tool_call>\n{"name": "calculate", "arguments": {"expression": "3 * 4 + 5"}}\n</tool_call>',
                "The answer is \\boxed{17}."],
    "qwen3": ['<think>\nUse the tool.\n</think>\n\n<tool_call>\n{"name": "calculate", "arguments": '
              '{"expression": "3 * 4 + 5"}}\n</tool_call>', "<think>\nIt said 17.\n</think>\n\n\\boxed{17}"],
    "llama3": ['{"name": "calculate", "parameters": {"expression": "3 * 4 + 5"}}', "\\boxed{17}"],
}  # fmt: skip
