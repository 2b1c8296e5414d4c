"""Turn chat messages into token pieces with roles, without ever re-tokenizing policy text.

The runner owns the token sequence. The first prompt is rendered with the tokenizer's chat template.
After each policy turn, the observation is rendered as a *delta*: we render a fixed base conversation
that ends with an assistant message, and the same base followed by the new messages (plus the
generation prompt for the next assistant turn); the suffix is exactly what the template would put
after an assistant turn. That works for any prefix-stable template without parsing it.

Inside a delta, the content of each message is located and tagged with the message's role (``tool``
for tool output, ``env`` for the environment's user messages); the rest is ``scaffold`` (role
headers, end-of-turn markers). Content is tokenized with special tokens split, so text printed by
model-written code can never forge a control token such as ``<|im_end|>``.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

_ENCODE_LOCK = threading.Lock()
_SENTINEL = "\u2063agentrl\u2063sentinel\u2063"
_BASE = [{"role": "user", "content": "base"}, {"role": "assistant", "content": _SENTINEL}]


@dataclass
class Piece:
    role: str  # "prompt" | "tool" | "env" | "scaffold"
    token_ids: list[int]
    text: str
    message_index: int | None = None
    """Index (in the observation) of the message this piece carries the content of, if any."""


def _message_role(msg: dict[str, Any]) -> str:
    return "tool" if msg.get("role") == "tool" else "env"


class ChatRenderer:
    """Renders prompts and observation deltas for one tokenizer (and one tool set)."""

    def __init__(self, tokenizer: Any, tools: Sequence[dict[str, Any]] | None = None) -> None:
        self.tokenizer = tokenizer
        self.tools = list(tools) if tools else None
        self._backends: dict[bool, Any] | None = None
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None and hasattr(backend, "encode_special_tokens"):
            self._backends = {}
            for split in (False, True):
                private = copy.deepcopy(backend)
                private.encode_special_tokens = split
                self._backends[split] = private
        base = self._render(_BASE, add_generation_prompt=False)
        cut = base.rindex(_SENTINEL) + len(_SENTINEL)
        self._base_text = base
        self.assistant_close = base[cut:]
        """What the template writes after an assistant message's content (e.g. ``<|im_end|>\\n``)."""
        self.eos_token_id: int | None = tokenizer.convert_tokens_to_ids(self._eos_token())

    def _eos_token(self) -> str:
        # The end-of-turn token is whatever starts the assistant closing (ChatML: <|im_end|>).
        close = self.assistant_close
        for tok in sorted(self.tokenizer.all_special_tokens, key=len, reverse=True):
            if close.startswith(tok):
                return tok
        return self.tokenizer.eos_token

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=self.tools, add_generation_prompt=add_generation_prompt, tokenize=False
        )

    def encode(self, text: str, split_special: bool) -> list[int]:
        """Token ids of ``text``. With ``split_special``, text such as ``<|im_end|>`` is encoded as
        ordinary characters, never as the control token.

        Thread-safe: transformers implements ``split_special_tokens=`` by flipping a flag on the
        shared Rust tokenizer for the duration of the call, so two threads encoding at once (the
        async runner) could corrupt each other's ids. We encode with two private copies of the
        backend tokenizer, one per setting, and never touch the shared one."""
        if not text:
            return []
        if self._backends is not None:
            return list(self._backends[split_special].encode(text, add_special_tokens=False).ids)
        with _ENCODE_LOCK:
            out = self.tokenizer(text, add_special_tokens=False, split_special_tokens=split_special)
            return list(out["input_ids"])

    # -- the first prompt --------------------------------------------------------------------
    def render_prompt(self, messages: list[dict[str, Any]]) -> Piece:
        text = self._render(messages, add_generation_prompt=True)
        return Piece("prompt", self.encode(text, split_special=False), text)

    # -- after a policy turn -----------------------------------------------------------------
    def close_turn(self, policy_text: str, ended_with_eos: bool) -> Piece:
        """Scaffold that completes the assistant turn: the template's closing minus what the policy
        already wrote (normally the end-of-turn token itself, when generation stopped on it)."""
        close = self.assistant_close
        if ended_with_eos:
            for k in range(len(close), 0, -1):
                if policy_text.endswith(close[:k]):
                    close = close[k:]
                    break
        return Piece("scaffold", self.encode(close, split_special=False), close)

    def render_observation(
        self, messages: list[dict[str, Any]], generation_prompt: bool = True
    ) -> list[Piece]:
        """Pieces for new messages after an assistant turn (after its closing), ending with the
        next assistant header when ``generation_prompt``."""
        full = self._render(_BASE + list(messages), add_generation_prompt=generation_prompt)
        if not full.startswith(self._base_text):
            raise ValueError(
                "the chat template is not prefix-stable: rendering more messages changed the rendering "
                "of earlier ones, so observations cannot be appended as deltas"
            )
        delta = full[len(self._base_text) :]
        pieces: list[Piece] = []
        pos = 0
        for i, msg in enumerate(messages):
            content = str(msg.get("content", ""))
            at = delta.find(content, pos) if content else -1
            if at < 0:
                continue  # the template rewrote this content; it stays inside the scaffold text
            if at > pos:
                pieces.append(Piece("scaffold", self.encode(delta[pos:at], False), delta[pos:at]))
            pieces.append(Piece(_message_role(msg), self.encode(content, True), content, message_index=i))
            pos = at + len(content)
        if pos < len(delta):
            pieces.append(Piece("scaffold", self.encode(delta[pos:], False), delta[pos:]))
        return pieces
