"""An OpenAI-client agent with a tool loop, trained through the endpoint in tests/training/test_agent_training.py
(imported by ``env.module``, as a user's own file would be)."""

from __future__ import annotations

import random

from agentrl.agents import AgentEnvironment
from agentrl.env import Task, register

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


@register
class ArithmeticAgent(AgentEnvironment):
    name = "test_arithmetic_agent"

    @classmethod
    def load_tasks(cls, split, n=None, seed=0, **options):
        rng = random.Random(f"{split}-{seed}")
        pairs = [(rng.randint(0, 20), rng.randint(0, 20)) for _ in range(n or 16)]
        return [Task(f"{split}-{i}", f"What is {a} + {b}?", answer=a + b) for i, (a, b) in enumerate(pairs)]

    async def run(self, client, task):
        messages = [{"role": "user", "content": task.prompt}]
        for _ in range(2):
            reply = await client.chat.completions.create(model="policy", messages=messages, tools=[ADD])
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                messages.append({"role": "tool", "tool_call_id": call.id, "content": "an answer"})
        # an untrained tiny model never answers right; a digit anywhere is a reward with variance
        return float(any(ch.isdigit() for ch in message.content or ""))
