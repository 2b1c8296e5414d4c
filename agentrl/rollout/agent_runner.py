"""The endpoint's backend and the runner of ``AgentEnvironment`` episodes.

``AgentRunner`` is an ``EpisodeRunner`` whose turns arrive as OpenAI chat-completion requests instead
of being driven by ``reset``/``step``. Each episode has a ledger (the runner's per-episode record, keyed
by the request's episode key). A request is served in four moves:

1. **Extend.** The request's messages are compared, message by message (role, content, tool calls by
   name and parsed arguments, reasoning; ids and names are not compared: the templates do not render
   them), with the ledger's: the client's view of the conversation so far, including the replies the
   endpoint returned. When they extend it, only the new messages (tool results, user turns) are
   rendered, as a delta after the last turn: the token ids of earlier turns are the ones already
   recorded, never re-tokenized. This is the runner's own observation step, so the roles, the loss
   mask, tool-output truncation and ``rollout.history`` (thinking templates) are a native episode's.
2. **Drift.** Otherwise the client edited, dropped or re-ordered history. The difference is classified
   with ``agentrl doctor``'s classes (the first region where the template's renders of the two
   histories differ), recorded in ``metrics["drift"]``, and handled per ``proxy.on_drift``: ``split``
   starts a new sample prompted with the client's history, ``fail`` fails the episode (boundary
   ``agent``) and answers with an error, ``retokenize`` re-renders the client's history into the
   current sample, keeping the policy's tokens (role, log-prob, version) where they survive unchanged.
3. **Generate** with the run's sampling settings, the turn's seed and budgets, and the request's own
   ``max_tokens`` and ``stop`` within them; its ``reasoning_effort`` sets the template's
   ``enable_thinking`` for the turn's generation prompt (``template_kwargs``), recorded in
   ``metrics["reasoning_effort"]``.
4. **Answer** with the reply as OpenAI ``content`` and ``tool_calls`` (parsed in the template's tool-call
   format, or the system message's when the tools went there: ``rollout.tools_prompt``, or a template
   that cannot render tool calls, such as SmolLM2's; ``tool_choice: "none"`` shows no tools), the sampled tokens' log-probs when asked, and an ``agentrl`` block: the episode key, the
   turn, the weight version and the token ids.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import inspect
import json
import logging
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.agents import AgentEnvironment
from agentrl.engines.base import Completion, Engine, SamplingParams
from agentrl.env import Environment
from agentrl.episode import Episode, Segment
from agentrl.models.chat import ChatRenderer, reads_enable_thinking
from agentrl.models.chat_templates import tool_call_format
from agentrl.rollout.async_runner import RequestBatcher
from agentrl.rollout.drift import drift_kind, rebase
from agentrl.rollout.runner import (
    EpisodeRequest,
    EpisodeRunner,
    LiveEpisode,
    RunnerSettings,
    close_quietly,
    jsonable,
)
from agentrl.serve.openai_api import OpenAIServer
from agentrl.serve.openai_request import APIError, ChatRequest, ChatResult
from agentrl.timeouts import DaemonThreads, LoopThread, call_with_timeout, wait_for
from agentrl.tools import format_tool_call, parse_tool_calls, strip_tool_calls

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


@dataclass
class _Ledger(LiveEpisode):
    """One episode's record on the endpoint: the runner's book-keeping plus the client's view."""

    key: str = ""
    seen: list[Any] = field(default_factory=list)
    """The canonical form of every message the ledger covers (``canonical``)."""
    tools_key: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)
    busy: bool = False
    closed: bool = False
    """Finished and scored: a turn still running when it was finished is not recorded."""
    agent_done: bool = False
    """The agent's ``run`` has returned (or raised): no more requests will come."""
    last_turn: bool = False
    """The turn budget is spent: a further request ends the episode (``max_turns``)."""
    calls: int = 0

    @classmethod
    def start(cls, req: EpisodeRequest, key: str | None) -> _Ledger:
        """A new episode's ledger under ``key``; by default the episode id plus 96 random bits (the key
        is the endpoint's only credential)."""
        ep = req.new_episode()
        task = req.task
        ep.metrics["task"] = {"id": task.id, "prompt": task.prompt, "answer": jsonable(task.answer),
                              "metadata": jsonable(dict(task.metadata))}  # fmt: skip
        return cls(ep, None, None, key=key or f"{ep.id}-{uuid.uuid4().hex[:24]}")


def for_template(msg: dict[str, Any]) -> dict[str, Any]:
    """A message as chat templates expect it: tool-call arguments as objects, not JSON text (stock
    templates apply ``tojson`` to them, which would encode a string twice)."""
    calls = msg.get("tool_calls")
    if not calls:
        return dict(msg)
    out = []
    for c in calls:
        fn = dict(c.get("function", c))
        if isinstance(fn.get("arguments"), str):
            with contextlib.suppress(json.JSONDecodeError):
                fn["arguments"] = json.loads(fn["arguments"])
        out.append({**c, "function": fn})
    return {**msg, "tool_calls": out}


def calls_as_text(msg: dict[str, Any]) -> dict[str, Any]:
    """An assistant message with its tool calls appended to its content as ``json``-format text (what
    the policy wrote), for a template that drops ``tool_calls`` (SmolLM2's ChatML)."""
    calls = msg.get("tool_calls")
    if not calls:
        return msg
    text = "".join(
        format_tool_call(fn.get("name", ""), fn.get("arguments") or {})
        for fn in (c.get("function", c) for c in calls)
    )
    content = str(msg.get("content") or "")
    return {k: v for k, v in msg.items() if k != "tool_calls"} | {"content": content + text}


def as_shown(messages: list[dict[str, Any]], template_format: str | None) -> list[dict[str, Any]]:
    """``messages`` as the template gets them: unchanged when it renders tool calls (it has a
    ``template_format``), else with each assistant's calls written as text (``calls_as_text``)."""
    return messages if template_format is not None else [calls_as_text(m) for m in messages]


def canonical(msg: dict[str, Any]) -> tuple:
    """What two messages must share to render the same: role, content, tool calls (name and parsed
    arguments) and reasoning. Tool-call ids and names are left out: the templates do not render them."""
    calls = []
    for c in msg.get("tool_calls") or ():
        fn = c.get("function", c)
        args = fn.get("arguments")
        if isinstance(args, str):
            with contextlib.suppress(json.JSONDecodeError):
                args = json.loads(args)
        calls.append((fn.get("name"), json.dumps(args, sort_keys=True)))
    return (msg.get("role"), msg.get("content") or "", tuple(calls), msg.get("reasoning_content") or None)


class AgentRunner(EpisodeRunner):
    """Runs ``AgentEnvironment`` episodes: each agent's ``run(client, task)`` calls the endpoint, which
    records its episode. ``agentrl serve``'s backend is a subclass (``cli/serve.py``: ``ServedRunner``).

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
        super().__init__(engine, tokenizer, env_factory, settings)
        endpoint = endpoint or Endpoint()
        if endpoint.on_drift not in ON_DRIFT:
            raise ValueError(f"proxy.on_drift is {endpoint.on_drift!r}; valid: {', '.join(ON_DRIFT)}")
        self.on_drift, self.agent_timeout_s = endpoint.on_drift, self.settings.agent_timeout_s
        self.max_concurrent_episodes, self.model_name = (
            self.settings.max_concurrent_episodes,
            endpoint.model_name,
        )
        self.tool_format, self.tools_placement, self.text_format = tool_prompting(tokenizer, self.tools_prompt)  # fmt: skip
        self.enable_thinking = reads_enable_thinking(tokenizer)  # can reasoning_effort be honoured?
        self._ledgers: dict[str, _Ledger] = {}
        self._lock = threading.Lock()
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
    def open(self, req: EpisodeRequest, key: str | None = None) -> _Ledger:
        """Start recording an episode under ``key`` (default: the episode's id)."""
        lv = _Ledger.start(req, key)
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
            self._fail(lv, "env", e)
        with self._lock:
            taken = lv.key in self._ledgers
            if not taken:
                self._ledgers[lv.key] = lv
        if taken:
            if lv.env is not None:
                lv.env.close()
            raise ValueError(f"episode key {lv.key!r} is already open")
        return lv

    def pop(self, key: str) -> _Ledger:
        with self._lock:
            return self._ledgers.pop(key)

    def run(self, requests: Sequence[EpisodeRequest]) -> list[Episode]:
        """Run one agent per request, concurrently, and return their episodes in request order.

        The agents run on an event loop in a daemon thread of their own; an in-process engine
        generates here, in the thread that trains. If this thread is interrupted (a second Ctrl-C),
        the run stops at once: see ``_abort``."""
        if self._batcher is not None:
            self._batcher.resume()
        lives: list[_Ledger] = []
        try:
            for r in requests:
                lives.append(self.open(r))
        except BaseException:
            self._discard(lives)
            raise
        agents = LoopThread(
            run_agents(
                lives, self.url, self.max_concurrent_episodes, self.request_timeout_s, self.agent_timeout_s
            )
        )
        # each agent is cancelled at agent_run_s, so the loop ends within a round of that per
        # max_concurrent agents, unless an agent blocks it (a blocking call in a coroutine): one
        # more round of slack, then every episode fails instead of the run waiting forever
        rounds = -(-len(lives) // max(1, self.max_concurrent_episodes)) + 1
        deadline = time.monotonic() + rounds * self.agent_timeout_s
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
            error = loop_blocked(lives, agents, rounds * self.agent_timeout_s, self.agent_timeout_s, self.max_concurrent_episodes)  # fmt: skip
            for lv in lives:
                if not lv.episode.failed:
                    self._fail(lv, "agent", error)
            outcomes = [error] * len(lives)
        except BaseException:
            self._abort(lives, agents)
            raise
        episodes = []
        for lv, outcome in zip(lives, outcomes):
            self.pop(lv.key)
            episodes.append(self.finish_episode(lv, outcome))
        return episodes

    def _abort(self, lives: list[_Ledger], agents: LoopThread, grace_s: float = 5.0) -> None:
        """Stop a run whose driving thread was interrupted: its episodes take no more turns (their
        requests get ``agentrl_episode_ended``), queued and later generations fail, the agents are
        cancelled and get up to ``grace_s`` to return, and the environments are closed. The
        episodes are dropped, like a lockstep rollout interrupted mid-step (the run resumes from a
        checkpoint)."""
        try:
            for lv in lives:
                with lv.lock:
                    lv.closed = True
            if self._batcher is not None:
                self._batcher.stop(RuntimeError("the run was interrupted"))
            if not agents.cancel(grace_s):
                logger.warning("interrupted run: agents still running after %.0f s are abandoned", grace_s)
        finally:
            self._discard(lives)

    def _discard(self, lives: list[_Ledger]) -> None:
        """Forget these episodes: drop their ledgers (a later request gets 404) and close their
        environments."""
        with self._lock:
            for lv in lives:
                self._ledgers.pop(lv.key, None)
        close_quietly(lives)

    def finish_episode(self, lv: _Ledger, outcome: Any) -> Episode:
        """The episode of a ledger whose agent returned ``outcome`` (a reward, None, or an exception)."""
        with lv.lock:
            lv.closed = True
        ep = lv.episode
        if isinstance(outcome, BaseException):
            if isinstance(outcome, (asyncio.TimeoutError, TimeoutError)) and not ep.failed:
                message = f"AgentEnvironment.run did not return within timeouts.agent_run_s={self.agent_timeout_s:g}s"
                self._fail(lv, "agent", TimeoutError(message))
            elif not ep.failed and ep.stop_reason not in ("token_budget", "max_turns"):
                self._fail(lv, "agent", outcome)
            elif not ep.failed:  # the agent stopped on the endpoint's budget error: not a failure
                ep.metrics["agent_error"] = "".join(traceback.format_exception_only(type(outcome), outcome))
        elif outcome is not None and not ep.failed:
            try:
                lv.step_reward = float(outcome)
            except (TypeError, ValueError):
                self._fail(
                    lv, "reward", TypeError(f"AgentEnvironment.run returned {outcome!r}, not a number")
                )
        if not ep.failed and outcome is None and lv.env is not None and not declares_rewards(self, lv):
            self._fail(lv, "reward", ValueError("AgentEnvironment.run returned None and the environment has no rewards()"))  # fmt: skip
        if ep.stop_reason is None:
            ep.stop_reason = "answered"
        lv.done = True
        ep.metrics["tool_calls"] = lv.calls
        self._finish(lv)
        if not ep.failed and isinstance(outcome, (int, float)):
            ep.reward_components.setdefault(self.step_reward_name, float(outcome))  # a 0 is a reward too
        return ep

    # -- the endpoint's backend (agentrl.serve.openai_request.ChatBackend) --------------------------
    def chat(self, request: ChatRequest) -> ChatResult:
        lv = self._ledger(request.key)
        with lv.lock:
            if lv.closed:
                raise APIError(400, f"episode {lv.key!r} is finished; no more turns are served", code="agentrl_episode_ended")  # fmt: skip
            if lv.busy:
                raise APIError(409, f"a request for episode {lv.key!r} is already running; an episode's turns are sequential", code="agentrl_episode_busy")  # fmt: skip
            lv.busy = True
        try:
            return self._serve(lv, request)
        except APIError:
            raise
        except Exception as e:  # the client's history could not be rendered: the episode is over
            self._fail(lv, "agent", e)
            raise
        finally:
            with lv.lock:
                lv.busy = False

    def _ledger(self, key: str) -> _Ledger:
        with self._lock:
            lv = self._ledgers.get(key)
        if lv is None:
            raise APIError(404, f"no episode is open under the key {key!r} (the API key or X-Episode-Key header)", code="agentrl_unknown_episode")  # fmt: skip
        return lv

    def _serve(self, lv: _Ledger, req: ChatRequest) -> ChatResult:
        ep = lv.episode
        if lv.last_turn and not lv.done:
            self._stop(lv, "max_turns")
        if lv.done:
            why = (
                f"failed at the {ep.failure.boundary} boundary" if ep.failure else f"ended ({ep.stop_reason})"
            )
            raise APIError(400, f"episode {lv.key!r} has {why}; no more turns are served", code="agentrl_episode_ended")  # fmt: skip
        check_sampling(req, self.sampling)
        thinking = template_kwargs(req.reasoning_effort, self.enable_thinking)
        tools = req.tools if req.tool_choice != "none" else None  # "none": the prompt shows no tools
        messages = [for_template(m) for m in req.messages]
        tools_key = json.dumps(tools, sort_keys=True)
        seen = [canonical(m) for m in messages]
        if lv.renderer is None:  # the first turn: the prompt
            lv.renderer, shown = self._prompt(tools, messages, thinking)
            lv.tools_key = tools_key
            record_tools(ep, tools, lv.renderer)
            prompt = lv.renderer.render_prompt(shown)
            ep.add(Segment("prompt", 0, prompt.token_ids, prompt.text))
            self.history.record(ep)
            lv.messages, lv.seen = shown, seen
        elif tools_key == lv.tools_key and seen[: len(lv.seen)] == lv.seen and len(seen) > len(lv.seen):
            lv.turn += 1
            new = as_shown(messages[len(lv.seen) :], self.tool_format)
            lv.renderer = lv.renderer.with_template_kwargs(thinking)  # this turn's generation prompt
            self._append_observation(lv, new)  # lv.messages gets them as shown
            lv.seen = seen
        else:
            drift(self, lv, messages, tools, tools_key, thinking)
        if req.reasoning_effort is not None:
            ep.metrics.setdefault("reasoning_effort", []).append({"turn": lv.turn, "effort": req.reasoning_effort, **thinking})  # fmt: skip
        if lv.length >= self.budgets.max_episode_tokens:
            self._stop(lv, "token_budget")
            raise APIError(400, f"episode {lv.key!r} has used its rollout.max_episode_tokens={self.budgets.max_episode_tokens} tokens", code="agentrl_episode_ended")  # fmt: skip
        prompt_len = len(ep.context_ids())
        comp = self._complete(lv, req)
        if lv.closed:  # finished (timed out, /finish) while this turn generated: nothing to record
            raise APIError(400, f"episode {lv.key!r} was finished during this turn", code="agentrl_episode_ended")  # fmt: skip
        self._append_policy(lv, comp)
        if lv.done and ep.failed:
            raise APIError(500, f"the engine failed: {ep.failure.message}", type="server_error", code="agentrl_engine_failed")  # fmt: skip
        # tool_choice "none": no tools shown, none parsed; no tools: the template's own format, if any
        fmt = self.text_format if tools else (self.tool_format if req.tool_choice != "none" else None)
        result = reply(lv, comp, prompt_len, req.logprobs, fmt, self.tokenizer, self.budgets.max_turns)
        lv.messages[-1] = as_shown(lv.messages[-1:], self.tool_format)[0]
        return result

    def _prompt(self, tools: list[dict] | None, messages: list[dict], thinking: dict) -> tuple[ChatRenderer, list[dict]]:  # fmt: skip
        """The renderer for ``tools`` and ``messages`` as it gets them (training's ``prompt_messages``)."""
        renderer = self._renderer(tools, self.text_format, self.tools_placement)
        return renderer.with_template_kwargs(thinking), renderer.prompt_messages(as_shown(messages, self.tool_format))  # fmt: skip

    def _complete(self, lv: _Ledger, req: ChatRequest) -> Completion:
        params = self._sampling_for(lv)
        max_tokens = min(params.max_tokens, req.max_tokens or params.max_tokens)
        params = dataclasses.replace(params, max_tokens=max_tokens, stop=(*params.stop, *req.stop))
        what = f"engine {type(self.engine).__name__}: generate for episode {lv.episode.id} (turn {lv.turn})"
        try:
            fut = self._submit(lv.episode.context_ids(), params)
            return wait_for(fut, self.request_timeout_s, what, f"timeouts.engine_request_s={self.request_timeout_s:g}s")  # fmt: skip
        except Exception as e:
            self._fail(lv, "model", e)
            raise APIError(500, f"the engine failed: {type(e).__name__}: {e}", type="server_error", code="agentrl_engine_failed") from e  # fmt: skip


def drift(runner: AgentRunner, lv: _Ledger, messages: list[dict], tools: list[dict] | None, tools_key: str, thinking: dict) -> None:  # fmt: skip
    """The client's history does not extend the ledger: classify, record, act per ``on_drift``
    (the new sample rendered with the request's ``thinking`` template arguments)."""
    ep, on_drift = lv.episode, runner.on_drift
    renderer, shown = runner._prompt(tools, messages, thinking)
    at, kind = drift_at(runner.tokenizer, lv, messages, renderer, shown)
    record = {"turn": lv.turn, "message": at, "kind": kind, "action": on_drift}
    ep.metrics.setdefault("drift", []).append(record)
    if on_drift == "fail":
        message = f"history drift ({kind}) at message {at}: the request's history does not extend what the endpoint recorded for episode {lv.key!r} (proxy.on_drift: fail)"  # fmt: skip
        runner._fail(lv, "agent", RuntimeError(message))
        raise APIError(400, message, param=f"messages[{at}]", code="agentrl_history_drift")
    lv.turn += 1
    old_tools = ep.metrics.get("tools") or []  # templates treat [] as no tools
    tools_before = old_tools if tools_key != lv.tools_key else None
    record.update(rebase(ep, on_drift, kind, renderer, shown, lv.turn, lv.messages, tools_before, runner.tokenizer))  # fmt: skip
    lv.renderer, lv.tools_key = renderer, tools_key
    lv.messages, lv.seen = shown, [canonical(m) for m in messages]
    record_tools(ep, tools, renderer)


def declares_rewards(runner: AgentRunner, lv: _Ledger) -> bool:
    """Whether the episode's environment lists reward functions. ``rewards()`` is user code, bounded like
    the rest (``timeouts.env_step_s``): a listing that raises or never returns fails the episode at the
    ``reward`` boundary (True then, so that failure is the one recorded)."""
    env = lv.env
    assert env is not None
    try:
        return bool(runner._bounded(env.rewards, env, "rewards"))
    except Exception as e:
        runner._fail(lv, "reward", e)
        return True


def loop_blocked(lives: list[_Ledger], agents: LoopThread, waited_s: float, agent_s: float, at_once: int) -> TimeoutError:  # fmt: skip
    """The agents' loop did not end in time: an agent blocked it (``AgentEnvironment.run`` is a
    coroutine that made a blocking call), so no agent's own limit could fire. The episodes take no
    more turns, the loop's thread is abandoned (a daemon: it cannot keep the process alive), and the
    error every episode of the batch fails with at the ``agent`` boundary is returned."""
    for lv in lives:
        with lv.lock:
            lv.closed = True  # a request the loop makes later gets agentrl_episode_ended
    agents.abandon()
    return TimeoutError(
        f"the agents' event loop did not return within {waited_s:g}s (timeouts.agent_run_s={agent_s:g}s "
        f"per agent, {at_once} at once): an async AgentEnvironment.run made a blocking call (a tool, "
        "time.sleep, a synchronous client), which holds every agent; run blocking work in a thread "
        "(await asyncio.to_thread(...))"
    )


def tool_prompting(tokenizer: Any, tools_prompt: str) -> tuple[str | None, str, str]:
    """The template's own tool-call format (None: it cannot render tool calls, as SmolLM2's ChatML),
    where a request's tools go (``ChatRenderer``'s ``tools_prompt``: ``rollout.tools_prompt``, or the
    system message when the template cannot carry calls, as in training), and the format the calls
    are parsed from the policy's text in."""
    try:
        fmt: str | None = tool_call_format(tokenizer)
    except ValueError:
        fmt = None
    return fmt, "system" if fmt is None else tools_prompt, fmt or "json"


def record_tools(ep: Episode, tools: list[dict] | None, renderer: ChatRenderer) -> None:
    """The request's tools on the episode, and where the prompt shows them (``metrics.tools_prompt``,
    as a native episode records it: the doctor renders the history with them only for ``template``)."""
    ep.metrics["tools"] = tools
    if tools:
        ep.metrics["tools_prompt"] = "system" if renderer.tools_text else "template"


def drift_at(tokenizer: Any, lv: _Ledger, messages: list[dict], renderer: ChatRenderer, shown: list[dict]) -> tuple[int, str]:  # fmt: skip
    """The first message where a client's history departs from the ledger's, and the class of the
    difference (``drift_kind``; each side rendered with its own tools, None where they are written
    into the system message)."""
    at = next(
        (i for i, (a, b) in enumerate(zip(lv.seen, map(canonical, messages))) if a != b),
        min(len(lv.seen), len(messages)),
    )
    ours = lv.renderer.tools if lv.renderer is not None else None
    return at, drift_kind(tokenizer, lv.messages, ours, shown, renderer.tools)


def check_sampling(req: ChatRequest, sampling: SamplingParams) -> None:
    """The run's sampling settings are the policy's: a request may repeat them, not change them."""
    run = {"temperature": sampling.temperature, "top_p": sampling.top_p}
    for name, value in (("temperature", req.temperature), ("top_p", req.top_p)):
        if value is not None and abs(value - run[name]) > 1e-9:
            raise APIError(400, f"{name}={value} differs from this run's rollout.{name}={run[name]:g}: the trainer's loss assumes the rollout's sampling distribution; leave {name} out or set rollout.{name}", param=name, code="agentrl_sampling_fixed")  # fmt: skip
    if req.seed is not None:
        raise APIError(400, "seed is set by agentrl per episode and turn (from run.seed); leave it out", param="seed", code="agentrl_sampling_fixed")  # fmt: skip
    if req.top_logprobs:
        raise APIError(400, "top_logprobs are not recorded; only the sampled tokens' logprobs (logprobs: true)", param="top_logprobs")  # fmt: skip


def template_kwargs(effort: str | None, enable_thinking: bool) -> dict[str, Any]:
    """The chat-template arguments of a request's ``reasoning_effort``: ``enable_thinking`` false for
    "none" and true for any other value (the template has an on/off switch, not levels). Without the
    switch nothing can honour it: refused as OpenAI refuses it for a model without reasoning."""
    if effort is None:
        return {}
    if not enable_thinking:
        raise APIError(400, "Unsupported parameter: 'reasoning_effort' is not supported with this model: its chat template has no enable_thinking switch; leave reasoning_effort out.", param="reasoning_effort", code="unsupported_parameter")  # fmt: skip
    return {"enable_thinking": effort != "none"}


def reply(
    lv: _Ledger,
    comp: Completion,
    prompt_len: int,
    logprobs: bool,
    tool_format: str | None,
    tokenizer: Any,
    max_turns: int,
) -> ChatResult:
    """The completion as OpenAI's message, and the ledger's record of it (the client's view)."""
    text = lv.final_text or ""
    fmt = tool_format
    calls = [c for c in parse_tool_calls(text, fmt) if c.error is None and c.name] if fmt else []
    tool_calls = [
        {
            "id": f"call_{lv.turn}_{i}",
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)},
        }
        for i, c in enumerate(calls)
    ]
    content = strip_tool_calls(text, fmt) if fmt and tool_calls else text
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    lv.messages[-1] = for_template(message)  # _append_policy recorded the raw text; the client sees this
    lv.seen.append(canonical(message))
    lv.final_text, lv.calls = content, lv.calls + len(tool_calls)
    if lv.turn + 1 >= min(max_turns, lv.env.max_turns if lv.env else max_turns):
        lv.last_turn = True
    finish = "tool_calls" if tool_calls else ("length" if comp.finish_reason == "length" else "stop")
    return ChatResult(
        content=content if content or not tool_calls else None,
        tool_calls=tool_calls,
        finish_reason=finish,
        completion_tokens=[tokenizer.decode([t], skip_special_tokens=False) for t in comp.token_ids]
        if logprobs
        else [],
        logprobs=list(comp.logprobs),
        prompt_tokens=prompt_len,
        extra={
            "episode": lv.key,
            "turn": lv.turn,
            "sample": lv.episode.num_samples - 1,
            "weight_version": comp.weight_version,
            "token_ids": list(comp.token_ids),
        },
    )


async def run_agents(
    lives: list[_Ledger], url: str, max_concurrent: int, request_timeout_s: float, agent_timeout_s: float
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

        async def one(lv: _Ledger) -> Any:
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
