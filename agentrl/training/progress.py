"""Live progress for training: a rich progress bar with the step's key metrics, and a summary table
at the end. Falls back to one plain line per step when the output is not a terminal (CI logs).

Steps are numbered from 0 everywhere (console, ``metrics.jsonl``, transcripts, ``replay --step``);
``(k/N)`` after a step number is how many of the run's N steps are done."""

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

from agentrl.training.metrics import CURVES

SHOWN = [
    ("reward", "reward/mean", "{:.3f}"),
    ("entropy", "entropy/mean", "{:.3f}"),
    ("len", "length/policy_tokens", "{:.0f}"),
    ("tok/s", "tokens/s", "{:.0f}"),
    ("s/step", "time/step_s", "{:.1f}"),
]
_SUMMARY_CURVES = (
    "reward",
    "correct",
    "entropy",
    "entropy_rollout",
    "length",
    "failed",
    "gate",
    "W",
    "W_star",
    "M",
)
SUMMARY = [CURVES[k] for k in (*_SUMMARY_CURVES, "eval_mean", "eval_pass", "tokens_s")] + [
    "groups/informative_frac"
]


def step_line(metrics: dict[str, Any], failure: str | None = None) -> str:
    """The metrics of one step on one line; the share of failed episodes and the most frequent
    failure whenever there is one."""
    parts = []
    for label, key, fmt in SHOWN:
        v = metrics.get(key)
        if isinstance(v, (int, float)):
            parts.append(f"{label} {fmt.format(v)}")
    gate = metrics.get(CURVES["gate"])
    if gate is not None:
        parts.append(f"gate {'on' if gate else 'off'}")
        weight, critical = metrics.get(CURVES["W"]), metrics.get(CURVES["W_star"])
        if isinstance(weight, (int, float)) and weight != 1.0:
            parts.append(f"W {weight:.2f}")
        if CURVES["drive"] in metrics:  # the batch's balance: null (no finite W*) when no W can raise entropy
            parts.append(f"W* {critical:.2f}" if isinstance(critical, (int, float)) else "W* none")
    if metrics.get("update/skipped"):
        stale = metrics.get("offpolicy/stale_dropped") or 0
        why = f"{stale:.0f} episodes past rollout.max_staleness dropped" if stale else "no informative group"
        parts.append(f"no update ({why})")
    if metrics.get("async/trainer_idle_frac") is not None:
        parts.append(f"waited {metrics['async/trainer_idle_frac']:.0%}")
    judge = metrics.get("rewards/judge_failed_frac") or 0.0
    if judge > 0:
        dropped = metrics.get("groups/dropped_count") or 0
        groups = f", {dropped:.0f} group{'s' * (dropped != 1)} dropped" if dropped else ""
        parts.append(f"judge failed {judge:.0%}{groups}")
    frac = metrics.get("episodes/failed_frac") or 0.0
    if frac > 0:
        parts.append(f"FAILED {frac:.0%}" + (f" ({failure})" if failure else ""))
    return "  ".join(parts)


class TrainProgress:
    """``first_row``: the run's first metrics row when it resumes (so the summary compares the whole
    run, not just the resumed part); ``every``: print one line every N steps (``logging.log_every``);
    ``history``: the run's starts and resumes, printed under the summary when it was resumed."""

    def __init__(
        self,
        total_steps: int,
        start_step: int = 0,
        console: Console | None = None,
        every: int = 1,
        first_row: dict[str, Any] | None = None,
        history: list[str] | None = None,
    ) -> None:
        self.console = console or Console(stderr=True)
        self.history = history or []  # the run's starts and resumes (run_history.describe)
        self.total, self.start, self.every = total_steps, start_step, every
        self.interactive = self.console.is_terminal
        self.first: dict[str, Any] | None = first_row
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

    def update(self, step: int, metrics: dict[str, Any], failure: str | None = None) -> None:
        row = {"step": step, **metrics}
        self.first = self.first or row
        self.last = row
        line = step_line(metrics, failure)
        self.progress.update(self.task, completed=step + 1, info=f"step {step}  {line}")
        if not self.interactive and (step % self.every == 0 or step + 1 == self.total):  # logging.log_every
            print(f"step {step} ({step + 1}/{self.total})  {line}", file=sys.stderr, flush=True)

    def __exit__(self, *exc: object) -> None:
        if self.interactive:
            self.progress.stop()
        if self.first is None or not self.last:
            return
        resumed = f", resumed at step {self.start}" if self.start else ""
        table = Table(title=f"training summary ({time.perf_counter() - self.t0:.0f}s{resumed})")
        one = self.first.get("step", 0) == self.last["step"]  # a one-step run: one column
        table.add_column("metric")
        table.add_column(f"step {self.first.get('step', 0)}", justify="right")
        if not one:
            table.add_column(f"step {self.last['step']}", justify="right")
        for k in SUMMARY:
            a, b = self.first.get(k), self.last.get(k)
            if isinstance(a, (int, float)) or isinstance(b, (int, float)):
                table.add_row(k, _num(a), *(() if one else (_num(b),)))
        self.console.print(table)
        if len(self.history) > 1:  # resumed at least once: which keys changed when
            self.console.print(
                "run history (RUN/history.jsonl):\n" + "\n".join(f"  {h}" for h in self.history),
                highlight=False,
                soft_wrap=True,
            )


def _num(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, (int, float)) else "-"
