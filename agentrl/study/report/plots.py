"""The report's PNG plots: each family's curves per method (mean over seeds, shaded min-max) and its
held-out pass@k against k."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any


def _line_style(i: int) -> str:
    """Solid for the first ten methods, then dashed, then dotted: colours repeat after ten."""
    return ("-", "--", ":")[min(i // 10, 2)]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _finish(fig: Any, ax: Any, title: str, path: Path) -> Path:
    """Title, grid and legend, then write the PNG and free the figure."""
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path)
    _pyplot().close(fig)
    return path


def plot_family(
    family: str, target: float, band: tuple[float, float], by_method: dict[str, list[dict]], img: Path
) -> list[Path]:
    plt = _pyplot()
    written = []
    panels = [
        ("entropy", "entropy of the trained batch (nats)"),
        ("entropy_rollout", "entropy of fresh rollouts (nats)"),
        ("entropy_branching", "entropy at branching positions: top 10% of the batch (nats)"),
        ("reward", "training reward"),
        ("length", "policy tokens per episode"),
    ]
    for key, title in panels:
        fig, ax = plt.subplots(figsize=(7, 3.8), dpi=110)
        for i, (method, runs) in enumerate(by_method.items()):
            color = f"C{i % 10}"
            curves = [r["series"][key] for r in runs]
            steps = max(len(c) for c in curves)
            mean, lo, hi, xs = [], [], [], []
            for t in range(steps):
                vals = [c[t] for c in curves if t < len(c) and c[t] is not None]
                if vals:
                    xs.append(t)
                    mean.append(sum(vals) / len(vals))
                    lo.append(min(vals))
                    hi.append(max(vals))
            ax.plot(xs, mean, color=color, ls=_line_style(i), label=method, lw=1.4)
            if len(curves) > 1:
                ax.fill_between(xs, lo, hi, color=color, alpha=0.12, lw=0)
        if key.startswith("entropy"):
            ax.axhline(target, color="k", ls="--", lw=0.9, label="H_tgt")
            ax.axhspan(band[0] * target, band[1] * target, color="k", alpha=0.05, label="band")
        ax.set_xlabel("RL step")
        title = f"{family}: {title} (mean over seeds, shaded min-max)"
        written.append(_finish(fig, ax, title, img / f"study_{family}_{key}.png"))
    return written


def plot_pass_curves(family: str, prep: dict, by_method: dict[str, list[dict]], img: Path) -> Path | None:
    """pass@j against j at the end of RL (mean over seeds), one line per method, the warm start dashed."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.8), dpi=110)
    drawn = False
    start = {int(j): v for j, v in (prep.get("initial_pass_curve") or {}).items()}
    if start:
        ax.plot(sorted(start), [start[j] for j in sorted(start)], "k--", lw=1.2, label="warm start")
        drawn = True
    for i, (method, runs) in enumerate(by_method.items()):
        curves = [r["pass_curve"] for r in runs if r.get("pass_curve")]
        if not curves:
            continue
        js = sorted(set.intersection(*(set(c) for c in curves)))
        means = [statistics.fmean(c[j] for c in curves) for j in js]
        ax.plot(js, means, color=f"C{i % 10}", ls=_line_style(i), lw=1.4, marker=".", label=method)
        drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k (samples per task)")
    ax.set_ylabel("held-out pass@k")
    title = f"{family}: held-out pass@k after RL (mean over seeds; unbiased estimator)"
    return _finish(fig, ax, title, img / f"study_{family}_pass_at_k.png")
