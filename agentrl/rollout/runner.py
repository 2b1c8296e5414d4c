"""The EpisodeRunner: runs a batch of multi-turn episodes to completion, token in, token out.

Each round, every active episode generates its next turn in one batched engine call; the
environment steps of the finished turns then run concurrently in a thread pool; each observation is
appended to its episode as chat-template deltas (token ids tagged tool/env/scaffold). Policy tokens
are the engine's ids, never re-tokenized text. A failure in one episode (engine, environment, tool,
sandbox, reward) is recorded on that episode with its boundary; the batch goes on.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from agentrl.engines.base import Completion, Engine, SamplingParams
from agentrl.env import Environment, Message, StepResult, Task, checked_messages, checked_step
from agentrl.episode import Episode, Segment
from agentrl.errors import Boundary, boundary_of
from agentrl.models.chat import ChatRenderer, Piece
from agentrl.models.history import HistoryPolicy, history_pieces
from agentrl.models.stopping import token_decoder
from agentrl.rollout.context import ContextPolicy, ContextSettings
from agentrl.rollout.scoring import score
from agentrl.rollout.tool_output import cut_long_outputs, truncate_outputs
from agentrl.rollout.turns import Budgets, LiveEpisode, record_turn_end, turn_sampling
from agentrl.timeouts import BoundedCalls, DaemonThreadPool

ENGINE_REQUEST_S = 600.0
ENV_STEP_S = 600.0
AGENT_RUN_S = 3600.0
"""The defaults of ``timeouts.engine_request_s``, ``env_step_s`` and ``agent_run_s``, for runners
built without a config."""


@dataclass(frozen=True)
class RunnerSettings:
    """What every episode runner takes besides its engine, tokenizer and environments: one record for
    the lock-step, async and agent runners (``components.runner_settings`` builds it from a config).

    ``sampling`` holds temperature/top-p/top-k; ``max_tokens`` and stop ids are set per turn by the
    runner. ``request_timeout_s`` (``timeouts.engine_request_s``): an engine call with no answer in
    this long fails the episodes waiting on it at the ``model`` boundary; the stuck call is abandoned
    (``agentrl.timeouts``), so the engine may still be busy with it afterwards. ``env_timeout_s``
    (``timeouts.env_step_s``): the same for an environment's ``reset`` or ``step`` (the episode fails
    at the ``env`` boundary). ``agent_timeout_s`` (``timeouts.agent_run_s``): the same for an agent
    environment's whole ``run``. ``history`` (``rollout.history``): ``auto``, ``split`` or ``merge``,
    what to do when the chat template would show the model a different history than the one it wrote
    (``agentrl.models.history``). ``tools_prompt`` (``rollout.tools_prompt``): where the tool schemas
    are shown. ``env_stop`` (``rollout.env_stop``): each turn also ends where the environment's
    ``stop_strings`` and ``stop_conditions`` say (the answer stop). ``context``
    (``rollout.context``): what happens when an episode's context is full (``agentrl.rollout.context``)."""

    budgets: Budgets = field(default_factory=Budgets)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_concurrent_episodes: int = 64
    """Episodes in flight at once (the async and agent runners; the lock-step runner's environment
    threads, up to 64)."""
    request_timeout_s: float = ENGINE_REQUEST_S
    env_timeout_s: float = ENV_STEP_S
    agent_timeout_s: float = AGENT_RUN_S
    history: str = "auto"
    tools_prompt: str = "auto"
    env_stop: bool = True
    context: ContextSettings = field(default_factory=ContextSettings)


@dataclass(frozen=True)
class EpisodeRequest:
    task: Task
    seed: int
    group: str | None = None
    episode_id: str | None = None

    def new_episode(self) -> Episode:
        """The empty episode record this request fills (its id defaults to ``<task id>-s<seed>``)."""
        return Episode(
            id=self.episode_id or f"{self.task.id}-s{self.seed}",
            env="",
            task_id=self.task.id,
            seed=self.seed,
            group=self.group,
        )


class EpisodeRunner:
    """Runs episodes of one environment type with one engine and tokenizer, in lock-step rounds.

    ``env_factory`` builds a fresh environment per episode (episodes run concurrently, so they never
    share one). ``settings``: budgets, sampling, timeouts and history (``RunnerSettings``).
    """

    env_threads: int | None = None
    """Threads for environment calls; None: ``max_concurrent_episodes``, up to 64."""
    step_reward_name = "env_step"
    """The reward component that holds the rewards ``step`` returned."""

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        env_factory: Callable[[], Environment],
        settings: RunnerSettings | None = None,
    ) -> None:
        settings = settings or RunnerSettings()
        self.settings = settings
        self.engine = engine
        self.tools_prompt = settings.tools_prompt
        self.history = HistoryPolicy(tokenizer, settings.history)
        self.request_timeout_s, self.env_timeout_s = settings.request_timeout_s, settings.env_timeout_s
        self.tokenizer = tokenizer
        self.env_factory = env_factory
        self.budgets = settings.budgets
        self.sampling = settings.sampling
        self.env_stop = settings.env_stop
        self.context = ContextPolicy(settings.context, settings.budgets)
        self._decode = token_decoder(tokenizer)
        threads = self.env_threads or min(64, settings.max_concurrent_episodes)
        self.pool = DaemonThreadPool(threads, "agentrl-env")  # environments start here (user code)
        self._bounded_calls = BoundedCalls()  # engine and environment calls under their timeouts
        self._renderers: dict[str, ChatRenderer] = {}

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self._bounded_calls.close()

    # -- the loop ----------------------------------------------------------------------------
    def run(self, requests: Sequence[EpisodeRequest]) -> list[Episode]:
        """The episodes of ``requests``, in order, at most ``max_concurrent_episodes`` in flight: a
        larger batch (an evaluation's tasks × k) runs in waves. The loop starts every episode of a
        wave before its first turn, and a sandboxed environment's pool holds one session per episode
        in flight (``max_sessions`` = this setting), so without waves the episodes past it would wait
        for a session no running episode could free."""
        wave = self.settings.max_concurrent_episodes
        out: list[Episode] = []
        for i in range(0, len(requests), wave):
            out += self._run_wave(requests[i : i + wave])
        return out

    def _run_wave(self, requests: Sequence[EpisodeRequest]) -> list[Episode]:
        starting = [self.pool.submit(self._start, r) for r in requests]
        try:
            lives = [f.result() for f in starting]
        except BaseException:  # Ctrl-C while environments start: close each one as it finishes
            for f in starting:
                f.add_done_callback(_close_started)
            raise
        try:
            while True:
                active = [lv for lv in lives if not lv.done]
                if not active:
                    break
                completions = self._generate(active)
                for lv, comp in zip(active, completions):
                    if comp is not None:
                        self._append_policy(lv, comp)
                stepping = [
                    lv for lv, comp in zip(active, completions) if comp is not None and self._steps(lv)
                ]
                for lv, result in zip(stepping, self.pool.map(self._safe_step, stepping)):
                    if result is not None:
                        self._after_step(lv, result)
            return list(self.pool.map(self._finish, lives))
        except BaseException:  # Ctrl-C mid-rollout: the episodes are dropped
            close_quietly(lives)
            raise

    def _start(self, req: EpisodeRequest) -> LiveEpisode:
        ep = req.new_episode()
        ep.metrics["task"] = {
            "id": req.task.id,
            "prompt": req.task.prompt,
            "answer": jsonable(req.task.answer),
            "metadata": jsonable(dict(req.task.metadata)),
        }
        lv = LiveEpisode(ep, None, None)
        try:
            env = self._bounded(self.env_factory, None, "construction", lv)
            lv.env, ep.env = env, env.name
            lv.messages = checked_messages(
                self._bounded(lambda: env.reset(req.task, req.seed), env, "reset", lv), "Environment.reset"
            )
            tools = env.tool_schemas() or None
            ep.metrics["tools"] = tools
            lv.renderer = self._renderer(tools, env.tool_format)
            if tools:
                ep.metrics["tools_prompt"] = "system" if lv.renderer.tools_text else "template"
                lv.messages = lv.renderer.prompt_messages(lv.messages)
            prompt = lv.renderer.render_prompt(lv.messages)
            ep.add(Segment("prompt", 0, prompt.token_ids, prompt.text))
            lv.prompt_count = len(lv.messages)
            self.history.record(ep)
        except Exception as e:
            self._fail(lv, boundary_of(e, "env"), e)
            return lv
        if lv.length >= self.budgets.max_episode_tokens:
            self._stop(lv, "token_budget")
        return lv

    def _renderer(
        self, tools: list[dict] | None, tool_format: str = "json", placement: str | None = None
    ) -> ChatRenderer:
        placement = placement or self.tools_prompt
        key = repr((tools, tool_format, placement))
        if key not in self._renderers:
            self._renderers[key] = ChatRenderer(self.tokenizer, tools, placement, tool_format)
        return self._renderers[key]

    def _sampling_for(self, lv: LiveEpisode) -> SamplingParams:
        params = turn_sampling(self.sampling, self.budgets, lv, self.env_stop)
        return params if lv.summarizing is None else self.context.sampling(lv, params)

    @staticmethod
    def _steps(lv: LiveEpisode) -> bool:
        """Whether the environment takes a step for the turn just appended (not for a summary)."""
        return not lv.done and not lv.resumed

    def _generate(self, active: list[LiveEpisode]) -> list[Completion | None]:
        prompts = [lv.episode.context_ids() for lv in active]
        params = [self._sampling_for(lv) for lv in active]
        what = f"engine {type(self.engine).__name__}: generate for {len(active)} episodes"
        setting = f"timeouts.engine_request_s={self.request_timeout_s:g}s"
        try:
            bounded = getattr(self.engine, "bounded", None)
            if (
                bounded is not None
            ):  # an in-process engine keeps its compute in this thread (HFEngine.bounded)
                with bounded(self.request_timeout_s, what, setting):
                    return list(self.engine.generate(prompts, params))
            return list(
                self._bounded_calls.call(
                    lambda: self.engine.generate(prompts, params), self.request_timeout_s, what, setting
                )
            )
        except Exception as e:
            for lv in active:
                self._fail(lv, "model", e)
            return [None] * len(active)

    def _append_policy(self, lv: LiveEpisode, comp: Completion) -> None:
        ep = lv.episode
        text = self.tokenizer.decode(comp.token_ids, skip_special_tokens=False)
        ep.add(
            Segment("policy", lv.turn, list(comp.token_ids), text, list(comp.logprobs), comp.weight_version)
        )
        assert lv.renderer is not None
        ended_with_eos = bool(comp.token_ids) and comp.token_ids[-1] == lv.renderer.eos_token_id
        content = text.removesuffix(lv.renderer.assistant_close.strip()) if ended_with_eos else text
        summary, lv.resumed = lv.summarizing is not None, False
        if not summary:  # a summary is not an action: the environment never sees it
            lv.final_text = content
            lv.messages.append({"role": "assistant", "content": content})
        close = lv.renderer.close_turn(text, ended_with_eos)
        ep.add(Segment("scaffold", lv.turn, close.token_ids, close.text))
        record_turn_end(lv, comp, self.sampling, self.env_stop and not summary, self._decode)
        if comp.finish_reason == "length" and lv.length >= self.budgets.max_episode_tokens:
            self._stop(lv, "token_budget")
        elif comp.finish_reason == "abort":
            self._fail(lv, "model", RuntimeError(f"engine aborted the request: {comp.info}"))
        elif summary:
            self.context.finish_summary(lv, content)

    def _safe_step(self, lv: LiveEpisode) -> StepResult | None:
        assert lv.env is not None and lv.final_text is not None
        try:
            env, action = lv.env, lv.final_text
            return checked_step(self._bounded(lambda: env.step(action), env, "step", lv))
        except Exception as e:
            self._fail(lv, boundary_of(e, "env"), e)
            return None

    def _bounded(
        self, call: Callable[[], Any], env: Environment | None, what: str, lv: LiveEpisode | None = None
    ) -> Any:
        """An environment call (user code: construction, reset, step, rewards, close), waited for at
        most ``env_timeout_s``; with ``lv``, on that episode's own thread (docs/environments.md,
        "Which thread runs what")."""
        return self._bounded_calls.call(
            call,
            self.env_timeout_s,
            f"environment {env.name!r} {what}" if env is not None else f"environment {what}",
            f"timeouts.env_step_s={self.env_timeout_s:g}s",
            key=None if lv is None else id(lv),
        )

    def _after_step(self, lv: LiveEpisode, result: StepResult) -> None:
        obs, reward, terminated, truncated, info = result
        lv.step_reward += float(reward)
        lv.info.update(info)
        lv.episode.metrics["tool_calls"] = lv.episode.metrics.get("tool_calls", 0) + int(
            info.get("tool_calls", 0)
        )
        if terminated:
            return self._stop(lv, "void_turn" if info.get("void_turn") else "answered")
        if truncated:
            return self._stop(lv, "truncated")
        limit = min(self.budgets.max_turns, lv.env.max_turns if lv.env else self.budgets.max_turns)
        if lv.turn - lv.summaries + 1 >= limit:
            return self._stop(lv, "max_turns")  # the unanswered observation is not shown to anyone
        lv.turn += 1
        try:
            self._append_observation(lv, obs)
        except Exception as e:
            return self._fail(lv, "env", e)
        lv.final_text = None
        if lv.length >= self.budgets.max_episode_tokens:
            self._stop(lv, "token_budget")

    def _append_observation(self, lv: LiveEpisode, obs: list[Message]) -> None:
        """Append the observation after the policy's turn, as a delta (its tool and env contents
        truncated to ``max_tool_output_tokens``), or, where the chat template would show the model a
        different history and ``history`` is split, as the prompt of a new sample."""
        assert lv.renderer is not None
        cap = self.budgets.max_tool_output_tokens
        obs, cut = cut_long_outputs(obs, cap)  # a 5 MB output is not tokenized whole to keep 256 tokens
        renderer = lv.renderer

        def render(extra: list[Message]) -> list[Piece]:  # the observation, then runner messages
            return truncate_outputs(self.tokenizer, renderer.render_observation([*obs, *extra]), cap, cut)

        pieces: list[Piece] | None = render([])
        assert pieces is not None
        for i, msg in enumerate(obs):  # record what the model actually saw
            text = [p.text for p in pieces if p.message_index == i]
            lv.messages.append({**msg, "content": text[0]} if text else dict(msg))
        pieces = self.context.on_observation(lv, pieces, render)  # a full context: rollout.context
        if pieces is None:
            return
        if lv.summarizing is None and self.history.must_split(
            lv.renderer, lv.episode, lv.context_messages(), pieces
        ):
            lv.episode.begin_sample(len(lv.messages), "history")
            pieces = history_pieces(lv.renderer, lv.context_messages())
        for piece in pieces:
            lv.episode.add(Segment(piece.role, lv.turn, piece.token_ids, piece.text))  # type: ignore[arg-type]

    def _stop(self, lv: LiveEpisode, reason: str) -> None:
        lv.stop(reason)

    def _fail(self, lv: LiveEpisode, boundary: Boundary, exc: BaseException) -> None:
        lv.fail(boundary, exc)

    def _finish(self, lv: LiveEpisode) -> Episode:
        ep = lv.episode
        ep.messages = lv.messages
        if ep.failure is None and lv.env is not None and lv.env.task is not None:
            self._score(lv)
        if lv.env is not None:
            try:
                lv.env_closed = True
                self._bounded(lv.env.close, lv.env, "close", lv)
            except Exception as e:
                ep.metrics["close_error"] = f"{type(e).__name__}: {e}"
                if ep.failure is None:
                    self._fail(lv, boundary_of(e, "env"), e)
        ep.metrics.update(
            turns=ep.num_turns,
            policy_tokens=ep.num_policy_tokens,
            total_tokens=lv.length,
            wall_s=round(time.perf_counter() - lv.t0, 4),
        )
        self._bounded_calls.release(id(lv))  # the episode's thread ends with it
        return ep

    def _score(self, lv: LiveEpisode) -> None:
        """The episode's reward (``agentrl.rollout.scoring``), computed under ``timeouts.env_step_s``."""
        score(lv, lambda call: self._bounded(call, lv.env, "rewards", lv), self.step_reward_name)


def _close_started(started: concurrent.futures.Future) -> None:
    if not started.cancelled() and started.exception() is None:
        close_quietly([started.result()])


def close_quietly(lives: Sequence[LiveEpisode]) -> None:
    """Close the environments (sandbox sessions, MCP servers' sessions) of episodes an interrupted
    run drops; an error closing one does not keep the others open."""
    for lv in lives:
        if lv.env is not None and not lv.env_closed:
            lv.env_closed = True
            with contextlib.suppress(Exception):
                lv.env.close()


def jsonable(x: Any) -> Any:
    """Task answers and metadata may hold tuples or dataclasses; store a JSON-safe copy."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if hasattr(x, "__dataclass_fields__"):
        return jsonable(asdict(x))
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return repr(x)


@dataclass(frozen=True)
class SamplingOverride:
    """What one call changes in a runner's sampling (``rollout.*`` otherwise): the evaluation's
    ``eval.temperature`` and ``eval.top_p``. None keeps the rollout's value."""

    temperature: float | None = None
    top_p: float | None = None

    def applied(self, sampling: SamplingParams) -> SamplingParams:
        changed = {k: v for k, v in asdict(self).items() if v is not None}
        return replace(sampling, **changed)


MakeRunner = Callable[[Engine, "int | None", "SamplingOverride | None"], EpisodeRunner]
"""``(engine, seed, override) -> runner``: the runner for an engine, built where the config is
read (``agentrl/assembly/``); the collector and the evaluation take one."""
