"""Tool and environment outputs cut to ``rollout.max_tool_output_tokens`` before the model reads them.

An output longer than the limit keeps its head (3/4) and tail (1/4) with a marker between them
(``truncate_output``). Tokenizing a 5 MB output only to keep a few hundred of its tokens made a step
about 100 times slower, so an output longer than ``cut_bounds`` characters is first cut by
characters (``cut_long_outputs``): its head and tail, each long enough to hold more tokens than the
token cut keeps of it, are all that is rendered and tokenized.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

from agentrl.env import Message
from agentrl.models.chat import Piece

CHARS_PER_TOKEN = 256
"""More characters than any token of a real vocabulary covers. A byte-level BPE token is at most its
vocabulary's longest entry in bytes, and a character takes at least one byte: the longest entry is
128 bytes in Qwen3's vocabulary (151,643 entries), 81 in SmolLM2's; SentencePiece pieces are shorter
(16 characters by default). So ``k * CHARS_PER_TOKEN`` characters hold at least ``k`` tokens, for
any vocabulary without entries over 256 bytes and a normalizer that does not drop characters. A
cut output of 5 MB is tokenized in about 86,000 characters at the default limit (256 tokens)."""

SEAM_TOKENS = 8
"""Tokens beyond what the token cut keeps, on each side of the character cut: the tokens next to it
may differ from those of the whole text (a word cut in two), and they are never kept. So the model
reads the tokens the whole output would have given it, marker aside (Qwen3's and SmolLM2's tokenizers
on logs, code, text and runs of ``=``), with one exception: where a single pre-token (a run of one
letter, or of spaces) spans the tail's cut, the tail's tokens may be aligned differently on the run
(400,001 ``a``: the last token reads ``aaaaaaaa`` instead of ``a``)."""


class LongToolOutputWarning(UserWarning):
    """A tool (or an environment message) returned an output long enough to be cut by characters."""


_warned: set[str] = set()
_warned_lock = threading.Lock()


def cut_bounds(cap: int) -> tuple[int, int]:
    """(head, tail) characters kept of an output cut by characters for a limit of ``cap`` tokens: the
    token cut keeps at most ``cap`` tokens of the head and ``cap // 4`` of the tail, and each side
    holds ``SEAM_TOKENS`` more."""
    return (cap + SEAM_TOKENS) * CHARS_PER_TOKEN, (cap // 4 + SEAM_TOKENS) * CHARS_PER_TOKEN


def cut_long_outputs(messages: list[Message], cap: int) -> tuple[list[Message], dict[int, int]]:
    """``messages`` with each content longer than the ``cut_bounds`` cut to its head and tail around
    a marker, and {message index: its length in characters} for those cut. The first cut output of
    each tool (or message role) in this process is a ``LongToolOutputWarning`` naming it."""
    head, tail = cut_bounds(cap)
    out, sizes = [], {}
    for i, msg in enumerate(messages):
        content = msg.get("content")
        if not isinstance(content, str) or len(content) <= head + tail:
            out.append(msg)
            continue
        sizes[i] = len(content)
        out.append({**msg, "content": content[:head] + _marker(len(content)) + content[-tail:]})
        _warn_once(msg, len(content), head, tail, cap)
    return out, sizes


def _marker(chars: int) -> str:
    return f"\n...[{chars} characters, truncated]...\n"


def _warn_once(msg: Message, chars: int, head: int, tail: int, cap: int) -> None:
    if msg.get("role") != "tool":
        who = f"a {msg.get('role')!r} message"
    else:  # an agent's tool messages (OpenAI's format) may carry no name
        who = f"tool {msg['name']!r}" if msg.get("name") else "a tool message without a name"
    with _warned_lock:
        if who in _warned:
            return
        _warned.add(who)
    warnings.warn(
        f"{who} returned {chars:,} characters; only its first {head:,} and last {tail:,} are tokenized, "
        f"and the model reads {cap} tokens of them (rollout.max_tool_output_tokens). Warned once per tool",
        LongToolOutputWarning,
        stacklevel=2,
    )


def truncate_outputs(tokenizer: Any, pieces: list[Piece], cap: int, cut: dict[int, int]) -> list[Piece]:
    """``truncate_output`` of each piece; ``cut``: the lengths of the messages cut by characters
    (``cut_long_outputs``), by message index."""
    return [
        truncate_output(tokenizer, p, cap, None if p.message_index is None else cut.get(p.message_index))
        for p in pieces
    ]


def truncate_output(tokenizer: Any, piece: Piece, cap: int, chars: int | None = None) -> Piece:
    """Keep the head (3/4) and tail (1/4) of a tool/env output longer than ``cap`` tokens, with a
    marker between them; the result, marker included, fits ``cap`` (``max_tool_output_tokens``).
    ``chars``: the output's length when it was cut by characters (``cut_long_outputs``): it is always
    truncated, and the marker gives that length, as its length in tokens is not known."""
    n = len(piece.token_ids)
    if piece.role not in ("tool", "env") or (n <= cap and chars is None):
        return piece
    size = f"{n} tokens" if chars is None else f"{chars} characters"
    marker = tokenizer(f"\n...[{size}, truncated]...\n", add_special_tokens=False)["input_ids"]
    keep = max(cap - len(marker), 0)
    n_tail = min(keep // 4, n)  # less than keep // 4, and than keep - n_tail of the head, only
    n_head = min(keep - n_tail, n - n_tail)  # where an output cut by characters has few tokens
    ids = piece.token_ids[:n_head] + marker + (piece.token_ids[n - n_tail :] if n_tail else [])
    ids = ids[:cap]
    text = tokenizer.decode(ids, skip_special_tokens=False)
    return Piece(piece.role, ids, text, piece.message_index)
