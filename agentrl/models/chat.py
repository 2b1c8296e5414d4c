"""Turn chat messages into token pieces with roles, without ever re-tokenizing policy text.

The runner owns the token sequence. The first prompt is rendered with the tokenizer's chat template.
After each policy turn, the observation is rendered as a *delta*: we render a fixed base conversation
that ends with an assistant message whose content is a sentinel, followed by the new messages (plus
the generation prompt for the next assistant turn), and take everything after the sentinel and the
template's assistant closing. That is exactly what the template puts after an assistant turn, for any
template, without parsing it: prefix-stable ones (the delta equals ``render(base + new)[len(render(base)):]``)
and ones that render an earlier assistant turn differently once more messages follow (a Qwen3-style
template drops its reasoning before a new user message; the sentinel turn has none to drop).

Inside a delta, the content of each message is located and tagged with the message's role (``tool``
for tool output, ``env`` for the environment's user messages); the rest is ``scaffold`` (role
headers, end-of-turn markers). Content is tokenized with special tokens split, so text printed by
model-written code can never forge a control token such as ``<|im_end|>``.
"""

from __future__ import annotations

import copy
import re
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_ENCODE_LOCK = threading.Lock()
_BACKENDS: weakref.WeakKeyDictionary[Any, tuple[int, dict[bool, Any]]] = weakref.WeakKeyDictionary()
_BACKENDS_LOCK = threading.Lock()


def private_backends(tokenizer: Any) -> dict[bool, Any] | None:
    """Two private copies of ``tokenizer``'s Rust backend, one that encodes special-token text as the
    control token (False) and one that splits it into ordinary characters (True): ``ChatRenderer.encode``
    uses them instead of flipping the shared tokenizer's flag. Made once per tokenizer and vocabulary
    size: a deep copy of a large vocabulary's is slow, and every rollout batch builds its renderers
    anew (docs/performance.md#on-one-gpu-smollm2-135m-instruct-on-an-nvidia-h200-bf16).
    None when the tokenizer has no such backend (a slow tokenizer)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not hasattr(backend, "encode_special_tokens"):
        return None
    size = backend.get_vocab_size(with_added_tokens=True)
    with _BACKENDS_LOCK:
        cached = _BACKENDS.get(tokenizer)
        if cached is None or cached[0] != size:  # tokens added since: copy again
            copies = {}
            for split in (False, True):
                private = copy.deepcopy(backend)
                private.encode_special_tokens = split
                copies[split] = private
            cached = _BACKENDS[tokenizer] = (size, copies)
    return cached[1]


_SENTINEL = "\u2063agentrl\u2063sentinel\u2063"
_BASE = [{"role": "user", "content": "base"}, {"role": "assistant", "content": _SENTINEL}]
_MARKER = "\u2063agentrl\u2063content\u2063{}\u2063"
_MARKER_RE = re.compile("\u2063agentrl\u2063content\u2063(\\d+)\u2063")


@dataclass
class Piece:
    role: str  # "prompt" | "tool" | "env" | "scaffold"
    token_ids: list[int]
    text: str
    message_index: int | None = None
    """Index (in the observation) of the message this piece carries the content of, if any."""


def _message_role(msg: dict[str, Any]) -> str:
    return "tool" if msg.get("role") == "tool" else "env"


TOOLS_PROMPTS = ("template", "auto", "system")
"""Where the tool schemas go. ``template``: to the chat template's ``tools`` argument (what the
template does with them is the template's business); ``auto``: the template when it renders them,
else the system message; ``system``: always the system message, in agentrl's words."""


def renders_tools(tokenizer: Any, tools: Sequence[dict[str, Any]]) -> bool:
    """Does the chat template show ``tools``? (SmolLM2's ChatML template has no tools section and
    drops them without a word.)"""
    probe = [{"role": "user", "content": "hi"}]
    with_tools = tokenizer.apply_chat_template(
        probe, tools=list(tools), tokenize=False, add_generation_prompt=True
    )
    without = tokenizer.apply_chat_template(probe, tools=None, tokenize=False, add_generation_prompt=True)
    return bool(with_tools != without)


def reads_enable_thinking(tokenizer: Any) -> bool:
    """Does the chat template read ``enable_thinking`` (Qwen3's switch: ``False`` turns thinking
    off)? It does when the generation prompt it renders depends on the value."""
    probe = [{"role": "user", "content": "hi"}]
    try:
        off, on = (
            tokenizer.apply_chat_template(
                probe, tokenize=False, add_generation_prompt=True, enable_thinking=v
            )
            for v in (False, True)
        )
    except Exception:  # no chat template, or one that rejects the probe: no switch to use
        return False
    return bool(off != on)


def tools_section(tools: Sequence[dict[str, Any]], tool_format: str) -> str:
    """The system-prompt text that shows ``tools`` and how to call them in ``tool_format``."""
    import json

    listing = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    if tool_format == "llama3":
        how = 'To call one, reply with only a JSON object: {"name": "TOOL", "parameters": {"ARG": VALUE}}.'
    else:
        how = (
            "To call one, write its name and arguments as JSON between <tool_call> and </tool_call>, e.g. "
            '<tool_call>{"name": "TOOL", "arguments": {"ARG": VALUE}}</tool_call>. You may call several.'
        )
    return f"You can use these tools:\n<tools>\n{listing}\n</tools>\n{how} Each result comes back in the next message."


class ChatRenderer:
    """Renders prompts and observation deltas for one tokenizer (and one tool set). ``tools_prompt``
    (``TOOLS_PROMPTS``) says where the tool schemas go; with ``system`` placement they are written
    into the conversation's system message by ``prompt_messages`` (the runner and the SFT warm start
    call it, so the transcript holds exactly what the model read) and the template gets none.
    ``python`` tool calls (a fenced code block) are described by the environment's own prompt.
    ``template_kwargs`` go to every render (``with_template_kwargs``)."""

    def __init__(
        self,
        tokenizer: Any,
        tools: Sequence[dict[str, Any]] | None = None,
        tools_prompt: str = "template",
        tool_format: str = "json",
    ) -> None:
        if tools_prompt not in TOOLS_PROMPTS:
            raise ValueError(f"tools_prompt={tools_prompt!r}; valid: {', '.join(TOOLS_PROMPTS)}")
        self.tokenizer = tokenizer
        self.template_kwargs: dict[str, Any] = {}
        self.tools = list(tools) if tools else None
        self.tools_text: str | None = None
        """The tools section written into the system message (None: the template shows the tools)."""
        placeable = self.tools and tools_prompt != "template" and tool_format != "python"
        if placeable and (tools_prompt == "system" or not renders_tools(tokenizer, self.tools or [])):
            self.tools_text, self.tools = tools_section(self.tools or [], tool_format), None
        self._backends = private_backends(tokenizer)
        self._generation_prompts: dict[str, str] = {}  # shared with with_template_kwargs' copies
        base = self._render(_BASE, add_generation_prompt=False)
        if base.count(_SENTINEL) != 1:
            raise ValueError(
                "the chat template does not render an assistant message's content verbatim (once), so "
                "observations cannot be rendered as deltas after it"
            )
        self.assistant_close = base[base.index(_SENTINEL) + len(_SENTINEL) :]
        """What the template writes after an assistant message's content (e.g. ``<|im_end|>\\n``)."""
        self.eos_token_id: int | None = tokenizer.convert_tokens_to_ids(self._eos_token())

    def generation_prompt(self) -> str:
        """The text the template adds to open an assistant turn (ChatML: ``<|im_start|>assistant\\n``;
        DeepSeek-R1's also opens ``<think>``), with this renderer's template arguments: what a stop
        condition reads before the turn's own text (``agentrl/models/stopping.py``)."""
        key = repr(sorted(self.template_kwargs.items()))
        if key not in self._generation_prompts:
            user = [{"role": "user", "content": "base"}]
            with_prompt, without = self._render(user, True), self._render(user, False)
            found = with_prompt[len(without) :] if with_prompt.startswith(without) else ""
            self._generation_prompts[key] = found
        return self._generation_prompts[key]

    def with_template_kwargs(self, kwargs: Mapping[str, Any]) -> ChatRenderer:
        """This renderer with ``kwargs`` passed to every render of the chat template (``{"enable_thinking":
        False}``), sharing its tokenizer copies. For arguments that change what follows the
        generation prompt, not how an assistant turn closes (``assistant_close`` is kept)."""
        if dict(kwargs) == self.template_kwargs:
            return self
        other = copy.copy(self)
        other.template_kwargs = dict(kwargs)
        return other

    def _eos_token(self) -> str:
        # The end-of-turn token is whatever starts the assistant closing (ChatML: <|im_end|>).
        # Gemma's <end_of_turn> is a special added token but not a named special token, so the
        # added tokens marked special are candidates too.
        close = self.assistant_close
        added = getattr(self.tokenizer, "added_tokens_decoder", {}) or {}
        candidates = {*self.tokenizer.all_special_tokens, *(t.content for t in added.values() if t.special)}
        for tok in sorted(candidates, key=len, reverse=True):
            if close.startswith(tok):
                return tok
        return self.tokenizer.eos_token

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages,
            tools=self.tools,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **self.template_kwargs,
        )

    def render_text(self, messages: list[dict[str, Any]], generation_prompt: bool) -> str:
        """The template's full render of ``messages`` (with this renderer's tools), as text."""
        return self._render(list(messages), add_generation_prompt=generation_prompt)

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
    def prompt_messages(self, messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """``messages`` with the tools section in the system message when the tools go there: added
        to the first system message, or as a new one before the rest (once)."""
        out = [dict(m) for m in messages]
        if self.tools_text is None:
            return out
        if out and out[0].get("role") == "system":
            content = str(out[0].get("content") or "")
            if self.tools_text not in content:
                out[0]["content"] = f"{content}\n\n{self.tools_text}" if content else self.tools_text
            return out
        return [{"role": "system", "content": self.tools_text}, *out]

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
        delta, spans = self.locate_contents(list(messages), generation_prompt)
        contents = [_text(m) for m in messages]
        pieces: list[Piece] = []
        pos = 0
        for at, i in spans:
            if at > pos:
                pieces.append(Piece("scaffold", self.encode(delta[pos:at], False), delta[pos:at]))
            content = contents[i]
            pieces.append(
                Piece(_message_role(messages[i]), self.encode(content, True), content, message_index=i)
            )
            pos = at + len(content)
        if pos < len(delta):
            pieces.append(Piece("scaffold", self.encode(delta[pos:], False), delta[pos:]))
        return pieces

    def _delta(self, messages: list[dict[str, Any]], generation_prompt: bool) -> str:
        full = self._render(_BASE + messages, add_generation_prompt=generation_prompt)
        anchor = _SENTINEL + self.assistant_close
        if full.count(anchor) != 1:
            raise ValueError(
                "the chat template renders the assistant turn before an observation differently from a "
                "final one (its closing changed, or its content was rewritten), so observations cannot "
                "be appended as deltas after it"
            )
        return full[full.index(anchor) + len(anchor) :]

    def locate_contents(
        self, messages: list[dict[str, Any]], generation_prompt: bool, delta: bool = True
    ) -> tuple[str, list[tuple[int, int]]]:
        """The render of ``messages`` (the delta after an assistant turn, or with ``delta=False`` the
        full render) and (start, message index) of each message content it holds verbatim, in order.

        Rendered with a marker in place of each content, the template shows exactly where contents
        go; that is used when putting the contents back gives the real render. Searching for each
        content in order could match template text instead (a tool that prints ``user`` inside a
        Qwen ``<|im_start|>user`` turn), so the search is only the fallback for templates that rewrite
        content. Assistant contents are marked only in deltas: a full render may rewrite them (a
        thinking template strips earlier reasoning), so there they stay inside the template text."""

        def render(msgs: list[dict[str, Any]]) -> str:
            return self._delta(msgs, generation_prompt) if delta else self._render(msgs, generation_prompt)

        text = render(messages)
        contents = [_text(m) for m in messages]
        marks = [bool(c) and (delta or m.get("role") != "assistant") for c, m in zip(contents, messages)]
        marked = [{**m, "content": _MARKER.format(i)} if marks[i] else m for i, m in enumerate(messages)]
        try:
            parts = _MARKER_RE.split(render(marked))  # [text, index, text, index, ..., text]
        except Exception:  # a template that rejects the markers: search instead
            parts = []
        indices = [int(x) for x in parts[1::2]]
        rebuilt = "".join(p if k % 2 == 0 else contents[int(p)] for k, p in enumerate(parts))
        if parts and len(set(indices)) == len(indices) and rebuilt == text:
            spans: list[tuple[int, int]] = []
            at = 0
            for k, part in enumerate(parts):
                if k % 2:
                    spans.append((at, int(part)))
                at += len(contents[int(part)]) if k % 2 else len(part)
            return text, spans
        spans, pos = [], 0
        for i, content in enumerate(contents):
            found = text.find(content, pos) if content else -1
            if found >= 0:  # not found: the template rewrote it; it stays inside the scaffold text
                spans.append((found, i))
                pos = found + len(content)
        return text, spans


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else ""
