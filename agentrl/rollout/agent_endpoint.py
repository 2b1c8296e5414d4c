"""The endpoint's backend (``agentrl.serve.openai_request.ChatBackend``): each OpenAI chat-completion
request is served as a turn of the episode open under its key (its ``agent_ledger.Ledger``), in four
moves:

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
   that cannot render tool calls, such as SmolLM2's; ``tool_choice: "none"`` shows no tools), the
   sampled tokens' log-probs when asked, and an ``agentrl`` block: the episode key, the turn, the weight
   version and the token ids.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
from collections.abc import Callable
from typing import Any

from agentrl.engines.base import Completion, Engine, SamplingParams
from agentrl.env import Environment
from agentrl.episode import Episode, Segment
from agentrl.models.chat import reads_enable_thinking
from agentrl.models.chat_templates import tool_call_format
from agentrl.rollout.agent_ledger import Fresh, Ledger, as_shown, canonical, for_template
from agentrl.rollout.runner import EpisodeRunner, RunnerSettings
from agentrl.serve.openai_errors import APIError
from agentrl.serve.openai_request import ChatRequest, ChatResult
from agentrl.timeouts import wait_for


class AgentEndpoint(EpisodeRunner):
    """Serves chat-completion requests as turns of the episodes open under their keys (``_ledgers``),
    with the run's engine, template and sampling settings; ``AgentRunner`` opens the episodes and
    runs the agents that send the requests."""

    _submit: Callable[[list[int], SamplingParams], concurrent.futures.Future]
    """Queues one generation: the engine's own ``submit``, or the runner's batcher's."""

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        env_factory: Callable[[], Environment],
        settings: RunnerSettings | None = None,
        on_drift: str = "split",
    ) -> None:
        super().__init__(engine, tokenizer, env_factory, settings)
        self.on_drift = on_drift
        self.tool_format, self.tools_placement, self.text_format = tool_prompting(
            tokenizer, self.tools_prompt
        )
        self.enable_thinking = reads_enable_thinking(tokenizer)  # can reasoning_effort be honoured?
        self._ledgers: dict[str, Ledger] = {}
        self._lock = threading.Lock()

    def chat(self, request: ChatRequest) -> ChatResult:
        lv = self._ledger(request.key)
        with lv.lock:
            if lv.closed:
                raise ended(lv, "is finished; no more turns are served")
            if lv.busy:
                message = (
                    f"a request for episode {lv.key!r} is already running; an episode's turns are sequential"
                )
                raise APIError(409, message, code="agentrl_episode_busy")
            lv.busy = True
        try:
            return self._serve(lv, request)
        except APIError:
            raise
        except Exception as e:  # the client's history could not be rendered: the episode is over
            lv.fail("agent", e)
            raise
        finally:
            with lv.lock:
                lv.busy = False

    def _ledger(self, key: str) -> Ledger:
        with self._lock:
            lv = self._ledgers.get(key)
        if lv is None:
            where = "the API key or X-Episode-Key header"
            raise APIError(
                404, f"no episode is open under the key {key!r} ({where})", code="agentrl_unknown_episode"
            )
        return lv

    def _serve(self, lv: Ledger, req: ChatRequest) -> ChatResult:
        """One turn: extend the ledger with the request's history (or handle its drift), generate,
        and answer (the module's four moves)."""
        ep = lv.episode
        if lv.last_turn and not lv.done:
            lv.stop("max_turns")
        if lv.done:
            raise ended(lv, f"has {ended_how(ep)}; no more turns are served")
        check_sampling(req, self.sampling)
        thinking = template_kwargs(req.reasoning_effort, self.enable_thinking)
        self._extend(lv, req, thinking)
        if req.reasoning_effort is not None:
            efforts = ep.metrics.setdefault("reasoning_effort", [])
            efforts.append({"turn": lv.turn, "effort": req.reasoning_effort, **thinking})
        if lv.length >= self.budgets.max_episode_tokens:
            lv.stop("token_budget")
            raise ended(
                lv, f"has used its rollout.max_episode_tokens={self.budgets.max_episode_tokens} tokens"
            )
        prompt_len = len(ep.context_ids())
        comp = self._complete(lv, req)
        if lv.closed:  # finished (timed out, /finish) while this turn generated: nothing to record
            raise ended(lv, "was finished during this turn")
        self._append_policy(lv, comp)
        if lv.done and ep.failed:
            raise engine_failed(f"the engine failed: {ep.failure.message}")
        # tool_choice "none": no tools shown, none parsed; no tools: the template's own format, if any
        fmt = None if req.tool_choice == "none" else (self.text_format if req.tools else self.tool_format)
        message = lv.record_reply(fmt, self.tool_format, self.budgets.max_turns)
        decode = self.tokenizer.decode
        tokens = [decode([t], skip_special_tokens=False) for t in comp.token_ids] if req.logprobs else []
        return chat_result(lv, message, comp, prompt_len, tokens)

    def _extend(self, lv: Ledger, req: ChatRequest, thinking: dict) -> None:
        """Bring the ledger up to the request's history: the prompt on the first turn, the new
        messages as an observation when the history extends it, else its drift (``on_drift``)."""
        tools = req.tools if req.tool_choice != "none" else None  # "none": the prompt shows no tools
        messages = [for_template(m) for m in req.messages]
        seen = [canonical(m) for m in messages]
        if lv.renderer is None:  # the first turn: the prompt
            fresh = self._prompt(tools, messages, thinking)
            lv.renderer = fresh.renderer
            lv.record_tools(tools, fresh.renderer)
            prompt = fresh.renderer.render_prompt(fresh.shown)
            lv.episode.add(Segment("prompt", 0, prompt.token_ids, prompt.text))
            self.history.record(lv.episode)
            lv.messages, lv.seen = fresh.shown, seen
        elif lv.extends(seen, tools):
            lv.turn += 1
            new = as_shown(messages[len(lv.seen) :], self.tool_format)
            lv.renderer = lv.renderer.with_template_kwargs(thinking)  # this turn's generation prompt
            self._append_observation(lv, new)  # lv.messages gets them as shown
            lv.seen = seen
        else:
            fresh = self._prompt(tools, messages, thinking)
            lv.drift(messages, tools, fresh, self.on_drift, self.tokenizer)

    def _prompt(self, tools: list[dict] | None, messages: list[dict], thinking: dict) -> Fresh:
        """The renderer for ``tools`` and ``messages`` as it gets them (training's ``prompt_messages``)."""
        renderer = self._renderer(tools, self.text_format, self.tools_placement)
        shown = renderer.prompt_messages(as_shown(messages, self.tool_format))
        return Fresh(renderer.with_template_kwargs(thinking), shown)

    def _complete(self, lv: Ledger, req: ChatRequest) -> Completion:
        params = self._sampling_for(lv)
        max_tokens = min(params.max_tokens, req.max_tokens or params.max_tokens)
        params = dataclasses.replace(params, max_tokens=max_tokens, stop=(*params.stop, *req.stop))
        what = f"engine {type(self.engine).__name__}: generate for episode {lv.episode.id} (turn {lv.turn})"
        setting = f"timeouts.engine_request_s={self.request_timeout_s:g}s"
        try:
            fut = self._submit(lv.episode.context_ids(), params)
            return wait_for(fut, self.request_timeout_s, what, setting)
        except Exception as e:
            lv.fail("model", e)
            raise engine_failed(f"the engine failed: {type(e).__name__}: {e}") from e


def ended(lv: Ledger, why: str) -> APIError:
    """The error of a request for an episode that serves no more turns (``agentrl_episode_ended``)."""
    return APIError(400, f"episode {lv.key!r} {why}", code="agentrl_episode_ended")


def ended_how(ep: Episode) -> str:
    """How an ended episode ended: the boundary it failed at, or its stop reason."""
    return f"failed at the {ep.failure.boundary} boundary" if ep.failure else f"ended ({ep.stop_reason})"


def engine_failed(message: str) -> APIError:
    return APIError(500, message, type="server_error", code="agentrl_engine_failed")


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


def check_sampling(req: ChatRequest, sampling: SamplingParams) -> None:
    """The run's sampling settings are the policy's: a request may repeat them, not change them."""
    run = {"temperature": sampling.temperature, "top_p": sampling.top_p}
    for name, value in (("temperature", req.temperature), ("top_p", req.top_p)):
        if value is not None and abs(value - run[name]) > 1e-9:
            message = (
                f"{name}={value} differs from this run's rollout.{name}={run[name]:g}: the trainer's loss "
                f"assumes the rollout's sampling distribution; leave {name} out or set rollout.{name}"
            )
            raise APIError(400, message, param=name, code="agentrl_sampling_fixed")
    if req.seed is not None:
        message = "seed is set by agentrl per episode and turn (from run.seed); leave it out"
        raise APIError(400, message, param="seed", code="agentrl_sampling_fixed")
    if req.top_logprobs:
        message = "top_logprobs are not recorded; only the sampled tokens' logprobs (logprobs: true)"
        raise APIError(400, message, param="top_logprobs")


def template_kwargs(effort: str | None, enable_thinking: bool) -> dict[str, Any]:
    """The chat-template arguments of a request's ``reasoning_effort``: ``enable_thinking`` false for
    "none" and true for any other value (the template has an on/off switch, not levels). Without the
    switch nothing can honour it: refused as OpenAI refuses it for a model without reasoning."""
    if effort is None:
        return {}
    if not enable_thinking:
        message = (
            "Unsupported parameter: 'reasoning_effort' is not supported with this model: its chat "
            "template has no enable_thinking switch; leave reasoning_effort out."
        )
        raise APIError(400, message, param="reasoning_effort", code="unsupported_parameter")
    return {"enable_thinking": effort != "none"}


def chat_result(
    lv: Ledger, message: dict[str, Any], comp: Completion, prompt_len: int, tokens: list[str]
) -> ChatResult:
    """The endpoint's answer: the recorded reply ``message`` (``Ledger.record_reply``), the sampled
    tokens (``tokens``: decoded when the request asked for log-probs) and the ``agentrl`` block."""
    tool_calls = message.get("tool_calls") or []
    content = message["content"]
    finish = "tool_calls" if tool_calls else ("length" if comp.finish_reason == "length" else "stop")
    return ChatResult(
        content=content if content or not tool_calls else None,
        tool_calls=tool_calls,
        finish_reason=finish,
        completion_tokens=tokens,
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
