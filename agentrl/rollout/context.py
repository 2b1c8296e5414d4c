"""Episodes longer than the model's context (``rollout.context``): stop, compact or window.

After each observation the runner asks ``ContextPolicy.on_observation`` whether the context could
still hold another full turn. When it could not:

- ``stop``: the episode ends (stop reason ``token_budget``);
- ``compact``: the runner appends a summary request (an ``env`` message, the environment's
  ``summary_prompt`` or the default) and the next generation is the summary, a policy turn that is
  trained like any other. The episode then goes on in a new sample (``Episode.begin_sample``, reason
  ``compaction``) whose prompt is the task's messages, the summary as the model's own turn and the
  latest observation (the one the model had not answered yet). The environment never sees the summary: ``Episode.messages`` holds the
  conversation the environment had, the break holds the request, the summary and the new prompt;
- ``window``: a new sample (reason ``window``) whose prompt is the task's messages and the newest
  whole turns (an assistant message with the observation after it) that fit; never half a turn.

Every sample is a training row with the episode's advantage, so the model never sees a context the
trainer does not train on; each sample is token-in/token-out exact (the new prompt is the chat
template's render of the messages it shows, ``history_pieces``). ``metrics["context"]`` lists every
event, and ``agentrl replay`` and the viewer show where each happened and what it kept.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from agentrl.engines.base import SamplingParams
from agentrl.env import Message
from agentrl.episode import Segment
from agentrl.models.chat import Piece
from agentrl.models.history import history_pieces
from agentrl.rollout.turns import Budgets, LiveEpisode

CONTEXT_POLICIES = ("stop", "compact", "window")
SUMMARY_PROMPT = (
    "Your context is almost full, and everything above this message will be removed. Write a short "
    "summary of your progress: every fact you found that you still need, what you have done and what "
    "is left. Write only the summary."
)


@dataclass(frozen=True)
class ContextSettings:
    """``rollout.context`` as the runners take it (``components.runner_settings`` builds it).
    ``max_tokens`` None: ``Budgets.max_episode_tokens``; ``max_summary_tokens`` None:
    ``Budgets.max_tokens_per_turn``; a prompt None: the environment's, else the default."""

    policy: str = "stop"
    max_tokens: int | None = None
    max_summary_tokens: int | None = None
    summary_prompt: str | None = None

    def __post_init__(self) -> None:
        if self.policy not in CONTEXT_POLICIES:
            raise ValueError(
                f"rollout.context.policy is {self.policy!r}; valid: {', '.join(CONTEXT_POLICIES)}"
            )


class ContextPolicy:
    """One runner's ``rollout.context``, applied to its live episodes."""

    def __init__(self, settings: ContextSettings, budgets: Budgets) -> None:
        self.settings, self.budgets = settings, budgets
        self.max_tokens = settings.max_tokens or budgets.max_episode_tokens
        self.summary_tokens = settings.max_summary_tokens or budgets.max_tokens_per_turn

    @property
    def active(self) -> bool:
        """Whether this policy acts before the hard limit does (``stop`` at the default budget is
        the runner's own ``token_budget`` rule)."""
        return self.settings.policy != "stop" or self.settings.max_tokens is not None

    def on_observation(
        self, lv: LiveEpisode, pieces: list[Piece], render: Callable[[list[Message]], list[Piece]]
    ) -> list[Piece] | None:
        """The observation's ``pieces`` (a delta; ``lv.messages`` already holds its messages) to
        append, with the summary request after them when the context is full under ``compact``;
        None when the policy took the observation instead (a new ``window`` sample holds it) or
        ended the episode (``stop``). ``render(extra)`` renders the observation followed by
        ``extra`` messages as one delta."""
        if (
            not self.active
            or self.max_tokens - (lv.length + _length(pieces)) >= self.budgets.max_tokens_per_turn
        ):
            return pieces
        policy = self.settings.policy
        if policy == "compact":
            text = self.settings.summary_prompt or getattr(lv.env, "summary_prompt", None) or SUMMARY_PROMPT
            with_request = render([{"role": "user", "content": text}])
            if lv.length + _length(with_request) >= self.budgets.max_episode_tokens:
                self._event(lv, "stop", lv.length, reason="no room for the summary request")
                lv.stop("token_budget")
                return None
            lv.summarizing = text
            return with_request
        if policy == "window":
            self._window(lv)
            return None
        self._event(lv, "stop", lv.length)
        lv.stop("token_budget")
        return None

    def sampling(self, lv: LiveEpisode, params: SamplingParams) -> SamplingParams:
        """The summary turn's sampling: the summary budget within the hard limit, and only the
        end-of-turn stop (an environment's answer stop would cut a summary that quotes one)."""
        left = self.budgets.max_episode_tokens - lv.length
        return replace(params, max_tokens=max(1, min(self.summary_tokens, left)), stop=(), stop_conditions=())

    def finish_summary(self, lv: LiveEpisode, summary: str) -> None:
        """The summary turn was appended (``lv.summarizing``): start the next sample from it."""
        assert lv.summarizing is not None
        request, lv.summarizing = lv.summarizing, None
        before = lv.length
        shown = lv.context_messages()
        last = max((i for i, m in enumerate(shown) if m.get("role") == "assistant"), default=len(shown) - 1)
        context = [*shown[: lv.prompt_count], {"role": "assistant", "content": summary}, *shown[last + 1 :]]
        lv.summaries += 1
        lv.resumed = True
        self._begin(lv, context, "compaction", {"request": request, "summary": summary}, before)

    # -- the steps -------------------------------------------------------------------------------
    def _window(self, lv: LiveEpisode) -> None:
        messages = lv.context_messages()
        head, rest = messages[: lv.prompt_count], messages[lv.prompt_count :]
        starts = [i for i, m in enumerate(rest) if m.get("role") == "assistant"]
        for dropped, start in enumerate(starts[1:], start=1):  # keep at least the newest turn
            context = [*head, *rest[start:]]
            assert lv.renderer is not None
            if (
                _length(history_pieces(lv.renderer, context)) + self.budgets.max_tokens_per_turn
                <= self.max_tokens
            ):
                return self._begin(lv, context, "window", {"dropped_turns": dropped}, lv.length)
        self._event(lv, "stop", lv.length, reason="the newest turn alone does not fit")
        lv.stop("token_budget")

    def _begin(
        self, lv: LiveEpisode, context: list[Message], kind: str, extra: dict[str, Any], before: int
    ) -> None:
        """A new sample prompted with ``context``; its messages go on from the conversation's end."""
        assert lv.renderer is not None
        lv.turn += 1
        lv.episode.begin_sample(len(lv.messages), kind, extra={**extra, "context": context})
        for piece in history_pieces(lv.renderer, context):
            lv.episode.add(Segment(piece.role, lv.turn, piece.token_ids, piece.text))  # type: ignore[arg-type]
        lv.base, lv.base_from = context, len(lv.messages)
        self._event(
            lv, kind, before, after=lv.length, **{k: v for k, v in extra.items() if k == "dropped_turns"}
        )
        if lv.length + self.budgets.max_tokens_per_turn > self.budgets.max_episode_tokens:
            self._event(lv, "stop", lv.length, reason=f"the context after the {kind} does not fit a turn")
            lv.stop("token_budget")

    @staticmethod
    def _event(lv: LiveEpisode, kind: str, before: int, **fields: Any) -> None:
        lv.episode.metrics.setdefault("context", []).append(
            {"turn": lv.turn, "kind": kind, "tokens": before, **fields}
        )


def _length(pieces: list[Piece]) -> int:
    return sum(len(p.token_ids) for p in pieces)
