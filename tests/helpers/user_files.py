"""Sources of files a user would write, for tests that need them outside the test process (a
subprocess, a Ray worker, ``env.module``): the code exists only in that file."""

from __future__ import annotations


def one_turn_env(name: str) -> str:
    """A one-turn environment registered as ``name``; its reward counts the distinct characters of
    the answer, so a random policy's rewards differ (every step has something to train on)."""
    return f'''
from agentrl.env import Environment, Reward, StepResult, Task, register


@register
class UserEnv(Environment):
    """A user's environment that only its own file defines."""

    name = {name!r}
    max_turns = 1

    @classmethod
    def load_tasks(cls, split, n=None, seed=0, **options):
        return [Task(id=f"{{split}}-{{seed}}-{{i}}", prompt=f"Say something {{i}}.") for i in range(n or 8)]

    def step(self, action):
        return StepResult([], 0.0, True, False, {{"answer": action}})

    def rewards(self):
        return [Reward("correct", lambda task, s: len(set(s.final_text or "")) / 10.0)]
'''
