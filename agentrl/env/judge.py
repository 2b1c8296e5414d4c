"""Rewards that need a judge: a model behind any OpenAI-compatible chat-completions endpoint (a
hosted one, ``agentrl serve`` of another checkpoint, or a local server beside the run).

    judge = Judge(JudgeSettings(url="http://127.0.0.1:8001/v1", model="judge"))

    class Essay(Environment):
        def rewards(self):
            return [judge_reward("judged", judge, lambda task, s: f"Is this correct? {s.final_text}", yes_no)]

A judge's answer is a verdict or an error, never a zero. A call that fails past its retries, or
an answer that ``parse`` finds no verdict in, raises ``JudgeError``. The runner then fails the
episode at the ``judge`` boundary: it is left out of its group's statistics and out of the loss, and
counted in ``failures/judge`` and ``rewards/judge_failed_frac``. A group left with fewer than two
scored episodes is dropped (``groups/dropped_count``).

The runner scores the episodes of a wave concurrently; ``max_concurrency`` bounds the calls in
flight to the endpoint, whatever the number of episodes. A verdict is cached by the request's
content (model, messages, sampling), so an answer seen twice costs one call. Each attempt is bounded
by ``timeout_s``, and the rewards as a whole by the runner's ``timeouts.env_step_s``: keep
(retries + 1) × timeout_s below it, or the runner's bound ends the episode first (at the ``reward``
boundary). The rollouts of a step wait for a judge no longer than that.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentrl.env.records import EpisodeState, Reward, Task
from agentrl.errors import BoundaryError

Post = Callable[[str, dict[str, Any], dict[str, str], float], str]
"""``(url, body, headers, timeout_s) -> the answer's text``: one chat-completions call."""


class JudgeError(BoundaryError):
    """The judge gave no verdict (see the module's docstring)."""

    boundary = "judge"


@dataclass(frozen=True)
class JudgeSettings:
    url: str
    """The endpoint's base URL, up to ``/v1`` (``/chat/completions`` is appended)."""
    model: str = "judge"
    """The ``model`` field of each request."""
    timeout_s: float = 30.0
    """One attempt's limit."""
    retries: int = 2
    """Attempts after the first when a call fails (connection, HTTP error, malformed JSON); an
    answer without a verdict is not retried (at temperature 0 it would come back the same)."""
    max_concurrency: int = 8
    """Calls in flight at once, over all episodes."""
    max_tokens: int = 64
    temperature: float = 0.0
    api_key: str | None = None
    """Sent as ``Authorization: Bearer``; None sends none."""
    backoff_s: float = 0.5
    """The wait before a retry, doubled after each."""


def chat_post(url: str, body: dict[str, Any], headers: dict[str, str], timeout_s: float) -> str:
    """POST ``body`` to ``url``/chat/completions; the first choice's message text."""
    req = urllib.request.Request(
        url.rstrip("/") + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **headers},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        answer = json.loads(resp.read())
    text = answer["choices"][0]["message"]["content"]
    if not isinstance(text, str):
        raise ValueError(f"the answer's content is {type(text).__name__}, not text")
    return text


@dataclass
class Judge:
    """One endpoint, shared by every episode's judge rewards (and threads)."""

    settings: JudgeSettings
    post: Post = chat_post
    calls: int = 0
    """Requests sent (retries included)."""
    cache_hits: int = 0
    _cache: dict[str, float] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _slots: threading.BoundedSemaphore = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._slots = threading.BoundedSemaphore(self.settings.max_concurrency)

    def verdict(self, messages: list[dict[str, str]], parse: Callable[[str], float | None]) -> float:
        """The parsed verdict of the judge on ``messages``, cached by content; ``JudgeError`` when
        there is none."""
        s = self.settings
        body = {
            "model": s.model,
            "messages": messages,
            "max_tokens": s.max_tokens,
            "temperature": s.temperature,
        }
        key = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        with self._lock:
            if key in self._cache:
                self.cache_hits += 1
                return self._cache[key]
        text = self._ask(body)
        value = parse(text)
        if value is None:
            raise JudgeError(f"the judge's answer holds no verdict: {text[:120]!r}")
        with self._lock:
            self._cache[key] = float(value)
        return float(value)

    def _ask(self, body: dict[str, Any]) -> str:
        s = self.settings
        headers = {"Authorization": f"Bearer {s.api_key}"} if s.api_key else {}
        last: Exception | None = None
        for attempt in range(s.retries + 1):
            if attempt:
                time.sleep(s.backoff_s * 2 ** (attempt - 1))
            with self._slots:
                with self._lock:
                    self.calls += 1
                try:
                    return self.post(s.url, body, headers, s.timeout_s)
                except (OSError, ValueError, KeyError, IndexError, TypeError) as e:  # timeouts are OSErrors
                    last = e
        raise JudgeError(
            f"judge {s.url} gave no answer in {s.retries + 1} attempts: {type(last).__name__}: {last}"
        )


@dataclass(frozen=True)
class JudgeReward(Reward):
    """A ``Reward`` whose function asks a ``Judge`` (``judge_reward``); the runner marks the
    episodes it scores (``metrics["judged"]``) so that the step reports the judge's failures."""

    judge: Judge | None = field(default=None, compare=False)


def judge_reward(
    name: str,
    judge: Judge,
    prompt: Callable[[Task, EpisodeState], str | list[dict[str, str]]],
    parse: Callable[[str], float | None],
    weight: float = 1.0,
) -> JudgeReward:
    """A reward from ``judge``'s verdict on ``prompt(task, state)`` (a user message, or the chat's
    messages), read by ``parse`` (``yes_no``, ``score_in``, or your own: None = no verdict)."""

    def ask(task: Task, state: EpisodeState) -> float:
        asked = prompt(task, state)
        messages = [{"role": "user", "content": asked}] if isinstance(asked, str) else list(asked)
        return judge.verdict(messages, parse)

    return JudgeReward(name, ask, weight, judge=judge)


_WORD = re.compile(r"[a-z]+")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def yes_no(text: str) -> float | None:
    """1 for an answer whose first word is yes, 0 for no, None otherwise."""
    words = _WORD.findall(text.lower())
    return {"yes": 1.0, "no": 0.0}.get(words[0]) if words else None


def score_in(low: float = 0.0, high: float = 1.0) -> Callable[[str], float | None]:
    """A parser: the last number in the answer, scaled from [low, high] to [0, 1]; None when there
    is none or it lies outside."""

    def parse(text: str) -> float | None:
        found = _NUMBER.findall(text)
        if not found:
            return None
        x = float(found[-1])
        return (x - low) / (high - low) if low <= x <= high else None

    return parse
