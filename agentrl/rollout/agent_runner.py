"""The runner of ``AgentEnvironment`` episodes.

``AgentRunner`` is an ``EpisodeRunner`` whose turns arrive as OpenAI chat-completion requests instead
of being driven by ``reset``/``step``: it opens one episode per request, runs each episode's agent
against its own endpoint (``agent_loop``) and ends the episode with what the agent returned. Each
episode has a ledger (``agent_ledger.Ledger``: the runner's per-episode record, keyed by the request's
episode key); the endpoint's backend (``agent_endpoint.AgentEndpoint``) serves each request as a turn.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.engines.base import Engine
from agentrl.env import Environment
from agentrl.episode import Episode
from agentrl.rollout.agent_endpoint import AgentEndpoint
from agentrl.rollout.agent_ledger import Ledger
from agentrl.rollout.agent_loop import loop_blocked, run_agents
from agentrl.rollout.async_runner import RequestBatcher
from agentrl.rollout.runner import EpisodeRequest, RunnerSettings, close_quietly
from agentrl.serve.openai_api import OpenAIServer
from agentrl.timeouts import LoopThread, call_with_timeout

logger = logging.getLogger(__name__)

ON_DRIFT = ("split", "fail", "retokenize")


@dataclass(frozen=True)
class Endpoint:
    """The agent runner's OpenAI-compatible endpoint (the ``proxy`` section of a config)."""

    host: str = "127.0.0.1"
    port: int = 0
    """0: any free port (``AgentRunner.url`` says which)."""
    model_name: str = "agentrl-policy"
    on_drift: str = "split"
    """What to do when an agent sends back a history the policy did not write: ``split``, ``fail`` or
    ``retokenize`` (``agentrl.rollout.drift``)."""


class AgentRunner(AgentEndpoint):
    """Runs ``AgentEnvironment`` episodes: each agent's ``run(client, task)`` calls the endpoint, whose
    backend (``AgentEndpoint``) records its episode. ``agentrl serve``'s backend is a subclass
    (``cli/serve.py``: ``ServedRunner``).

    The engine is shared through continuous batching (``RequestBatcher``, or the engine's own
    ``submit``); at most ``max_concurrent_episodes`` agents run at once."""

    step_reward_name = "agent"

    env_threads = 1  # the agents run in their own threads

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        env_factory: Callable[[], Environment],
        settings: RunnerSettings | None = None,
        endpoint: Endpoint | None = None,
        *,
        max_wait_s: float = 0.01,
    ) -> None:
        endpoint = endpoint or Endpoint()
        if endpoint.on_drift not in ON_DRIFT:
            raise ValueError(f"proxy.on_drift is {endpoint.on_drift!r}; valid: {', '.join(ON_DRIFT)}")
        super().__init__(engine, tokenizer, env_factory, settings, endpoint.on_drift)
        self.model_name = endpoint.model_name
        self.agent_timeout_s = self.settings.agent_timeout_s
        self.max_concurrent_episodes = self.settings.max_concurrent_episodes
        submit = getattr(engine, "submit", None)
        self._batcher = None
        if submit is None:
            self._batcher = RequestBatcher(
                engine,
                self.max_concurrent_episodes,
                max_wait_s,
                ready=self._ready,
                max_gather_s=40 * max_wait_s,
                lazy=True,  # run() generates in its own thread (RequestBatcher.drive)
                timeout_s=self.request_timeout_s,
            )
            submit = self._batcher.submit
        self._submit = submit
        self.server = OpenAIServer(self, host=endpoint.host, port=endpoint.port).start()

    @property
    def url(self) -> str:
        """The endpoint's base URL (``http://127.0.0.1:PORT/v1``), what an ``openai`` client takes."""
        return self.server.url

    def close(self) -> None:
        self.server.close()
        if self._batcher is not None:
            self._batcher.close(wait=False)
        super().close()

    def _ready(self) -> int:
        """How many requests the batcher may wait for (``max_wait_s`` at most): every running agent
        could be about to ask; an agent busy with its own tools costs the batch that short wait."""
        with self._lock:
            return max(1, sum(not (lv.done or lv.agent_done) for lv in self._ledgers.values()))

    # -- episodes ----------------------------------------------------------------------------
    def open(self, req: EpisodeRequest, key: str | None = None) -> Ledger:
        """Start recording an episode under ``key`` (default: the episode's id)."""
        lv = Ledger.start(req, key)
        ep = lv.episode
        # user code, bounded as the lockstep runner bounds it (timeouts.env_step_s), in a thread that
        # ends with the call: open runs in whichever thread asks (under serve, an HTTP connection's),
        # and _bounded keeps a helper thread per calling thread
        limit, setting = self.env_timeout_s, f"timeouts.env_step_s={self.env_timeout_s:g}s"
        try:
            env = call_with_timeout(self.env_factory, limit, "environment construction", setting)
            lv.env, ep.env = env, env.name
            call_with_timeout(
                lambda: env.reset(req.task, req.seed), limit, f"environment {env.name!r} reset", setting
            )
        except Exception as e:
            lv.fail("env", e)
        with self._lock:
            taken = lv.key in self._ledgers
            if not taken:
                self._ledgers[lv.key] = lv
        if taken:
            if lv.env is not None:
                lv.env.close()
            raise ValueError(f"episode key {lv.key!r} is already open")
        return lv

    def pop(self, key: str) -> Ledger:
        with self._lock:
            return self._ledgers.pop(key)

    def run(self, requests: Sequence[EpisodeRequest]) -> list[Episode]:
        """Run one agent per request, concurrently, and return their episodes in request order.

        The agents run on an event loop in a daemon thread of their own; an in-process engine
        generates here, in the thread that trains. If this thread is interrupted (a second Ctrl-C),
        the run stops at once: see ``_abort``."""
        if self._batcher is not None:
            self._batcher.resume()
        lives: list[Ledger] = []
        try:
            for r in requests:
                lives.append(self.open(r))
        except BaseException:
            self._discard(lives)
            raise
        at_once, agent_s = self.max_concurrent_episodes, self.agent_timeout_s
        agents = LoopThread(run_agents(lives, self.url, at_once, self.request_timeout_s, agent_s))
        # each agent is cancelled at agent_run_s, so the loop ends within a round of that per
        # max_concurrent agents, unless an agent blocks it (a blocking call in a coroutine): one
        # more round of slack, then every episode fails instead of the run waiting forever
        rounds = -(-len(lives) // max(1, at_once)) + 1
        deadline = time.monotonic() + rounds * agent_s
        try:
            if self._batcher is not None and hasattr(self.engine, "bounded"):
                # each call bounded by the request timeout; other engines are served by the
                # batcher's own thread
                self._batcher.drive(
                    until=lambda: agents.done.done() or time.monotonic() > deadline, start=agents.start
                )
            else:
                agents.start()
            outcomes = agents.done.result(timeout=max(0.0, deadline - time.monotonic()))
        except concurrent.futures.TimeoutError:
            error = loop_blocked(lives, agents, rounds * agent_s, agent_s, at_once)
            for lv in lives:
                if not lv.episode.failed:
                    lv.fail("agent", error)
            outcomes = [error] * len(lives)
        except BaseException:
            self._abort(lives, agents)
            raise
        episodes = []
        for lv, outcome in zip(lives, outcomes):
            self.pop(lv.key)
            episodes.append(self.finish_episode(lv, outcome))
        return episodes

    def _abort(self, lives: list[Ledger], agents: LoopThread, grace_s: float = 5.0) -> None:
        """Stop a run whose driving thread was interrupted: its episodes take no more turns (their
        requests get ``agentrl_episode_ended``), queued and later generations fail, the agents are
        cancelled and get up to ``grace_s`` to return, and the environments are closed. The
        episodes are dropped, like a lockstep rollout interrupted mid-step (the run resumes from a
        checkpoint)."""
        try:
            for lv in lives:
                lv.end_turns()
            if self._batcher is not None:
                self._batcher.stop(RuntimeError("the run was interrupted"))
            if not agents.cancel(grace_s):
                logger.warning("interrupted run: agents still running after %.0f s are abandoned", grace_s)
        finally:
            self._discard(lives)

    def _discard(self, lives: list[Ledger]) -> None:
        """Forget these episodes: drop their ledgers (a later request gets 404) and close their
        environments."""
        with self._lock:
            for lv in lives:
                self._ledgers.pop(lv.key, None)
        close_quietly(lives)

    def finish_episode(self, lv: Ledger, outcome: Any) -> Episode:
        """The episode of a ledger whose agent returned ``outcome`` (a reward, None, or an exception)."""
        lv.end_turns()
        ep, env = lv.episode, lv.env

        def rewards() -> Any:  # called only for an episode with an environment
            assert env is not None
            return self._bounded(env.rewards, env, "rewards")

        lv.record_outcome(outcome, self.agent_timeout_s, rewards)
        if ep.stop_reason is None:
            ep.stop_reason = "answered"
        lv.done = True
        ep.metrics["tool_calls"] = lv.calls
        self._finish(lv)
        if not ep.failed and isinstance(outcome, (int, float)):
            ep.reward_components.setdefault(self.step_reward_name, float(outcome))  # a 0 is a reward too
        return ep
