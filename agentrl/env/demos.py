"""Demonstration files for the SFT warm start (``sft.demos``): the format, and a reader whose errors
name the line, what was found there and what was expected. Checked when the config loads, before
any work."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.env.data.rows import read_utf8

Message = dict[str, Any]
ROLES = ("system", "user", "assistant", "tool")


DEMO_FORMAT = (
    'one conversation per line: a JSON list of chat messages ({"role": "user" | "assistant" | "tool" | '
    '"system", "content": "..."}), or an object {"messages": [...]}, starting with what the '
    "environment's reset returns and with at least one assistant message"
)


def load_demonstrations(path: str | Path) -> list[list[Message]]:
    """A JSONL file of demonstrations (``DEMO_FORMAT``). A line in another format is an error that
    names the line, what was found there and what was expected."""
    demos = []
    # the text is read as UTF-8 first: a byte that is not names the file and the line
    for n, line in enumerate(read_utf8(Path(path)).splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}, line {n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not JSON ({e.msg}); expected {DEMO_FORMAT}") from None
        if isinstance(obj, dict):
            if "messages" not in obj:
                raise ValueError(
                    f"{where}: an object with keys {sorted(obj)[:8]} but no 'messages'; expected {DEMO_FORMAT}"
                )
            obj = obj["messages"]
        if not isinstance(obj, list) or not obj:
            raise ValueError(f"{where}: found {type(obj).__name__} {str(obj)[:80]!r}; expected {DEMO_FORMAT}")
        for i, m in enumerate(obj):
            if not (
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            ):
                raise ValueError(
                    f"{where}: message {i} is {str(m)[:80]!r}, not a {{'role': str, 'content': str}} dict; "
                    f"expected {DEMO_FORMAT}"
                )
            if m["role"] not in ROLES:
                raise ValueError(f"{where}: message {i} has role {m['role']!r}; valid: {', '.join(ROLES)}")
        roles = [m["role"] for m in obj]
        if "assistant" not in roles:
            raise ValueError(f"{where}: no assistant message, so nothing to learn; expected {DEMO_FORMAT}")
        if roles[0] == "assistant":
            raise ValueError(
                f"{where}: starts with an assistant message; a demonstration starts with what the "
                "environment's reset returns (a system and/or user message)"
            )
        demos.append(obj)
    if not demos:
        raise ValueError(f"{path} holds no demonstration; expected {DEMO_FORMAT}")
    return demos


def with_summaries(
    demo: list[Message], summary: Callable[[list[Message]], str | None], request: str
) -> list[list[Message]]:
    """A demonstration and the compaction samples a run with ``rollout.context.policy: compact``
    would train on around it: after every observation, the chat so far, the summary ``request`` and the solver's summary of what came before
    (``summary(messages)``; None = no summary there), and the continuation: the task's messages,
    that summary as the model's turn, the observation and the next reply."""
    first = next((i for i, m in enumerate(demo) if m.get("role") == "assistant"), len(demo))
    out = [demo]
    replies = [i for i, m in enumerate(demo) if m.get("role") == "assistant"]
    for k, reply in enumerate(replies[1:], start=1):
        start = replies[k - 1] + 1  # the observation that answered the previous reply
        so_far = demo[:reply]
        text = summary(so_far)
        if text is None:
            continue
        out.append([*so_far, {"role": "user", "content": request}, {"role": "assistant", "content": text}])
        out.append([*demo[:first], {"role": "assistant", "content": text}, *demo[start : reply + 1]])
    return out
