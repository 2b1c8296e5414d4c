"""code_interpreter: multi-turn tool use where the tool is a Python interpreter in a sandbox.

The model writes a ```python block; the episode's session runs it and the output (stdout, stderr, the
last expression's value, the traceback, limit notes) comes back as a ``tool`` message. Variables
persist across the episode's cells. A turn without a code block is the final answer (``\\boxed{}``).

Errors, timeouts and limits hit by the *code* are feedback to the model. A failure of the sandbox
*itself* (it cannot start, the engine is gone) raises ``sandboxes.SandboxError``, which the runner
records at the ``sandbox`` boundary. One session per episode: taken from the process-wide pool of
the environment's ``sandbox`` (a ``SandboxSpec``: backend, options, warm sessions) in ``reset``,
closed in ``close`` (the runner always calls it). The trainer passes the run's ``sandbox`` section;
on its own, ``CodeInterpreter(sandbox=SandboxSpec("docker", {"limits": {"wall_s": 5}}))``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from agentrl.env import Environment, Message, Reward, Task, register, tool
from agentrl.tools import ToolCall, check_arguments
from environments.generators import code_arithmetic_demos, code_arithmetic_tasks, first_messages
from environments.rewards import correct_number, has_answer, num_tool_calls
from sandboxes import Session, format_result, shared_pool


@register
class CodeInterpreter(Environment):
    name = "code_interpreter"
    system_prompt: ClassVar[str | None] = (
        "Solve the problem. You can run Python: write a ```python code block and you will see what it "
        "prints. Variables persist between blocks. Give the final answer as \\boxed{...}."
    )
    tool_format = "python"
    max_turns = 6

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._session: Session | None = None

    @tool
    def python(self, code: str) -> str:
        """Run Python code in this episode's interpreter; returns what it printed, the value of the
        last expression, or the error.

        Args:
            code: Python source; variables persist between calls.
        """
        if self._session is None:
            raise RuntimeError("code_interpreter: no session (reset was not called)")
        return format_result(self._session.run(code))

    def reset(self, task: Task, seed: int) -> list[Message]:
        self.close()
        self._session = shared_pool(self.sandbox).acquire(timeout=self.sandbox.acquire_timeout_s)
        return super().reset(task, seed)

    def call_tool(self, call: ToolCall) -> Message:
        """Run a code block directly in the session: the sandbox enforces its own time limit (no
        in-process watchdog thread), and ``SandboxError`` propagates to the runner."""
        if call.error is not None or call.name != "python":
            return super().call_tool(call)
        problem = check_arguments(self.python, call.arguments)
        if problem:
            return {"role": "tool", "name": "python", "content": f"Error: {problem}"}
        return {"role": "tool", "name": "python", "content": self.python(call.arguments["code"])}

    def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            session.close()

    @classmethod
    def load_tasks(cls, split: str, n: int | None = None, seed: int = 0, **knobs: Any) -> list[Task]:
        """Arithmetic that is easier with code (``generators.make_code_arithmetic``)."""
        return code_arithmetic_tasks(split, n, seed, **knobs)

    @classmethod
    def demonstrations(cls, tasks: Sequence[Task], seed: int = 0) -> list[list[Message]]:
        """Write a program, read its output, answer in ``\\boxed{}``."""
        return code_arithmetic_demos(tasks, seed, first=lambda t: first_messages(cls.system_prompt, t))

    def rewards(self) -> list[Reward]:
        return [
            Reward("correct", correct_number, 1.0),  # a computed number, not the question copied
            Reward("has_answer", has_answer, 0.0),
            Reward("tool_calls", num_tool_calls, 0.0),
        ]
