"""Which tokens a token-weighting method selects, read back from its runs' transcripts: the per-token
``selected`` overlay (+1 boosted, e.g. STARE's W; -1 damped or masked, e.g. its M; docs/transcripts.md)
over the policy tokens each update trained on, counted by token."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agentrl.transcripts import iter_episodes, transcripts_path

SELECTIONS_FILE = "selections.json"
"""A run's counts, written beside its transcripts when the study archives it (``study/archive.py``)."""


@dataclass
class Selections:
    """Counts over the trained policy tokens of some runs, by token id."""

    trained: Counter = field(default_factory=Counter)
    boosted: Counter = field(default_factory=Counter)
    damped: Counter = field(default_factory=Counter)
    entropy: defaultdict = field(default_factory=lambda: defaultdict(float))
    """Sum of the entropy at the position that wrote each token id (over its trained occurrences)."""

    def add_runs(self, run_dirs: Sequence[Path]) -> Selections:
        for run_dir in run_dirs:
            self.merge(Selections.of_run(run_dir))
        return self

    @classmethod
    def of_run(cls, run_dir: Path) -> Selections:
        """One run's counts: its ``selections.json`` when it has one (an archived run keeps no
        transcripts), else counted from its transcripts (none: empty)."""
        if (Path(run_dir) / SELECTIONS_FILE).exists():
            return cls.load(Path(run_dir) / SELECTIONS_FILE)
        return cls()._count(run_dir) if transcripts_path(run_dir).exists() else cls()

    def merge(self, other: Selections) -> None:
        self.trained.update(other.trained)
        self.boosted.update(other.boosted)
        self.damped.update(other.damped)
        for tok, h in other.entropy.items():
            self.entropy[tok] += h

    def save(self, path: Path) -> None:
        """As ``{token id: [trained, boosted, damped, entropy sum]}``."""
        rows = {
            str(t): [n, self.boosted[t], self.damped[t], round(self.entropy[t], 6)]
            for t, n in self.trained.items()
        }
        Path(path).write_text(json.dumps(rows, separators=(",", ":")))

    @classmethod
    def load(cls, path: Path) -> Selections:
        s = cls()
        for key, (n, boosted, damped, h) in json.loads(Path(path).read_text()).items():
            t = int(key)
            s.trained[t], s.entropy[t] = n, h
            if boosted:
                s.boosted[t] = boosted
            if damped:
                s.damped[t] = damped
        return s

    def _count(self, run_dir: Path) -> Selections:
        for ep in iter_episodes(run_dir):
            ov = ep.overlays
            if not ov or "selected" not in ov:
                continue
            ids = ep.token_ids()
            for t, (sel, trained) in enumerate(zip(ov["selected"], ov["trained"])):
                if sel is None or not trained:
                    continue
                tok = ids[t]
                self.trained[tok] += 1
                self.entropy[tok] += ov["entropy"][t] or 0.0
                if sel > 0:
                    self.boosted[tok] += 1
                elif sel < 0:
                    self.damped[tok] += 1
        return self

    def fraction(self, which: Counter) -> float:
        total = sum(self.trained.values())
        return sum(which.values()) / total if total else 0.0

    def top(self, which: Counter, decode: Callable[[int], str], n: int = 8) -> list[str]:
        """The ``n`` tokens selected most often: text, count, the share of that token's trained
        occurrences that were selected, and the mean entropy where it was written."""
        out = []
        for tok, count in which.most_common(n):
            share = count / self.trained[tok]
            out.append(
                f"{_code(decode(tok))} {count} ({share:.0%}, H {self.entropy[tok] / self.trained[tok]:.2f})"
            )
        return out


def _code(text: str) -> str:
    """A token's text as a markdown code span inside a table cell: its repr (whitespace visible),
    pipes escaped, doubled backticks when it holds one."""
    shown = repr(text).replace("|", "\\|")
    return f"`` {shown} ``" if "`" in shown else f"`{shown}`"


def token_lines(by_method_dirs: dict[str, list[Path]], decode: Callable[[int], str]) -> list[str]:
    """The report's lines: for each method whose runs selected tokens, the share of trained tokens
    it boosted and damped, and the tokens it boosted and damped most often."""
    rows = []
    for method, dirs in by_method_dirs.items():
        s = Selections().add_runs(dirs)
        if not (s.boosted or s.damped):
            continue
        rows.append(
            f"| {method} | {sum(s.trained.values())} | {s.fraction(s.boosted):.1%} | "
            f"{', '.join(s.top(s.boosted, decode)) or '–'} | {s.fraction(s.damped):.1%} | "
            f"{', '.join(s.top(s.damped, decode)) or '–'} |"
        )
    if not rows:
        return []
    return [
        "",
        "**Which tokens the methods select** (every seed and step, from the transcripts' `selected` "
        "overlay; each token: how often it was selected, the share of its trained occurrences that "
        "were, and the mean entropy where it was written):",
        "",
        "| method | trained tokens | boosted | boosted most often | damped | damped most often |",
        "|---|---|---|---|---|---|",
        *rows,
    ]
