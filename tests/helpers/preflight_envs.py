"""Environments a user could write that the pre-flight checks must catch before any work
(tests/training/test_preflight.py imports this file as ``env.module``)."""

from __future__ import annotations

from agentrl.env import Environment, Task, register


@register
class NoTasksNoDemos(Environment):
    """No ``load_tasks`` (tasks must come from a data file) and no ``demonstrations``."""

    name = "preflight_no_tasks"
    mode = "plain"  # an option: env.options.mode=... sets it


@register
class BadTasks(Environment):
    """``load_tasks`` returns something other than tasks, or nothing, as ``data.options.kind`` says."""

    name = "preflight_bad_tasks"

    @classmethod
    def load_tasks(cls, split: str, n: int | None = None, seed: int = 0, **options) -> list:
        if options.get("kind") == "empty":
            return []
        if options.get("kind") == "none":
            return None  # type: ignore[return-value]  (a forgotten return)
        return [{"id": "1", "prompt": "hi"}]


@register
class BrokenInit(Environment):
    """An environment whose constructor raises."""

    name = "preflight_broken_init"

    def __init__(self, **options) -> None:
        super().__init__(**options)
        raise RuntimeError("cannot reach the simulator")

    @classmethod
    def load_tasks(cls, split: str, n: int | None = None, seed: int = 0) -> list[Task]:
        return [Task(f"{split}-0", "hi", "1")]
