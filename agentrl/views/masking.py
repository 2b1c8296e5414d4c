"""The doctor's masking check: tool and environment feedback never enters the loss, and what a tool
returned reaches the model.

Read from a transcript alone: the loss mask is ``role == "policy"`` by construction
(docs/transcripts.md), and the trainer's ``trained`` overlay records, token by token, which tokens
the update actually used. A token the policy did not write with ``trained == 1`` is a masking bug; a
``tool`` message whose content is in no tool segment's text means the model never saw it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agentrl.episode import Episode


@dataclass(frozen=True)
class MaskingReport:
    episodes: int
    tool_episodes: int
    """Episodes with at least one ``tool`` segment."""
    tool_tokens: int
    feedback_trained: int
    """Tokens the policy did not write whose ``trained`` overlay is 1: must be 0."""
    tool_messages: int
    tool_messages_seen: int
    """``tool`` messages whose content is in a tool segment (what the model was shown)."""
    with_overlay: int
    """Episodes carrying the ``trained`` overlay (older transcripts do not)."""

    @property
    def ok(self) -> bool:
        return self.feedback_trained == 0 and self.tool_messages_seen == self.tool_messages


def masking_report(episodes: Sequence[Episode]) -> MaskingReport:
    tool_episodes = tool_tokens = trained = messages = seen = with_overlay = 0
    for ep in episodes:
        roles = ep.roles()
        tool_tokens += sum(r == "tool" for r in roles)
        tool_episodes += any(s.role == "tool" for s in ep.segments)
        flags = (ep.overlays or {}).get("trained")
        if flags is not None and len(flags) == len(roles):
            with_overlay += 1
            trained += sum(1 for r, f in zip(roles, flags, strict=True) if r != "policy" and f == 1)
        shown = "".join(s.text for s in ep.segments if s.role == "tool")
        for m in ep.messages:
            if m.get("role") == "tool":
                messages += 1
                seen += str(m.get("content") or "").strip() in shown
    return MaskingReport(len(episodes), tool_episodes, tool_tokens, trained, messages, seen, with_overlay)


def masking_lines(report: MaskingReport) -> list[str]:
    """The doctor's lines (rich markup)."""
    r = report
    if not r.tool_episodes:
        return []
    colour = "green" if r.ok else "red"
    return [
        f"[{colour}]masking: {r.tool_tokens} tool tokens in {r.tool_episodes} of {r.episodes} episode(s); "
        f"{r.feedback_trained} of them (or of any feedback token) in the loss, over the {r.with_overlay} "
        f"episode(s) with the trained overlay; {r.tool_messages_seen} of {r.tool_messages} tool results "
        f"shown to the model[/{colour}]"
    ]
