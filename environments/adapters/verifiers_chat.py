"""A verifiers harness that runs in agentrl's process: the conversation of a task, answered by the policy.

verifiers 0.4.0 names a harness by an importable top-level module that exports one ``Harness``
subclass; the adapter registers this module as ``agentrl_chat`` (``harness: {id: agentrl_chat}``). Its built-in ``bash`` and ``null``
harnesses run a script through ``uv`` in a sandbox, which fetches packages at run time; this one
makes its model calls from the process it runs in, as ``Harness.launch`` allows so long as every
call goes to the ``endpoint`` with the ``secret`` it is given (verifiers' interception server, which
relays them to agentrl's endpoint, where every token is recorded).

A turn sends the task's system prompt and prompt (or the conversation so far, when verifiers drives
several turns) and returns the reply; the taskset's own rewards score the trace. When agentrl's
endpoint has ended the episode on its budget (``rollout.max_turns``, the episode's token budget), a
further turn returns an empty reply instead of an error, as a model with nothing more to say would:
verifiers' multi-turn envs then end the exchange and score what happened (the openenv taskset sums
the rewards of the steps taken); an error would have failed the episode and dropped them.
"""

from __future__ import annotations

import re
from typing import Any

import openai
import verifiers.v1 as vf
from verifiers.v1.runtimes import ProgramResult

# agentrl's endpoint's answer to a turn past the episode's budget, as verifiers' interception relays it
BUDGET_SPENT = re.compile(r"has ended \((max_turns|token_budget)\).*agentrl_episode_ended", re.DOTALL)


class ChatHarnessConfig(vf.HarnessConfig):
    pass


class ChatHarness(vf.Harness[ChatHarnessConfig]):
    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_RESUME = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(
        self,
        ctx: Any,
        trace: Any,
        runtime: Any,
        endpoint: str,
        secret: str,
        mcp_urls: Any,
        data: Any,
        **_: Any,
    ) -> Any:
        system, prompt = self.resolve_prompt(data)
        messages: list[Any] = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        else:
            messages += [
                m.model_dump(exclude_none=True) if hasattr(m, "model_dump") else dict(m) for m in prompt
            ]
        client = openai.AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0)
        try:
            reply = await client.chat.completions.create(model=ctx.model, messages=messages)
        except openai.APIStatusError as e:
            if not BUDGET_SPENT.search(str(e)):
                raise
            return ProgramResult(exit_code=0, stdout="", stderr=str(e))
        finally:
            await client.close()
        return ProgramResult(exit_code=0, stdout=reply.choices[0].message.content or "", stderr="")


__all__ = ["ChatHarness"]
