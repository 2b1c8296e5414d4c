"""Bring your own agent: train code that already calls an OpenAI-style chat client in a loop.

Subclass ``AgentEnvironment``, write ``run(client, task)`` against the ``openai`` client it is given,
register it, and train it like any environment (``env.name`` in the config):

    @register
    class Arithmetic(AgentEnvironment):
        name = "arithmetic_agent"

        async def run(self, client, task):
            messages = [{"role": "user", "content": task.prompt}]
            reply = await client.chat.completions.create(model="policy", messages=messages)
            return float(reply.choices[0].message.content.strip() == str(task.answer))

The runner (``agentrl.rollout.agent_runner.AgentRunner``) serves the policy behind an OpenAI-compatible endpoint
on 127.0.0.1, gives each episode a client whose API key is the episode's key, runs ``group_size``
agents per task concurrently, and records every token the engine sampled in the episode's ledger,
with the roles and loss mask of a native environment's episode. Tools are whatever the agent does
between calls: the endpoint renders the ``tools`` it is sent into the prompt and returns the model's
calls as ``tool_calls``; the agent sends results back as ``tool`` messages.
"""

from __future__ import annotations

from typing import Any

from agentrl.env import Environment, Message, StepResult, Task


class AgentEnvironment(Environment):
    """An environment whose episodes are driven by the user's agent code through the endpoint.

    Override ``run`` (async, or a plain function that gets a synchronous ``openai.OpenAI`` client and
    runs in a thread). Its return value is the episode's reward (component ``agent``); return None to
    score with ``rewards()`` instead, whose functions see the final conversation
    (``EpisodeState.messages``: the client's messages and the last reply) and the last reply's text as
    ``final_text``. Both may be used: ``rewards()`` are added to the returned value.

    ``load_tasks``, ``rewards``, ``close`` and the options work as for any ``Environment``; ``reset``
    and ``step`` are the runner's business and are not called.
    """

    async def run(self, client: Any, task: Task) -> float | None:
        """Drive one episode through ``client`` (an ``openai.AsyncOpenAI`` pointed at the endpoint)
        and return its reward, or None to score it with ``rewards()``."""
        raise NotImplementedError(f"{type(self).__name__} must define run(client, task)")

    def step(self, action: str) -> StepResult:
        raise TypeError(
            f"{type(self).__name__} is an AgentEnvironment: its episodes are driven by run(client, task) "
            "through the endpoint, not by reset/step"
        )

    def reset(self, task: Task, seed: int) -> list[Message]:
        """Record the task and seed (``rewards()`` and ``close`` may read them)."""
        self.task, self.seed = task, seed
        return [{"role": "user", "content": task.prompt}]
