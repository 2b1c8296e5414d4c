"""Environments for the Ray tests, loaded in the workers through ``env.module`` (a file path).

``crashy`` kills its worker process in ``reset`` for tasks whose metadata says so: once (a flag file
records that the crash happened, so a retry succeeds) or always.
"""

from __future__ import annotations

import os
from pathlib import Path

from agentrl.env import Environment, Reward, StepResult, Task, register, registered


class Crashy(Environment):
    name = "test_crashy"
    max_turns = 1

    @classmethod
    def load_tasks(cls, split, n=None, seed=0, **options):
        return [Task(id=f"{split}-{i}", prompt=f"Say something {i}.") for i in range(n or 8)]

    def step(self, action: str) -> StepResult:
        return StepResult([], 0.0, True, False, {"answer": action})

    def reset(self, task, seed):
        mode = task.metadata.get("crash")
        flag = Path(task.metadata.get("flag", "/nonexistent"))
        if mode == "always" or (mode == "once" and not flag.exists()):
            flag.touch()
            os._exit(17)  # the worker process dies, as on a segfault or a lost node
        return super().reset(task, seed)

    def rewards(self):
        return [
            Reward("variety", lambda task, s: len(set(s.final_text or "")) / 10.0),
            Reward("pid", lambda task, state: float(os.getpid()), weight=0.0),
        ]


if "test_crashy" not in registered():
    register(Crashy)
