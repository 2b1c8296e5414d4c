"""How a policy turn is sampled and what ended it: the sampling parameters of the next turn (its
token budget, the end-of-turn token, the environment's stop strings and conditions, a per-turn seed)
and the transcript's record of each turn's end (``metrics.stop_reasons``, ``metrics.answer_tokens``).
Shared by the lock-step, async and agent runners (``runner.EpisodeRunner``), with the book-keeping
of a running episode (``LiveEpisode``) and its limits (``Budgets``)."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentrl.engines.base import Completion, SamplingParams
from agentrl.env import Environment, Message
from agentrl.episode import Episode
from agentrl.errors import Boundary, Failure
from agentrl.models.chat import ChatRenderer
from agentrl.models.stopping import cut_at_condition


@dataclass(frozen=True)
class Budgets:
    """Per-episode limits. Token counts include everything in the context (prompt, policy tokens,
    observations), since that is what the model must fit."""

    max_turns: int = 8
    max_tokens_per_turn: int = 256
    max_episode_tokens: int = 2048
    max_tool_output_tokens: int = 256
    """Longer tool outputs keep their head and tail with a visible marker in between."""


@dataclass
class LiveEpisode:
    """Book-keeping for one running episode."""

    episode: Episode
    env: Environment | None
    renderer: ChatRenderer | None
    messages: list[Message] = field(default_factory=list)
    turn: int = 0
    step_reward: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    final_text: str | None = None
    done: bool = False
    t0: float = field(default_factory=time.perf_counter)
    env_closed: bool = False
    prompt_count: int = 0
    """How many of the messages are the task's (``reset``'s, with the tools' system message)."""
    base: list[Message] = field(default_factory=list)
    base_from: int = 0
    """The current sample shows ``base`` then ``messages[base_from:]`` (``context_messages``): a
    compaction or a window restarts the context from a prompt of its own (``agentrl.rollout.context``)."""
    summarizing: str | None = None
    """The summary request, while the next generation is the summary turn."""
    summaries: int = 0
    """Summary turns so far (they do not count against the turn limits)."""
    resumed: bool = False
    """The last generation was a summary: the environment takes no step for it."""

    def context_messages(self) -> list[Message]:
        """The messages the current sample shows the model."""
        return [*self.base, *self.messages[self.base_from :]]

    @property
    def length(self) -> int:
        """Tokens in the model's context: the current sample (all of an unsplit episode)."""
        start = self.episode.sample_breaks[-1]["segment"] if self.episode.sample_breaks else 0
        return sum(len(s.token_ids) for s in self.episode.segments[start:])

    def stop(self, reason: str) -> None:
        """End the episode for ``reason`` (its ``stop_reason``), unless it has already ended."""
        if not self.done:
            self.episode.stop_reason = reason  # type: ignore[assignment]
            self.done = True

    def fail(self, boundary: Boundary, exc: BaseException) -> None:
        """End the episode as failed at ``boundary``; the first failure recorded is the one kept."""
        if self.episode.failure is None:
            tb = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            cause = exc.__cause__ or exc.__context__
            if cause is not None and boundary == "agent":  # "Connection error." needs its reason
                tb += " (from " + "".join(traceback.format_exception_only(type(cause), cause)).strip() + ")"
            self.episode.failure = Failure(boundary, tb)
        self.episode.stop_reason = "error"
        self.done = True


def turn_sampling(
    sampling: SamplingParams, budgets: Budgets, lv: LiveEpisode, env_stop: bool
) -> SamplingParams:
    """The next turn's sampling: the run's settings (``sampling``), this turn's token budget, EOS as a
    stop id, the environment's stop strings and conditions (``env_stop``; a condition reads the
    turn's generation prompt before its text), and a seed derived from (run seed, episode seed, turn)
    so a turn's sample does not depend on which other episodes share its batch."""
    left = budgets.max_episode_tokens - lv.length
    assert lv.renderer is not None
    stop_ids = tuple({*sampling.stop_token_ids, lv.renderer.eos_token_id} - {None})
    stop, conditions = sampling.stop, sampling.stop_conditions
    if env_stop and lv.env is not None:
        stop = tuple(dict.fromkeys((*stop, *lv.env.stop_strings)))
        if lv.env.stop_conditions:
            opening = lv.renderer.generation_prompt()
            conditions = (*conditions, *(c.with_context(opening) for c in lv.env.stop_conditions))
    return SamplingParams(
        max_tokens=min(budgets.max_tokens_per_turn, left),
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        stop_token_ids=stop_ids,  # type: ignore[arg-type]
        stop=stop,
        stop_conditions=conditions,
        seed=None if sampling.seed is None else sampling.seed + 7919 * lv.episode.seed + lv.turn,
    )


def record_turn_end(
    lv: LiveEpisode,
    comp: Completion,
    sampling: SamplingParams,
    env_stop: bool,
    decode: Callable[[list[int]], str],
) -> None:
    """The transcript's ``metrics.stop_reasons`` (what ended each turn) and, where the environment
    declares stop conditions, ``metrics.answer_tokens`` (turn -> the turn's tokens up to the point
    where its answer ended, all of them when it gave none): with ``env_stop`` off the tokens after it
    are the turn's free tail, which ``entropy/answer`` and the study's entropies leave out."""
    assert lv.renderer is not None
    ep, env = lv.episode, lv.env
    names = {c.name for c in sampling.stop_conditions}
    if env_stop and env is not None:
        names |= {c.name for c in env.stop_conditions}
    ep.metrics.setdefault("stop_reasons", []).append(turn_stop_reason(comp, lv.renderer.eos_token_id, names))
    if env is not None and env.stop_conditions:
        opening = lv.renderer.generation_prompt()
        cut = cut_at_condition(comp.token_ids, [c.with_context(opening) for c in env.stop_conditions], decode)
        ep.metrics.setdefault("answer_tokens", {})[str(lv.turn)] = (
            len(comp.token_ids) if cut is None else cut[0]
        )


def turn_stop_reason(comp: Completion, eos_token_id: int | None, conditions: set[str]) -> str:
    """What ended a policy turn, for the transcript's ``metrics.stop_reasons`` (one per turn):
    ``eos`` (the end-of-turn token), ``token:<id>`` (another stop id), ``stop:<string>``
    (``rollout.stop``, ``Environment.stop_strings``), ``condition:<name>`` (a stop condition among
    ``conditions``, e.g. ``condition:boxed_answer``), ``length`` (the turn's token budget) or
    ``abort``."""
    reason = comp.stop_reason
    if comp.finish_reason != "stop" or reason is None:
        return comp.finish_reason if comp.finish_reason != "stop" else "eos"
    if isinstance(reason, int):
        return "eos" if reason == eos_token_id else f"token:{reason}"
    return f"condition:{reason}" if reason in conditions else f"stop:{reason}"
