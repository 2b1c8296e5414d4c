"""The records an environment exchanges with the runner: the task, a step's result (checked against
its contract), the reward functions and the episode state they score."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from agentrl.errors import EnvError

Message = dict[str, Any]
"""A chat message: ``{"role": "system"|"user"|"assistant"|"tool", "content": str, ...}``."""


@dataclass(frozen=True)
class Task:
    """A plain, frozen task record produced by a dataset adapter or a generator."""

    id: str
    prompt: str
    """The user message (plain text); environments add their own system prompt and tool schemas."""
    answer: Any = None
    """The reference answer, whatever form the environment's reward functions expect."""
    metadata: Mapping[str, Any] = field(default_factory=dict)


class StepResult(NamedTuple):
    """What ``Environment.step`` returns (unpacks like Gymnasium's 5-tuple)."""

    observation: list[Message]
    """Messages to append after the policy's turn (role ``tool`` for tool output, ``user`` for the
    environment's own feedback). Empty when the episode ends."""
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]


STEP_CONTRACT = (
    "StepResult(observation: list of {'role': ..., 'content': str} messages, reward: float, "
    "terminated: bool, truncated: bool, info: dict)"
)


def checked_messages(value: Any, what: str) -> list[Message]:
    """``value`` if it is a list of chat messages (dicts with a string ``role`` and ``content``); else
    ``EnvError`` saying what came back and what was expected."""
    if not isinstance(value, (list, tuple)):
        raise EnvError(
            f"{what} returned {_shown(value)}; expected a list of chat messages ({{'role', 'content'}} dicts)"
        )
    for i, m in enumerate(value):
        if not (
            isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        ):
            raise EnvError(
                f"{what} returned a list whose item {i} is {_shown(m)}; expected a chat message, a dict "
                "with a string 'role' and a string 'content'"
            )
    return list(value)


def checked_step(value: Any) -> StepResult:
    """``Environment.step``'s result as a ``StepResult`` (a 5-tuple in that order is accepted); anything
    else is an ``EnvError`` naming what came back and what was expected."""
    if not isinstance(value, tuple) or len(value) != 5:
        raise EnvError(f"Environment.step returned {_shown(value)}; expected {STEP_CONTRACT}")
    obs, reward, terminated, truncated, info = value
    checked_messages(obs, "Environment.step (observation)")
    problems = [
        f"reward is {_shown(reward)}, not a number" if not _is_number(reward) else "",
        f"terminated is {_shown(terminated)}, not a bool" if not isinstance(terminated, bool) else "",
        f"truncated is {_shown(truncated)}, not a bool" if not isinstance(truncated, bool) else "",
        f"info is {_shown(info)}, not a dict" if not isinstance(info, dict) else "",
    ]
    if any(problems):
        raise EnvError(
            f"Environment.step returned a result whose {'; '.join(p for p in problems if p)}; expected {STEP_CONTRACT}"
        )
    return StepResult(list(obs), float(reward), terminated, truncated, info)


def _is_number(x: Any) -> bool:
    return (isinstance(x, (int, float)) and not isinstance(x, bool)) or (
        hasattr(x, "item") and hasattr(x, "dtype")
    )


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:120] + '...' if len(text) > 120 else text}"


@dataclass(frozen=True)
class Reward:
    """A named reward function ``fn(task, state) -> float``; weight 0 makes it a logged metric."""

    name: str
    fn: Callable[[Task, EpisodeState], float]
    weight: float = 1.0


@dataclass
class EpisodeState:
    """What reward functions see: the task, the conversation, the final answer text (the last
    policy turn when the episode ended on an answer) and free-form info from ``step``."""

    task: Task
    messages: list[Message]
    final_text: str | None
    info: dict[str, Any]
