"""A complete tool environment in one screen: the model looks facts up with a typed tool.

The task names a city; the model calls ``lookup_population(city)`` (a JSON tool call), reads the
result, and answers with the number in ``\\boxed{}``. This file is the example of
docs/environments.md; tests/env/test_guide_example.py checks it and trains on it.
"""

import random

from agentrl.env import Environment, EpisodeState, Reward, Task, ToolFeedback, register, tool
from agentrl.tools import format_tool_call

CITIES = {f"City{i}": 1000 + 37 * i for i in range(1000)}  # a made-up world: nothing to memorise


@register
class PopulationLookup(Environment):
    name = "population_lookup"
    system_prompt = "Answer with the population as \\boxed{N}. Use the lookup tool."
    max_turns = 3

    @tool
    def lookup_population(self, city: str) -> int:
        """Population of a city.

        Args:
            city: the city's name, e.g. "City7".
        """
        if city not in CITIES:
            raise ToolFeedback(f"unknown city {city!r}")  # goes back to the model as an error message
        return CITIES[city]

    @classmethod
    def load_tasks(cls, split, n=None, seed=0, **options):
        names = sorted(CITIES)
        chosen = (
            names[::5] if split == "test" else [c for i, c in enumerate(names) if i % 5]
        )  # disjoint splits
        random.Random(seed).shuffle(chosen)
        return [Task(id=c, prompt=f"How many people live in {c}?", answer=CITIES[c]) for c in chosen[:n]]

    @classmethod
    def demonstrations(cls, tasks, seed=0):
        env = cls()
        demos = []
        for t in tasks:
            msgs = env.reset(t, seed)
            msgs.append(
                {"role": "assistant", "content": format_tool_call("lookup_population", {"city": t.id})}
            )
            msgs.append({"role": "tool", "name": "lookup_population", "content": str(t.answer)})
            msgs.append({"role": "assistant", "content": f"\\boxed{{{t.answer}}}"})
            demos.append(msgs)
        return demos

    def rewards(self):
        return [Reward("correct", correct), Reward("turns", turns, weight=0.0)]  # weight 0: a logged metric


def correct(task: Task, state: EpisodeState) -> float:
    return float(state.info.get("answer") == str(task.answer))


def turns(task: Task, state: EpisodeState) -> float:
    return float(sum(m["role"] == "assistant" for m in state.messages))
