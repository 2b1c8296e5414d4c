"""Test environments shared by several test files, registered on import."""

from __future__ import annotations

from agentrl.env import Environment, Reward, StepResult, Task, register


class Chatter(Environment):
    """Single turn; the reward counts distinct characters, so a random policy gets varied rewards
    (non-zero advantages) without any training."""

    name = "test_chatter"
    max_turns = 1

    @classmethod
    def load_tasks(cls, split, n=None, seed=0, **options):
        return [Task(id=f"{split}-{i}", prompt=f"Say something {i}.") for i in range(n or 8)]

    def step(self, action: str) -> StepResult:
        return StepResult([], 0.0, True, False, {"answer": action})

    def rewards(self):
        return [Reward("variety", lambda task, s: len(set(s.final_text or "")) / 10.0)]


register(Chatter)


@register
class AllCorrect(Chatter):
    """Every answer is correct: the outcome never varies, only the length does."""

    name = "test_all_correct"

    def rewards(self):
        return [Reward("correct", lambda task, s: 1.0)]


@register
class OddRewards(Chatter):
    """Task ``train-0``'s reward is NaN and task ``train-1``'s the string "1.0": neither is a real,
    finite number, so those episodes fail at the reward boundary; the other tasks score as
    ``test_chatter``."""

    name = "test_odd_rewards"

    def rewards(self):
        def variety(task, s):
            odd = {"train-0": float("nan"), "train-1": "1.0"}
            return odd.get(task.id, len(set(s.final_text or "")) / 10.0)

        return [Reward("variety", variety)]
