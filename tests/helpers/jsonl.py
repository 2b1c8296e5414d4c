"""Reading JSONL files in tests: records end at "\\n" only. ``str.splitlines`` would also split at
U+0085, U+2028 and U+2029, which JSON leaves unescaped and a sampling policy can write."""

from __future__ import annotations

from pathlib import Path


def lines(path: Path) -> list[str]:
    """The non-empty records of a JSONL file."""
    return [x for x in Path(path).read_text().split("\n") if x.strip()]
