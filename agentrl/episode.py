"""The episode data model: an ordered list of token segments, each tagged with who wrote it.

The loss mask is derived from the roles (``policy`` -> 1, everything else -> 0) and is never stored,
so it cannot disagree with the roles. An episode serializes to one JSON line losslessly.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

from agentrl.errors import Failure

Role = Literal["prompt", "policy", "tool", "env", "scaffold"]
"""Who wrote a segment: the task prompt (rendered with the chat template), the policy (sampled by
the engine), a tool's output, an environment message, or template scaffolding the runner inserted
(role headers, end-of-turn markers, truncation markers)."""
ROLES: tuple[str, ...] = get_args(Role)

StopReason = Literal["answered", "max_turns", "token_budget", "void_turn", "truncated", "error"]
"""Why an episode ended: the environment terminated it (``answered``), the turn limit or the
per-episode token budget ran out, a turn with neither an answer nor a tool call (SimpleTIR's void
turn), the environment truncated it, or a failure (see ``Episode.failure``)."""
STOP_REASONS: tuple[str, ...] = get_args(StopReason)

SCHEMA_VERSION = 1


@dataclass
class Segment:
    """A contiguous run of tokens written by one party in one turn."""

    role: Role
    turn: int
    """Index of the policy turn this segment belongs to (the prompt is turn 0, as is the first reply;
    the observation after reply k and reply k+1 carry turn k+1)."""
    token_ids: list[int]
    text: str
    logprobs: list[float] | None = None
    """Engine logprobs, one per token; only for policy segments."""
    weight_version: int | None = None
    """Engine weight version that sampled these tokens; only for policy segments."""

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"segment role {self.role!r} is not one of {ROLES}")
        if self.role == "policy":
            if self.logprobs is None or len(self.logprobs) != len(self.token_ids):
                n = None if self.logprobs is None else len(self.logprobs)
                raise ValueError(
                    f"a policy segment needs one logprob per token: {len(self.token_ids)} tokens, {n} logprobs"
                )
        elif self.logprobs is not None:
            raise ValueError(f"only policy segments carry logprobs (got some on a {self.role} segment)")

    @property
    def trainable(self) -> bool:
        return self.role == "policy"


@dataclass
class Episode:
    """One rollout: the task, every token in order, the outcome."""

    id: str
    env: str
    task_id: str
    seed: int = 0
    segments: list[Segment] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    """The conversation as chat messages (what the environment saw); used by the drift doctor."""
    reward: float = 0.0
    reward_components: dict[str, float] = field(default_factory=dict)
    stop_reason: StopReason | None = None
    failure: Failure | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    group: str | None = None
    """Episodes sampled for the same task in one step share a group id (GRPO groups)."""
    step: int | None = None
    """Training step that produced the episode, if any."""
    sample_breaks: list[dict[str, Any]] = field(default_factory=list)
    """Where a new training sample starts (empty: the whole episode is one sample). Each break is
    ``{"segment": i, "messages": n, "reason": r}``: segments from ``i`` on form the next sample, whose
    prompt renders ``messages[:n]``; ``r`` is ``history`` (the chat template would show the model a
    different history than the one it wrote, e.g. earlier ``<think>`` blocks stripped) or
    ``drift:<kind>`` (an agent's client sent a history that does not extend the recorded one; the kind
    is ``agentrl doctor``'s; the break then also holds ``"before"``, the messages of the sample it
    ends, since the final ``messages`` are the client's rewritten ones, and ``"tools_before"`` when
    the client also changed its tools); or ``compaction`` / ``window`` (the context was full,
    ``rollout.context``): the break then holds ``"context"``, the messages the next sample's prompt
    renders (the task's, then the summary and the latest observation, or the newest whole turns), and from
    it on a sample shows ``context`` then ``messages[n:]``; a compaction also holds the ``"request"``
    and the ``"summary"`` that end the sample before it (the environment never saw them), a window
    its ``"dropped_turns"``. See docs/environments.md."""
    overlays: dict[str, list[float | None]] | None = None
    """Per-token training overlays the trainer attaches after the update (old/new logprob, entropy,
    advantage, weight, selection, clip status). Each list is aligned with ``token_ids()``; entries for
    non-policy tokens are None. See docs/transcripts.md."""

    # -- token views -------------------------------------------------------------------------
    def token_ids(self) -> list[int]:
        return [t for s in self.segments for t in s.token_ids]

    def loss_mask(self) -> list[int]:
        """1 for tokens the policy sampled, 0 for everything else: derived from roles, never stored."""
        return [int(s.trainable) for s in self.segments for _ in s.token_ids]

    def roles(self) -> list[str]:
        return [s.role for s in self.segments for _ in s.token_ids]

    def turns(self) -> list[int]:
        return [s.turn for s in self.segments for _ in s.token_ids]

    def engine_logprobs(self) -> list[float | None]:
        out: list[float | None] = []
        for s in self.segments:
            out.extend(s.logprobs if s.logprobs is not None else [None] * len(s.token_ids))
        return out

    def text(self) -> str:
        return "".join(s.text for s in self.segments)

    # -- samples -----------------------------------------------------------------------------
    @property
    def num_samples(self) -> int:
        """Training sequences this episode gives: 1, plus one per sample break."""
        return 1 + len(self.sample_breaks)

    def begin_sample(
        self,
        messages: int,
        reason: str,
        before: list[dict[str, Any]] | None = None,
        tools_before: list[dict[str, Any]] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        """Start a new training sample at the next segment: its prompt renders ``messages[:messages]``
        (the caller adds it as a ``prompt`` segment next). ``reason``: ``history`` or ``drift:<kind>``.
        ``before``: the messages the ending sample covered, when the episode's final ``messages`` will
        not start with them (a client that rewrote its history); ``tools_before``: the tool schemas it
        was rendered with, when the client changed them (``metrics["tools"]`` will be the new ones).
        ``extra``: more fields, e.g. a compaction's (``agentrl.rollout.context``)."""
        brk: dict[str, Any] = {"segment": len(self.segments), "messages": messages, "reason": reason}
        brk.update(extra or {})
        if before is not None:
            brk["before"] = before
        if tools_before is not None:
            brk["tools_before"] = tools_before
        self.sample_breaks.append(brk)

    def sample_ranges(self) -> list[tuple[int, int]]:
        """Token range [start, end) of each sample in ``token_ids()``, in order."""
        starts = [0]
        for b in self.sample_breaks:
            starts.append(sum(len(s.token_ids) for s in self.segments[: b["segment"]]))
        ends = [*starts[1:], sum(len(s.token_ids) for s in self.segments)]
        return list(zip(starts, ends))

    def context_ids(self) -> list[int]:
        """The token ids of the last sample: what the model sees on its next turn."""
        start = self.sample_breaks[-1]["segment"] if self.sample_breaks else 0
        return [t for s in self.segments[start:] for t in s.token_ids]

    def sample_views(self) -> list[Episode]:
        """One episode per sample, for training and for the doctor: the sample's own segments and the
        messages it covers; id, group, reward, stop reason and failure are the episode's. An unsplit
        episode is its own single view; ``sample_ranges()`` says where each view's tokens are in
        ``token_ids()``."""
        if not self.sample_breaks:
            return [self]
        cuts = [0, *(b["segment"] for b in self.sample_breaks), len(self.segments)]
        message_ends = [b["messages"] for b in self.sample_breaks] + [len(self.messages)]
        views = []
        base: list[dict[str, Any]] = []
        base_from = 0  # a sample shows base, then messages[base_from:] (a compaction's context)
        for i in range(len(cuts) - 1):
            segments = self.segments[cuts[i] : cuts[i + 1]]
            view = Episode(**{k: getattr(self, k) for k in self.__dataclass_fields__})
            ending = self.sample_breaks[i] if i < len(self.sample_breaks) else {}
            shown = [*base, *self.messages[base_from : message_ends[i]]]
            if "summary" in ending:  # the request and the summary that ended this sample
                shown += [
                    {"role": "user", "content": ending["request"]},
                    {"role": "assistant", "content": ending["summary"]},
                ]
            view.segments, view.messages = segments, ending.get("before", shown)
            if "context" in ending:
                base, base_from = ending["context"], ending["messages"]
            if "tools_before" in ending:  # the tools this sample was rendered with
                view.metrics = {**self.metrics, "tools": ending["tools_before"]}
            view.sample_breaks, view.overlays = [], None
            views.append(view)
        return views

    @property
    def prompt_length(self) -> int:
        """Tokens before the first non-prompt segment."""
        n = 0
        for s in self.segments:
            if s.role != "prompt":
                break
            n += len(s.token_ids)
        return n

    @property
    def num_policy_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.segments if s.role == "policy")

    @property
    def num_turns(self) -> int:
        return sum(1 for s in self.segments if s.role == "policy")

    @property
    def failed(self) -> bool:
        return self.failure is not None

    def add(self, segment: Segment) -> None:
        """Append a segment, merging it into the previous one when role and turn agree."""
        if not segment.token_ids and not segment.text:
            return
        last = self.segments[-1] if self.segments else None
        if (
            last is not None
            and not (self.sample_breaks and self.sample_breaks[-1]["segment"] == len(self.segments))
            and last.role == segment.role
            and last.turn == segment.turn
            and last.weight_version == segment.weight_version
        ):
            last.token_ids.extend(segment.token_ids)
            last.text += segment.text
            if last.logprobs is not None and segment.logprobs is not None:
                last.logprobs.extend(segment.logprobs)
            return
        self.segments.append(segment)

    # -- serialization -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["schema"] = SCHEMA_VERSION
        return d

    def to_json(self) -> str:
        """One JSON line, valid JSON even with non-finite floats; the round trip is exact."""
        return json.dumps(_encode_floats(self.to_dict()), ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Episode:
        d = dict(d)
        schema = d.pop("schema", SCHEMA_VERSION)
        if schema > SCHEMA_VERSION:
            raise ValueError(f"episode schema {schema} is newer than this agentrl ({SCHEMA_VERSION})")
        d["segments"] = [Segment(**s) for s in d.get("segments", [])]
        if d.get("failure") is not None:
            d["failure"] = Failure(**d["failure"])
        known = set(cls.__dataclass_fields__)
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown episode fields {sorted(unknown)}; known: {sorted(known)}")
        return cls(**d)

    @classmethod
    def from_json(cls, line: str) -> Episode:
        return cls.from_dict(decode_floats(json.loads(line)))


_FLOAT_TAG = "__float__"


def _encode_floats(x: Any) -> Any:
    # Non-finite floats become {"__float__": "nan"|"inf"|"-inf"}: valid JSON, unambiguous with text.
    if isinstance(x, float) and not math.isfinite(x):
        return {_FLOAT_TAG: repr(x)}
    if isinstance(x, dict):
        return {k: _encode_floats(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_encode_floats(v) for v in x]
    return x


def decode_floats(x: Any) -> Any:
    """The inverse of the float tagging transcripts use for NaN and infinities (JSON has neither)."""
    if isinstance(x, dict):
        if len(x) == 1 and _FLOAT_TAG in x:
            return float(x[_FLOAT_TAG])
        return {k: decode_floats(v) for k, v in x.items()}
    if isinstance(x, list):
        return [decode_floats(v) for v in x]
    return x
