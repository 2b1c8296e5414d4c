"""An environment whose user code hangs forever where the option ``hang`` says, for the tests of user
code under limits (tests/test_exit.py, tests/env/test_bounded_user_code.py), several joined by commas:
``tool`` (an in-process ``@tool``), ``step``, ``reset``, ``reward``, ``later_reset`` (every ``reset``
once one has returned in this process: ``HangingEnv._resets_returned`` counts them), or ``thread`` (the
tool starts a non-daemon thread of its own that never ends, then returns). ``hang_split=test``: only the held-out
tasks' episodes hang (training runs; its evaluation hangs). ``hanging_solver`` also has solver
demonstrations, which hang where ``hang`` says (its tasks carry the option: ``task_options``);
``hanging_agent`` is an ``AgentEnvironment`` whose ``reset``, reward or ``rewards()`` listing hangs."""

from __future__ import annotations

import threading
import time
from typing import ClassVar

from agentrl.agents import AgentEnvironment
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
    hang_split = ""
    """Empty: every episode hangs; a split's name (``test``): only the episodes of that split's tasks."""
    task_options = ("hang",)  # the solver's demonstrations (a classmethod) read it from the tasks
    _resets_returned: ClassVar[list[int]] = [0]  # read by ``later_reset``
    _tool_outputs: ClassVar[list[str]] = []
    """What ``step``'s tool call returned, in this process (the episode ends on it: no transcript shows it)."""

    def hangs(self, where: str, task: Task | None = None) -> bool:
        task = task or self.task
        if self.hang_split and task is not None and not task.id.startswith(f"{self.hang_split}-"):
            return False
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
        if self.hangs("reset", task) or (self.hangs("later_reset", task) and self._resets_returned[0]):
            _forever()
        self._resets_returned[0] += 1
        return super().reset(task, seed)

    def step(self, action: str) -> StepResult:
        if self.hangs("step"):
            _forever()
        # whatever the model wrote, the tool is called: the hang does not depend on sampling
        out = self.call_tool(ToolCall("wait", {"x": 1}))
        self._tool_outputs.append(out["content"])
        return StepResult([out], 0.0, True, False, {})

    @classmethod
    def load_tasks(
        cls, split: str, n: int | None = None, seed: int = 0, hang: str | None = None, **options
    ) -> list[Task]:
        meta = {} if hang is None else {"hang": hang}
        return [Task(f"{split}-{i}", f"Task {i} of {split}.", "1", dict(meta)) for i in range(n or 4)]

    def rewards(self) -> list[Reward]:
        def varies(task: Task, state: EpisodeState) -> float:
            if self.hangs("reward", task):
                _forever()
            return float(self.seed % 2)  # rewards differ within a group: the step trains

        return [Reward("correct", varies)]


@register
class HangingSolver(HangingEnv):
    """A solver whose demonstrations reset an environment and call the tool directly, as the
    calculator's call its ``calculate``: the preflight, the SFT warm start and ``envs check`` run
    them outside any rollout. They hang where their tasks' ``hang`` says (default: the tool);
    ``envs check`` replays them through ``step`` (the tool's output matches) and scores them."""

    name = "hanging_solver"

    @classmethod
    def demonstrations(cls, tasks, seed: int = 0) -> list[list[dict]]:
        out = []
        for t in tasks:
            env = cls(hang=t.metadata.get("hang", cls.hang))
            first = env.reset(t, seed)
            env.wait(1)
            answer = {"role": "assistant", "content": "1"}
            out.append([*first, answer, env.call_tool(ToolCall("wait", {"x": 1}))])
        return out


@register
class HangingAgent(AgentEnvironment):
    """An agent environment whose ``reset`` (the agent runner's, before the agent starts), reward
    (``run`` returns None: the rewards score the episode) or ``rewards()`` listing hangs where ``hang``
    says; its agent asks the endpoint for one turn."""

    name = "hanging_agent"
    hang = "reset"

    def reset(self, task: Task, seed: int) -> list[dict]:
        if "reset" in self.hang.split(","):
            _forever()
        return super().reset(task, seed)

    @classmethod
    def load_tasks(cls, split: str, n: int | None = None, seed: int = 0, **options) -> list[Task]:
        return [Task(f"{split}-{i}", f"Task {i} of {split}.", "1", {}) for i in range(n or 4)]

    async def run(self, client, task: Task) -> None:
        if "tool" in self.hang.split(","):  # a blocking call in a coroutine: it holds the agents' loop
            _forever()
        await client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": task.prompt}], max_tokens=4
        )

    def rewards(self) -> list[Reward]:
        if "rewards" in self.hang.split(","):  # the listing itself, before any reward is computed
            _forever()

        def scored(task: Task, state: EpisodeState) -> float:
            if "reward" in self.hang.split(","):
                _forever()
            return 1.0

        return [Reward("correct", scored)]
