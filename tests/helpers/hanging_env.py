"""An environment whose user code hangs forever where the option ``hang`` says, for the exit tests
(tests/test_exit.py), several joined by commas: ``tool`` (an in-process ``@tool``), ``step``, ``reset``, ``reward``, or
``thread`` (the tool starts a non-daemon thread of its own that never ends, then returns)."""

from __future__ import annotations

import threading
import time

from agentrl.env import Environment, EpisodeState, Reward, StepResult, Task, register, tool
from agentrl.tools import ToolCall


def _forever() -> None:
    while True:
        time.sleep(0.5)


@register
class HangingEnv(Environment):
    name = "hanging"
    system_prompt = "Call the wait tool."
    tool_timeout_s = 0.5
    max_turns = 1
    hang = "tool"

    def hangs(self, where: str) -> bool:
        return where in self.hang.split(",")

    @tool
    def wait(self, x: int) -> int:
        """Waits.

        Args:
            x: any number.
        """
        if self.hangs("thread"):
            threading.Thread(target=_forever, name="user-thread", daemon=False).start()
            return x
        if self.hangs("tool"):
            _forever()
        return x

    def reset(self, task: Task, seed: int) -> list[dict]:
        if self.hangs("reset"):
            _forever()
        return super().reset(task, seed)

    def step(self, action: str) -> StepResult:
        if self.hangs("step"):
            _forever()
        # whatever the model wrote, the tool is called: the hang does not depend on sampling
        return StepResult([self.call_tool(ToolCall("wait", {"x": 1}))], 0.0, True, False, {})

    @classmethod
    def load_tasks(cls, split: str, n: int | None = None, seed: int = 0, **options) -> list[Task]:
        return [Task(f"{split}-{i}", f"Task {i} of {split}.", "1", {}) for i in range(n or 4)]

    def rewards(self) -> list[Reward]:
        def varies(task: Task, state: EpisodeState) -> float:
            if self.hangs("reward"):
                _forever()
            return float(self.seed % 2)  # rewards differ within a group: the step trains

        return [Reward("correct", varies)]


@register
class HangingSolver(HangingEnv):
    """A solver whose demonstrations call the hanging tool directly, as the calculator's call its
    ``calculate``: the preflight and ``envs check`` run them outside any rollout."""

    name = "hanging_solver"

    @classmethod
    def demonstrations(cls, tasks, seed: int = 0) -> list[list[dict]]:
        env = cls()
        return [[*env.reset(t, seed), {"role": "assistant", "content": str(env.wait(1))}] for t in tasks]
