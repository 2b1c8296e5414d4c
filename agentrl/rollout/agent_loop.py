"""The agents' event loop: each episode's ``AgentEnvironment.run`` against the endpoint, at most so
many at once, and what a run does when an agent blocks that loop (``loop_blocked``)."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

from agentrl.agents import AgentEnvironment
from agentrl.rollout.agent_ledger import Ledger
from agentrl.timeouts import DaemonThreads, LoopThread


async def run_agents(
    lives: list[Ledger], url: str, max_concurrent: int, request_timeout_s: float, agent_timeout_s: float
) -> list[Any]:
    """Each ledger's agent (``AgentEnvironment.run``) against the endpoint at ``url``, at most
    ``max_concurrent`` at once: coroutine agents on this loop, plain functions on daemon threads. An
    agent's exception (or timeout) is its outcome, not the run's."""
    import openai

    limit = asyncio.Semaphore(max_concurrent)
    timeout = request_timeout_s + 30.0  # the endpoint answers within its own engine timeout
    threads = DaemonThreads()  # plain-function agents; a stuck one is abandoned, never joined

    def run_sync(env: AgentEnvironment, key: str, task: Any) -> Any:
        with openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=timeout) as client:
            return env.run(client, task)

    async with openai.DefaultAsyncHttpxClient() as http:  # one connection pool for every agent

        async def one(lv: Ledger) -> Any:
            if lv.done:  # the environment failed to start
                return None
            assert isinstance(lv.env, AgentEnvironment) and lv.env.task is not None
            env, task = lv.env, lv.env.task
            async with limit:
                call: Any  # the agent's coroutine, or its thread's future
                try:
                    if inspect.iscoroutinefunction(env.run):
                        client = openai.AsyncOpenAI(
                            base_url=url,
                            api_key=lv.key,
                            http_client=http,
                            max_retries=0,
                            timeout=timeout,
                        )
                        call = env.run(client, task)
                    else:
                        call = asyncio.get_running_loop().run_in_executor(
                            threads, run_sync, env, lv.key, task
                        )
                    return await asyncio.wait_for(call, agent_timeout_s)
                except BaseException as e:  # the agent's failure is its episode's, not the run's
                    if isinstance(e, (KeyboardInterrupt, SystemExit)):
                        raise
                    return e
                finally:
                    lv.agent_done = True

        try:
            return await asyncio.gather(*(one(lv) for lv in lives))
        finally:
            threads.shutdown(wait=False, cancel_futures=True)


def loop_blocked(
    lives: list[Ledger], agents: LoopThread, waited_s: float, agent_s: float, at_once: int
) -> TimeoutError:
    """The agents' loop did not end in time: an agent blocked it (``AgentEnvironment.run`` is a
    coroutine that made a blocking call), so no agent's own limit could fire. The episodes take no
    more turns, the loop's thread is abandoned (a daemon: it cannot keep the process alive), and the
    error every episode of the batch fails with at the ``agent`` boundary is returned."""
    for lv in lives:
        lv.end_turns()  # a request the loop makes later gets agentrl_episode_ended
    agents.abandon()
    return TimeoutError(
        f"the agents' event loop did not return within {waited_s:g}s (timeouts.agent_run_s={agent_s:g}s "
        f"per agent, {at_once} at once): an async AgentEnvironment.run made a blocking call (a tool, "
        "time.sleep, a synchronous client), which holds every agent; run blocking work in a thread "
        "(await asyncio.to_thread(...))"
    )
