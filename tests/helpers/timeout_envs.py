"""An environment for the timeout tests, loaded in Ray workers through ``env.module`` (a file path):
``reset`` sleeps ``task.metadata["hang_s"]`` seconds, so a worker running it stops answering."""

from __future__ import annotations

import time

from agentrl.env import Environment, StepResult, register, registered


class Stuck(Environment):
    name = "test_stuck"
    max_turns = 1

    def reset(self, task, seed):
        time.sleep(float(task.metadata.get("hang_s", 0.0)))
        return super().reset(task, seed)

    def step(self, action: str) -> StepResult:
        return StepResult([], 0.0, True, False, {"answer": action})


if "test_stuck" not in registered():
    register(Stuck)
