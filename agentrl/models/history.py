"""When the chat template would show the model a different history than the one it wrote.

The runner keeps the token ids the model sampled and appends observations as deltas, so the training
sequence is exactly what the model produced. Some templates re-render earlier turns differently: a
Qwen3-style thinking template drops the ``<think>`` block of every assistant turn that comes before
the last user message. A server running that template would show the model a history without its
earlier thinking, so a sequence that keeps it trains the model on a context it never sees when served.

``rollout.history`` decides (``agentrl.models.chat_templates.probe_history`` probes the template once):

- ``merge``: one sample per episode, observations appended as deltas; right when the template keeps
  thinking (every non-thinking template, and thinking templates that preserve it);
- ``split``: the model's own thinking tokens stay in the sample that produced them; where the served
  history would differ from the sample, a new sample starts whose prompt is the template's render of
  the conversation so far (``Episode.begin_sample``, reason ``history``). Every sample trains with the
  episode's advantage; a split episode counts once in its group;
- ``auto`` (default): ``split`` when the probe finds the template strips thinking, else ``merge``.
"""

from __future__ import annotations

from typing import Any

from agentrl.episode import Episode
from agentrl.models.chat import ChatRenderer, Piece
from agentrl.models.chat_templates import HistoryProbe, resolve_history

HISTORY_SETTINGS = ("auto", "split", "merge")


class HistoryPolicy:
    """``rollout.history`` resolved for one tokenizer: whether and where episodes split."""

    def __init__(self, tokenizer: Any, setting: str = "auto") -> None:
        if setting not in HISTORY_SETTINGS:
            raise ValueError(f"rollout.history is {setting!r}; valid: {', '.join(HISTORY_SETTINGS)}")
        self.setting = setting
        self.probe: HistoryProbe = resolve_history(setting, tokenizer)  # type: ignore[arg-type]

    @property
    def split(self) -> bool:
        return self.probe.policy == "split"

    def record(self, episode: Episode) -> None:
        """Note on the episode which policy applied and why, when it matters: the template strips
        thinking, or the config chose the policy (``agentrl doctor`` prints it)."""
        if self.probe.strips_thinking or self.setting != "auto":
            episode.metrics["history"] = {"policy": self.probe.policy, "reason": self.probe.reason}

    def must_split(
        self, renderer: ChatRenderer, episode: Episode, messages: list[dict[str, Any]], delta: list[Piece]
    ) -> bool:
        """With ``split``: whether the template's render of ``messages`` (the conversation including
        the new observation, ready for the next turn) differs from the current sample followed by
        ``delta``, the observation rendered as a delta."""
        if not self.split:
            return False
        start = episode.sample_breaks[-1]["segment"] if episode.sample_breaks else 0
        current = "".join(s.text for s in episode.segments[start:]) + "".join(p.text for p in delta)
        return renderer.render_text(messages, generation_prompt=True) != current


def history_pieces(renderer: ChatRenderer, messages: list[dict[str, Any]]) -> list[Piece]:
    """The prompt of a new sample: the template's render of ``messages`` with the generation prompt.
    Tool outputs are tagged ``tool``, everything else ``prompt``; the contents of tool, user and system
    messages are encoded with special tokens split, so text a tool printed cannot become a control
    token (as in ``ChatRenderer.render_observation``). Assistant contents stay in the template's text
    (a thinking template rewrites them)."""
    text, spans = renderer.locate_contents(messages, generation_prompt=True, delta=False)
    pieces: list[Piece] = []
    pos = 0
    for start, i in spans:
        msg = messages[i]
        content = str(msg.get("content") or "")
        if start > pos:
            pieces.append(Piece("prompt", renderer.encode(text[pos:start], False), text[pos:start]))
        role = "tool" if msg.get("role") == "tool" else "prompt"
        pieces.append(Piece(role, renderer.encode(content, True), content, message_index=i))
        pos = start + len(content)
    if pos < len(text):
        pieces.append(Piece("prompt", renderer.encode(text[pos:], False), text[pos:]))
    return pieces
