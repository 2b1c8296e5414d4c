"""Stop-string detection shared by the engines: decode only a short tail after each new token.

A stop string of ``n`` UTF-8 bytes that the latest token completes lies inside the last ``n`` tokens
(every token decodes to at least one byte), so decoding the last ``n + 1`` tokens is enough: the extra
token keeps a character split across tokens from hiding the string's first character. Checking
after every token means the first match is always the one the latest token completed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def token_decoder(tokenizer: Any) -> Callable[[list[int]], str]:
    """The cheapest exact ``ids -> text`` for ``tokenizer`` (special tokens kept as text)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return lambda ids: backend.decode(ids, skip_special_tokens=False)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=False)


class StopStringMatcher:
    """Tells whether the newest token of a growing completion completed one of ``stops``."""

    def __init__(self, stops: Sequence[str], decode: Callable[[list[int]], str]) -> None:
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        self.stops = tuple(stops)
        self.window = max((len(s.encode()) for s in self.stops), default=0) + 1
        self._decode = decode

    def match(self, ids: Sequence[int]) -> str | None:
        """The stop string found in the tail of ``ids``, or None. Call once per appended token."""
        if not self.stops:
            return None
        tail = self._decode(list(ids[-self.window :]))
        for s in self.stops:
            if s in tail:
                return s
        return None
