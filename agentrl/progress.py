"""Live progress for training: a rich progress bar with the step's key metrics, and a summary table
at the end. Falls back to one plain line per step when the output is not a terminal (CI logs)."""

from __future__ import annotations

import sys
import time
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

SHOWN = [
    ("reward", "reward/mean", "{:.3f}"),
    ("entropy", "entropy/mean", "{:.3f}"),
    ("len", "length/policy_tokens", "{:.0f}"),
    ("tok/s", "tokens/s", "{:.0f}"),
    ("s/step", "time/step_s", "{:.1f}"),
]


def _fmt(metrics: dict[str, Any]) -> str:
    parts = []
    for label, key, fmt in SHOWN:
        v = metrics.get(key)
        if isinstance(v, (int, float)):
            parts.append(f"{label} {fmt.format(v)}")
    gate = metrics.get("stare/gate_on")
    if gate is not None:
        parts.append(f"gate {'on' if gate else 'off'}")
    return "  ".join(parts)


class TrainProgress:
    def __init__(
        self, total_steps: int, start_step: int = 0, console: Console | None = None, every: int = 1
    ) -> None:
        self.console = console or Console(stderr=True)
        self.total, self.start, self.every = total_steps, start_step, every
        self.interactive = self.console.is_terminal
        self.first: dict[str, Any] | None = None
        self.last: dict[str, Any] = {}
        self.t0 = time.perf_counter()
        self.progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            TextColumn("left"),
            TimeRemainingColumn(),
            console=self.console,
        )

    def __enter__(self) -> TrainProgress:
        if self.interactive:
            self.progress.start()
        self.task = self.progress.add_task("train", total=self.total, completed=self.start, info="")
        return self

    def update(self, step: int, metrics: dict[str, Any]) -> None:
        self.first = self.first or metrics
        self.last = metrics
        self.progress.update(self.task, completed=step + 1, info=_fmt(metrics))
        if not self.interactive and (step % self.every == 0 or step + 1 == self.total):  # logging.log_every
            print(f"step {step + 1}/{self.total}  {_fmt(metrics)}", file=sys.stderr, flush=True)

    def __exit__(self, *exc: object) -> None:
        if self.interactive:
            self.progress.stop()
        if self.first is None:
            return
        table = Table(title=f"training summary ({time.perf_counter() - self.t0:.0f}s)")
        table.add_column("metric")
        table.add_column("first step", justify="right")
        table.add_column("last step", justify="right")
        keys = [
            "reward/mean",
            "reward/correct",
            "entropy/mean",
            "entropy/rollout",
            "length/policy_tokens",
            "groups/informative",
            "stare/gate_on",
            "stare/w",
            "eval/mean@k",
            "eval/pass@k",
            "tokens/s",
        ]
        for k in keys:
            a, b = self.first.get(k), self.last.get(k)
            if isinstance(a, (int, float)) or isinstance(b, (int, float)):
                table.add_row(k, _num(a), _num(b))
        self.console.print(table)


def _num(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, (int, float)) else "-"
