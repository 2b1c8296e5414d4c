"""recall: a fact told early must survive until a question at the end, longer than the context holds.

The environment tells the model a code in its first observation, then sends ``fillers`` messages of
``filler_words`` words each (``data.options``) (the model replies ``ok`` to each), then asks for the code. The episode
needs ``fillers`` + 3 turns; with a context budget (``rollout.context.max_tokens``) that holds only a
few of them, the code is gone from the context before the question unless something keeps it:

- ``rollout.context.policy: stop`` ends the episode before the question (no answer, reward 0);
- ``window`` drops the oldest turns, the code with them (the answer is a guess);
- ``compact`` asks the model for a summary when the context is full: a summary that keeps the code
  lets it answer. The environment's ``summary_prompt`` says what the summary must keep.

Tasks are seeded 4-digit codes (``generators.sample_tasks``: held-out codes never trained on).
Demonstrations show the whole conversation; ``summary_demonstration`` says what a summary should
keep, for a warm start of the summaries too (``agentrl.env.demos.with_summaries``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from agentrl.env import Environment, Message, Reward, StepResult, Task, register
from environments.generators import Draw, first_messages, sample_tasks, task_id
from environments.rewards import correct, has_answer
from environments.short_cot import answer_step

_WORDS = [
    "river",
    "stone",
    "cloud",
    "lamp",
    "forest",
    "window",
    "garden",
    "paper",
    "bridge",
    "candle",
    "mountain",
    "letter",
    "orange",
    "silver",
    "market",
    "island",
    "winter",
    "pocket",
    "mirror",
    "ladder",
    "basket",
    "harbor",
    "meadow",
    "violin",
]
PROMPT = (
    "I will tell you a code and then send you some messages. Reply ok to each message. "
    "At the end I will ask you for the code."
)
QUESTION = "What was the code? Answer as \\boxed{N}."


def make_code(rng: random.Random, fillers: int = 4, filler_words: int = 24) -> Draw:
    code = rng.randint(1000, 9999)  # the code alone decides the split, whatever the knobs
    meta = {"family": "recall", "code": code, "fillers": fillers, "filler_words": filler_words}
    key = f"recall|{code}"
    return key, f"Memory test {task_id('recall', key)[-6:]}. {PROMPT}", code, meta


@register
class Recall(Environment):
    name = "recall"
    system_prompt = "Follow the instructions. Give the final answer as \\boxed{N}."
    summary_prompt = (
        "Your context is full: the messages above will be removed. Write down what you must keep, "
        "as: The code is N."
    )
    max_turns = 32

    def reset(self, task: Task, seed: int) -> list[Message]:
        self._turn = 0
        return super().reset(task, seed)

    def step(self, action: str) -> StepResult:
        assert self.task is not None
        self._turn += 1
        obs = self.observation(self.task, self.seed, self._turn)
        if obs is None:
            return answer_step(action)
        return StepResult([{"role": "user", "content": obs}], 0.0, False, False, {})

    @staticmethod
    def observation(task: Task, seed: int, turn: int) -> str | None:
        """The message after reply ``turn`` (1 = the code), None once the question was answered."""
        fillers, words = task.metadata.get("fillers", 4), task.metadata.get("filler_words", 24)
        if turn == 1:
            return f"The code is {task.answer}. Reply ok."
        if turn <= 1 + fillers:
            rng = random.Random(f"recall:{task.id}:{seed}:{turn}")
            text = " ".join(rng.choice(_WORDS) for _ in range(words))
            return f"Message {turn - 1}: {text}. Reply ok."
        if turn == 2 + fillers:
            return QUESTION
        return None

    @classmethod
    def load_tasks(cls, split: str, n: int | None = None, seed: int = 0, **knobs: Any) -> list[Task]:
        """Seeded 4-digit codes; knobs ``fillers`` (messages between the code and the question) and
        ``filler_words`` (words in each) set how long an episode is."""
        return sample_tasks("recall", lambda rng: make_code(rng, **knobs), split, n, seed)

    @classmethod
    def demonstrations(cls, tasks: Sequence[Task], seed: int = 0) -> list[list[Message]]:
        """The whole conversation of each task: ``ok`` to every message, the code when asked."""
        demos = []
        for task in tasks:
            chat = first_messages(cls.system_prompt, task)
            turn = 0
            while (obs := cls.observation(task, 0, turn) if turn else "") is not None:
                if obs:
                    chat.append({"role": "user", "content": obs})
                chat.append(
                    {"role": "assistant", "content": f"\\boxed{{{task.answer}}}" if obs == QUESTION else "ok"}
                )
                turn += 1
            demos.append(chat)
        return demos

    @classmethod
    def summary_demonstration(cls, task: Task, messages: Sequence[Message]) -> str | None:
        """What a summary written after ``messages`` should say (``rollout.context.policy:
        compact`` warms it up too: ``agentrl.env.demos.with_summaries``)."""
        told = any(f"The code is {task.answer}" in str(m.get("content")) for m in messages)
        return f"The code is {task.answer}." if told else "No code yet."

    def rewards(self) -> list[Reward]:
        return [Reward("correct", correct, 1.0), Reward("has_answer", has_answer, 0.0)]
