"""Step metrics: ``metrics.jsonl`` (one line per step, flushed), TensorBoard, optional wandb, and PNG
plots regenerated from the JSONL file (``agentrl plot RUN_DIR``)."""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

PLOTS: dict[str, list[str]] = {
    "entropy": ["entropy/mean", "entropy/branching", "entropy/rollout", "stare/target"],
    "reward": ["reward/mean", "reward/correct", "eval/mean@k", "eval/pass@k"],
    "length": ["length/policy_tokens", "length/turns"],
    "clip": ["clip/low_frac", "clip/high_frac", "clip/dual_frac"],
    "stare_gate": ["stare/gate", "stare/W", "stare/M", "stare/mean_weight"],
}


class MetricsLogger:
    def __init__(
        self, run_dir: Path, tensorboard: bool = True, wandb_project: str | None = None, config: Any = None
    ):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.tb = None
        self.wandb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(Path(run_dir) / "tensorboard"))
        if wandb_project:
            try:
                import wandb
            except ImportError as e:
                raise RuntimeError(
                    "logging.wandb is on but the wandb package is not installed: pip install wandb"
                ) from e
            self.wandb = wandb.init(project=wandb_project, config=config, dir=str(run_dir), resume="allow")

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        row = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if self.tb is not None:
            for k, v in row.items():
                if k != "step" and isinstance(v, (int, float)):
                    self.tb.add_scalar(k, v, step)
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log(row, step=step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


def _clean(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return rows
    with open(path) as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a torn last line from a killed run
    return rows


def plot_run(run_dir: Path) -> list[Path]:
    """One PNG per panel in ``RUN/plots/``; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(run_dir)
    out_dir = Path(run_dir) / "plots"
    out_dir.mkdir(exist_ok=True)
    written = []
    for name, keys in PLOTS.items():
        series = {k: [(r["step"], r[k]) for r in rows if isinstance(r.get(k), (int, float))] for k in keys}
        series = {k: v for k, v in series.items() if v}
        if not series:
            continue
        fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
        for k, pts in series.items():
            xs, ys = zip(*pts)
            style = "--" if k in ("stare/target",) else "-"
            ax.plot(xs, ys, style, label=k, marker="." if len(xs) < 30 else None)
        ax.set_xlabel("step")
        ax.set_title(name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / f"{name}.png"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written
