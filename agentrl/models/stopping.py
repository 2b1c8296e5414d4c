"""When a turn is over: stop strings and stop conditions, shared by the engines.

**Stop strings.** A stop string of ``n`` UTF-8 bytes that the latest token completes lies inside the
last ``n`` tokens (every token decodes to at least one byte), so decoding the last ``n + 1`` tokens is
enough: the extra token keeps a character split across tokens from hiding the string's first
character. Checking after every token means the first match is always the one the latest token
completed.

**Stop conditions.** A predicate on the turn's text so far (``StopCondition``), for what a string
cannot say: "a balanced ``\\boxed{...}`` has closed" must not fire on the ``}`` of ``\\frac{1}{2}``.
A condition is *monotone* (once it holds for a text it holds for every extension: the turn was
over) and names its *triggers*, strings one of which the text always ends with at the point where it
starts to hold (``}`` for the boxed answer). The engines that check as the completion grows
(``HFEngine``, ``ScriptedEngine``) decode only a short tail after each token and evaluate the
predicate on the whole text only when the tail holds a trigger; an engine that cannot (vLLM) applies
it to the finished output and discards the tokens after the stop point (``cut_at_condition``). Either
way the tokens kept are those up to and including the one that made the condition hold: nothing is
cut out of a token, and no token after it is returned.

A condition crosses process boundaries (Ray workers) by pickling: its predicate must be a function
importable by module and name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any


def token_decoder(tokenizer: Any) -> Callable[[list[int]], str]:
    """The cheapest exact ``ids -> text`` for ``tokenizer`` (special tokens kept as text)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return lambda ids: backend.decode(ids, skip_special_tokens=False)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=False)


@dataclass(frozen=True)
class StopCondition:
    """A monotone predicate on a turn's text that ends the turn where it starts to hold (module
    docstring). ``context`` is text the predicate reads before the completion: the runner sets it to
    the turn's generation prompt, so a prompt that opens a ``<think>`` block (DeepSeek-R1's template)
    is seen as thinking."""

    name: str
    """What ``Completion.stop_reason`` says when this condition ended the turn."""
    holds: Callable[[str], bool]
    """True when the turn is over: a module-level function of ``context + completion text``."""
    triggers: tuple[str, ...]
    """The text ends with one of these where ``holds`` first becomes true (checked in a tail)."""
    context: str = ""

    def __post_init__(self) -> None:
        if not self.name or not self.triggers or any(not t for t in self.triggers):
            raise ValueError(f"stop condition {self.name!r} needs a name and non-empty triggers")

    def with_context(self, context: str) -> StopCondition:
        return replace(self, context=context)

    def met(self, text: str) -> bool:
        return self.holds(self.context + text)


def _first_boxed_closes(text: str) -> bool:
    start = text.find("\\boxed{")
    if start < 0:
        return False
    depth = 0
    for ch in text[start + len("\\boxed") :]:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return True
    return False


def _after_thinking(text: str) -> str | None:
    """The text after the last ``</think>``; all of it when there is no think block; None while one
    is open."""
    end = text.rfind("</think>")
    if end >= 0:
        return text[end + len("</think>") :]
    return None if "<think>" in text else text


def boxed_answer_closed(text: str) -> bool:
    """A balanced ``\\boxed{...}`` has closed outside any thinking: after the last ``</think>`` when
    there is one, nowhere while a ``<think>`` block is open. ``\\boxed{\\frac{1}{2}`` has not closed;
    ``\\boxed{\\frac{1}{2}}`` has."""
    answer = _after_thinking(text)
    return answer is not None and _first_boxed_closes(answer)


def answer_tag_closed(text: str) -> bool:
    """An ``<answer>...</answer>`` block has closed outside any thinking (reasoning-gym's format)."""
    answer = _after_thinking(text)
    if answer is None or (start := answer.find("<answer>")) < 0:
        return False
    return answer.find("</answer>", start) >= 0


BOXED_ANSWER = StopCondition("boxed_answer", boxed_answer_closed, ("}",))
"""The answer stop: the turn ends with the token that closes its first ``\\boxed{}`` answer (after any
thinking). Short-CoT, Long-CoT and GSM-Symbolic declare it
(``Environment.stop_conditions``; ``rollout.env_stop: false`` turns it off)."""

ANSWER_TAG = StopCondition("answer_tag", answer_tag_closed, ("</answer>",))
"""The answer stop for ``<answer>...</answer>`` answers (reasoning-gym): the turn ends with the token
that completes ``</answer>`` after any thinking."""


class StopStringMatcher:
    """Tells whether the newest token of a growing completion completed one of ``stops`` or made one
    of ``conditions`` hold; returns the string or the condition's name."""

    def __init__(
        self,
        stops: Sequence[str],
        decode: Callable[[list[int]], str],
        conditions: Sequence[StopCondition] = (),
    ) -> None:
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        self.stops = tuple(stops)
        self.conditions = tuple(conditions)
        self.window = max((len(s.encode()) for s in self.stops), default=0) + 1
        triggers = [t for c in self.conditions for t in c.triggers]
        self.trigger_window = max((len(t.encode()) for t in triggers), default=0) + 1
        self._decode = decode

    def match(self, ids: Sequence[int]) -> str | None:
        """The stop string found in the tail of ``ids`` or the condition that now holds, else None.
        Call once per appended token."""
        if self.stops:
            tail = self._decode(list(ids[-self.window :]))
            for s in self.stops:
                if s in tail:
                    return s
        if self.conditions:
            tail = self._decode(list(ids[-self.trigger_window :]))
            text: str | None = None
            for c in self.conditions:
                if any(t in tail for t in c.triggers):
                    text = self._decode(list(ids)) if text is None else text
                    if c.met(text):
                        return c.name
        return None


def cut_at_condition(
    ids: Sequence[int], conditions: Sequence[StopCondition], decode: Callable[[list[int]], str]
) -> tuple[int, str] | None:
    """For a finished completion: the fewest leading tokens after which one of ``conditions`` holds
    and that condition's name (the earliest stop point over all of them), or None when none holds.
    Monotone conditions make it a binary search: O(log n) decodes."""
    best: tuple[int, str] | None = None
    for c in conditions:
        hi = len(ids) if best is None else best[0] - 1
        if hi < 1 or not c.met(decode(list(ids[:hi]))):
            continue
        lo = 1  # the condition holds after hi tokens; find the first prefix where it does
        while lo < hi:
            mid = (lo + hi) // 2
            if c.met(decode(list(ids[:mid]))):
                hi = mid
            else:
                lo = mid + 1
        best = (hi, c.name)
    return best
