"""An agent you already have, trained by agentrl: it calls an OpenAI-style client in a loop and runs
its own tool (docs/environments.md, "Bring your own agent")."""

import json
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


def add(a: int, b: int) -> int:
    return a + b


async def solve(client, question: str, max_turns: int = 3) -> str:
    """The agent: plain openai-client code, nothing agentrl-specific."""
    messages = [
        {"role": "system", "content": "Use the add tool, then answer with the number only."},
        {"role": "user", "content": question},
    ]
    for _ in range(max_turns):
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=[ADD])
        message = reply.choices[0].message
        messages.append(message)
        if not message.tool_calls:
            return message.content or ""
        for call in message.tool_calls:
            try:
                result = str(add(**json.loads(call.function.arguments)))
            except (TypeError, ValueError) as e:
                result = f"Error: {e}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return ""


@register
class ArithmeticAgent(AgentEnvironment):
    name = "arithmetic_agent"

    @classmethod
    def load_tasks(cls, split, n=None, seed=0, **options):
        # every fifth pair of numbers is a test problem: the splits never share a question
        pairs = [(a, b) for a in range(51) for b in range(51) if ((a * 51 + b) % 5 == 0) == (split == "test")]
        random.Random(f"{split}-{seed}").shuffle(pairs)
        return [Task(f"add-{a}-{b}", f"What is {a} + {b}?", answer=a + b) for a, b in pairs[: n or 200]]

    async def run(self, client, task):
        answer = await solve(client, task.prompt)
        return 1.0 if answer.strip() == str(task.answer) else 0.0
