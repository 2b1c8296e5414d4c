"""Environments for the Ray and torchrun tests, loaded in the workers through ``env.module`` (a file
path).

``crashy`` kills its worker process in ``reset`` for tasks whose metadata says so: once (a flag file
records that the crash happened, so a retry succeeds) or always.

``noisy`` records draws from the process's global ``random`` as a weight-0 reward, after burning a
task-dependent number of draws in ``reset``: data-parallel ranks running different tasks end each
step with different RNG states, so a resumed rank restored with the wrong rank's state (or none)
records different noise than the uninterrupted run.
"""

from __future__ import annotations

import os
import random
import time
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


class Noisy(Crashy):
    """Draws from the process's global ``random`` (a number of draws that depends on the task), so
    each rank's RNG state matters for what its rewards record."""

    name = "test_noisy"

    def reset(self, task, seed):
        for _ in range(int(task.id.rsplit("-", 1)[1]) + 1):  # ranks' RNG streams drift apart
            random.random()
        return super().reset(task, seed)

    def rewards(self):
        return [
            Reward("variety", lambda task, s: len(set(s.final_text or "")) / 10.0),
            Reward("noise", lambda task, state: random.random(), weight=0.0),
        ]


class Turns(Crashy):
    """Three turns whatever the policy writes, each environment step taking ``delay_s`` (a slow
    tool): episodes that span weight updates in async mode, trained with their varied rewards."""

    name = "test_turns"
    max_turns = 3
    delay_s = 0.0
    turn = 0

    def step(self, action: str) -> StepResult:
        time.sleep(self.delay_s)
        self.turn += 1
        if self.turn >= 3:
            return StepResult([], 0.0, True, False, {"answer": action})
        return StepResult([{"role": "user", "content": f"Go on ({self.turn})."}], 0.0, False, False, {})


if "test_turns" not in registered():
    register(Turns)
if "test_crashy" not in registered():
    register(Crashy)
if "test_noisy" not in registered():
    register(Noisy)
