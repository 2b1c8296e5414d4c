"""One agent episode's ledger on the endpoint: the runner's record of the episode plus the client's
view of it (every message it was shown, in ``canonical`` form), and the episode's failure bookkeeping.

``AgentRunner`` keeps one ``Ledger`` per open episode, keyed by the request's episode key. A request
either extends the ledger (``extends``) or drifts from it (``drift``: classified, recorded and acted
on per ``proxy.on_drift``); each reply is recorded as the client sees it (``record_reply``), and the
agent's outcome ends it (``record_outcome``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentrl.models.chat import ChatRenderer
from agentrl.rollout.drift import drift_kind, rebase
from agentrl.rollout.runner import EpisodeRequest, jsonable
from agentrl.rollout.turns import LiveEpisode
from agentrl.serve.openai_errors import APIError
from agentrl.tools import format_tool_call, parse_tool_calls, strip_tool_calls


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
    reasoning = msg.get("reasoning_content") or None
    return (msg.get("role"), msg.get("content") or "", tuple(calls), reasoning)


def tools_key(tools: list[dict] | None) -> str:
    """The identity of a request's tools: two requests show the same tools when their keys match."""
    return json.dumps(tools, sort_keys=True)


@dataclass(frozen=True)
class Fresh:
    """A client's history rendered afresh: the renderer for its tools and the messages as shown."""

    renderer: ChatRenderer
    shown: list[dict[str, Any]]


@dataclass
class Ledger(LiveEpisode):
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
    def start(cls, req: EpisodeRequest, key: str | None) -> Ledger:
        """A new episode's ledger under ``key``; by default the episode id plus 96 random bits (the key
        is the endpoint's only credential)."""
        ep = req.new_episode()
        task = req.task
        ep.metrics["task"] = {
            "id": task.id,
            "prompt": task.prompt,
            "answer": jsonable(task.answer),
            "metadata": jsonable(dict(task.metadata)),
        }
        return cls(ep, None, None, key=key or f"{ep.id}-{uuid.uuid4().hex[:24]}")

    def end_turns(self) -> None:
        """Serve no more turns: a request still running or made later gets ``agentrl_episode_ended``."""
        with self.lock:
            self.closed = True

    def extends(self, seen: list[Any], tools: list[dict] | None) -> bool:
        """Whether a request's history (``seen``, canonical) with ``tools`` adds messages to the ledger's."""
        n = len(self.seen)
        return tools_key(tools) == self.tools_key and seen[:n] == self.seen and len(seen) > n

    def record_tools(self, tools: list[dict] | None, renderer: ChatRenderer) -> None:
        """The request's tools on the episode, and where the prompt shows them (``metrics.tools_prompt``,
        as a native episode records it: the doctor renders the history with them only for ``template``)."""
        self.tools_key = tools_key(tools)
        self.episode.metrics["tools"] = tools
        if tools:
            self.episode.metrics["tools_prompt"] = "system" if renderer.tools_text else "template"

    def drift(
        self, messages: list[dict], tools: list[dict] | None, fresh: Fresh, on_drift: str, tokenizer: Any
    ) -> None:
        """The client's history (``messages``, rendered afresh as ``fresh``) does not extend the ledger:
        classify, record in ``metrics["drift"]`` and act per ``on_drift`` (``proxy.on_drift``)."""
        ep = self.episode
        at, kind = self.drift_at(tokenizer, messages, fresh)
        record = {"turn": self.turn, "message": at, "kind": kind, "action": on_drift}
        ep.metrics.setdefault("drift", []).append(record)
        if on_drift == "fail":
            message = (
                f"history drift ({kind}) at message {at}: the request's history does not extend what the "
                f"endpoint recorded for episode {self.key!r} (proxy.on_drift: fail)"
            )
            self.fail("agent", RuntimeError(message))
            raise APIError(400, message, param=f"messages[{at}]", code="agentrl_history_drift")
        self.turn += 1
        old_tools = ep.metrics.get("tools") or []  # templates treat [] as no tools
        tools_before = old_tools if tools_key(tools) != self.tools_key else None
        renderer, shown = fresh.renderer, fresh.shown
        how = rebase(ep, on_drift, kind, renderer, shown, self.turn, self.messages, tools_before, tokenizer)
        record.update(how)
        self.renderer, self.messages, self.seen = renderer, shown, [canonical(m) for m in messages]
        self.record_tools(tools, renderer)

    def drift_at(self, tokenizer: Any, messages: list[dict], fresh: Fresh) -> tuple[int, str]:
        """The first message where a client's history departs from the ledger's, and the class of the
        difference (``drift_kind``; each side rendered with its own tools, None where they are written
        into the system message)."""
        at = next(
            (i for i, (a, b) in enumerate(zip(self.seen, map(canonical, messages))) if a != b),
            min(len(self.seen), len(messages)),
        )
        ours = self.renderer.tools if self.renderer is not None else None
        return at, drift_kind(tokenizer, self.messages, ours, fresh.shown, fresh.renderer.tools)

    def record_reply(
        self, parse_format: str | None, shown_format: str | None, max_turns: int
    ) -> dict[str, Any]:
        """The policy's last turn as OpenAI's assistant message (its tool calls parsed in
        ``parse_format``), recorded as the client sees it and as the template is shown it
        (``as_shown`` with ``shown_format``); the turn budget ``max_turns`` may now be spent."""
        text = self.final_text or ""
        fmt = parse_format
        calls = [c for c in parse_tool_calls(text, fmt) if c.error is None and c.name] if fmt else []
        tool_calls = [
            {
                "id": f"call_{self.turn}_{i}",
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)},
            }
            for i, c in enumerate(calls)
        ]
        content = strip_tool_calls(text, fmt) if fmt and tool_calls else text
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if tool_calls:
            message["tool_calls"] = tool_calls
        # _append_policy recorded the raw text; the client sees this
        self.messages[-1] = as_shown([for_template(message)], shown_format)[0]
        self.seen.append(canonical(message))
        self.final_text, self.calls = content, self.calls + len(tool_calls)
        if self.turn + 1 >= min(max_turns, self.env.max_turns if self.env else max_turns):
            self.last_turn = True
        return message

    def record_outcome(self, outcome: Any, agent_timeout_s: float, rewards: Callable[[], Any]) -> None:
        """What the agent's ``run`` returned (a reward, None, or an exception) on the episode: a
        failure at the ``agent`` or ``reward`` boundary, or its step reward. ``rewards`` lists the
        environment's reward functions, bounded as user code (``timeouts.env_step_s``)."""
        ep = self.episode
        if isinstance(outcome, BaseException):
            self.record_agent_error(outcome, agent_timeout_s)
        elif outcome is not None and not ep.failed:
            try:
                self.step_reward = float(outcome)
            except (TypeError, ValueError):
                self.fail("reward", TypeError(f"AgentEnvironment.run returned {outcome!r}, not a number"))
        if not ep.failed and outcome is None and self.env is not None and not self.lists_rewards(rewards):
            why = "AgentEnvironment.run returned None and the environment has no rewards()"
            self.fail("reward", ValueError(why))

    def record_agent_error(self, error: BaseException, agent_timeout_s: float) -> None:
        """The agent raised ``error`` (or timed out): a failure at the ``agent`` boundary, unless it
        stopped on the endpoint's budget error, which is recorded in ``metrics.agent_error``."""
        ep = self.episode
        if ep.failed:
            return
        if isinstance(error, (asyncio.TimeoutError, TimeoutError)):
            limit = f"timeouts.agent_run_s={agent_timeout_s:g}s"
            self.fail("agent", TimeoutError(f"AgentEnvironment.run did not return within {limit}"))
        elif ep.stop_reason not in ("token_budget", "max_turns"):
            self.fail("agent", error)
        else:  # the agent stopped on the endpoint's budget error: not a failure
            ep.metrics["agent_error"] = "".join(traceback.format_exception_only(type(error), error))

    def lists_rewards(self, rewards: Callable[[], Any]) -> bool:
        """Whether the environment lists reward functions (``rewards``: its bounded ``rewards()``). A
        listing that raises or never returns fails the episode at the ``reward`` boundary (True then,
        so that failure is the one recorded)."""
        try:
            return bool(rewards())
        except Exception as e:
            self.fail("reward", e)
            return True
