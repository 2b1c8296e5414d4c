"""The study's report: per-run summaries, per-method aggregates over seeds, PNG plots and one
markdown file (``results.md``), regenerated from the run directories alone.

Definitions (also written into the report):
- **entropy**: the token-mean entropy of the batch the update trains on (``entropy/mean``, exact,
  full vocabulary; with dynamic sampling only mixed groups), which is what STARE's gate and
  controllers read; next to it the entropy of all fresh rollouts (``entropy/rollout``, the mean
  surprisal of the sampled tokens, an unbiased estimate of their sampling entropy).
- **in band**: the fraction of steps after ``warmup_steps`` whose entropy lies in
  [band[0], band[1]] × H_tgt. Steps without an update (no informative group) count as out of band
  for the batch entropy (there is no batch) and are listed separately.
- **final**: the mean over the last ``max(3, steps // 5)`` steps, to damp single-step noise.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl.transcripts import read_metrics

SERIES = {
    "entropy": "entropy/mean",
    "entropy_rollout": "entropy/rollout",
    "entropy_branching": "entropy/branching",
    "informative": "groups/informative",
    "reward": "reward/mean",
    "length": "length/policy_tokens",
}


def _values(rows: Sequence[dict[str, Any]], key: str) -> list[float | None]:
    out: list[float | None] = []
    for r in rows:
        v = r.get(key)
        out.append(float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None)
    return out


def _tail_mean(xs: Sequence[float | None], n: int) -> float:
    vals = [x for x in xs[-n:] if x is not None]
    return sum(vals) / len(vals) if vals else math.nan


def band_fraction(xs: Sequence[float | None], target: float, band: tuple[float, float], warmup: int) -> float:
    """Fraction of steps after ``warmup`` with ``band[0]·target <= x <= band[1]·target``; a step
    without a value counts as outside."""
    post = xs[warmup:]
    if not post:
        return math.nan
    lo, hi = band[0] * target, band[1] * target
    return sum(x is not None and lo <= x <= hi for x in post) / len(post)


def _run_target(run_dir: Path, default: float) -> float:
    """The H_tgt this run was given (its saved config), which the band is measured against."""
    import yaml

    path = run_dir / "config.yaml"
    if not path.exists():
        return default
    cfg = yaml.safe_load(path.read_text()) or {}
    return float(cfg.get("algorithm", {}).get("stare", {}).get("target_entropy", default))


def summarize_run(run_dir: Path, target: float, band: tuple[float, float], warmup: int) -> dict[str, Any]:
    """One run's numbers for the report, from its ``metrics.jsonl`` and ``result.json``."""
    rows = read_metrics(run_dir)
    result = json.loads((run_dir / "result.json").read_text())
    target = _run_target(run_dir, target)
    n_tail = max(3, len(rows) // 5)
    series = {name: _values(rows, key) for name, key in SERIES.items()}
    gate = [x for x in _values(rows, "stare/gate_on") if x is not None]
    final_eval = result.get("final_eval", {})
    return {
        "series": series,
        "target": target,
        "steps": len(rows),
        "final_entropy": _tail_mean(series["entropy"], n_tail),
        "final_entropy_rollout": _tail_mean(series["entropy_rollout"], n_tail),
        "final_entropy_branching": _tail_mean(series["entropy_branching"], n_tail),
        "informative": _tail_mean(series["informative"], len(rows)),
        "final_reward": _tail_mean(series["reward"], n_tail),
        "final_length": _tail_mean(series["length"], n_tail),
        "in_band": band_fraction(series["entropy"], target, band, warmup),
        "in_band_rollout": band_fraction(series["entropy_rollout"], target, band, warmup),
        "gate_on": sum(gate) / len(gate) if gate else math.nan,
        "skipped_updates": sum(1 for r in rows if r.get("update/skipped")),
        "mean_at_k": final_eval.get("eval/mean@k", math.nan),
        "pass_at_k": final_eval.get("eval/pass@k", math.nan),
        "seconds": result.get("seconds", math.nan),
        "policy_tokens": result.get("policy_tokens", math.nan),
    }


def _mean_sd(xs: Sequence[float]) -> tuple[float, float]:
    xs = [x for x in xs if not math.isnan(x)]
    if not xs:
        return math.nan, math.nan
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def _cell(xs: Sequence[float], fmt: str = "{:.3f}", pct: bool = False) -> str:
    m, sd = _mean_sd(xs)
    if math.isnan(m):
        return "–"
    if pct:
        return f"{100 * m:.0f} % ± {100 * sd:.0f}" if len(xs) > 1 else f"{100 * m:.0f} %"
    return (fmt.format(m) + " ± " + fmt.format(sd)) if len(xs) > 1 else fmt.format(m)


def _plot_family(
    family: str, target: float, band: tuple[float, float], by_method: dict[str, list[dict]], img: Path
) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
            ax.plot(xs, mean, color=color, label=method, lw=1.4)
            if len(curves) > 1:
                ax.fill_between(xs, lo, hi, color=color, alpha=0.12, lw=0)
        if key.startswith("entropy"):
            ax.axhline(target, color="k", ls="--", lw=0.9, label="H_tgt")
            ax.axhspan(band[0] * target, band[1] * target, color="k", alpha=0.05, label="band")
        ax.set_xlabel("RL step")
        ax.set_title(f"{family}: {title} (mean over seeds, shaded min-max)", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        path = img / f"study_{family}_{key}.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


def _per_seed_lines(
    by_method: dict[str, list[dict]], runs: Sequence[Any], family: str, study: Any
) -> list[str]:
    """Seed by seed: the baseline's final entropy as a multiple of H_tgt ("collapsed" below the
    band's floor) and each method's in-band fraction, for the "holds the band on every seed where
    the baseline collapses" question."""
    seeds = [r.seed for r in runs if r.family == family and r.method == next(iter(by_method), None)]
    if not by_method or len(seeds) != len(next(iter(by_method.values()))):
        return []
    base = next(iter(by_method))
    lines = [
        "",
        f"Per seed: `{base}` final entropy / H_tgt (collapsed if below {study.band[0]}), then each "
        "method's in-band fraction.",
        "",
        "| seed | " + f"{base} final/H_tgt | " + " | ".join(by_method) + " |",
        "|---|---|" + "---|" * len(by_method),
    ]
    for i, seed in enumerate(seeds):
        b = by_method[base][i]
        ratio = b["final_entropy"] / b["target"] if b.get("target") else math.nan
        mark = " (collapsed)" if ratio < study.band[0] else ""
        cells = [
            f"{100 * rs[i]['in_band']:.0f} %" if i < len(rs) and not math.isnan(rs[i]["in_band"]) else "–"
            for rs in by_method.values()
        ]
        lines.append(f"| {seed} | {ratio:.2f}{mark} | " + " | ".join(cells) + " |")
    return lines


def write_report(study: Any, preps: dict[str, dict], runs: Sequence[Any], wall_seconds: float) -> Path:
    """Summaries, plots and ``results.md`` in ``study.report_dir``; returns the markdown's path."""
    import platform

    out = Path(study.report_dir)
    docs = os.path.relpath(Path(__file__).resolve().parents[1] / "docs", out.resolve())  # links below
    img = out / "img"
    img.mkdir(parents=True, exist_ok=True)
    k = study.eval_k
    lines = [
        f"# Entropy-stability study: {study.name}",
        "",
        "Generated by `agentrl study` from the run directories; do not edit by hand.",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores; study wall time "
        f"{wall_seconds / 60:.1f} min (this invocation); seeds {list(study.seeds)}; "
        f"{study.steps} RL steps per run; {study.parallel} runs at a time.",
        "",
        "Definitions: *entropy* is the token-mean entropy of the batch each update trains on (what STARE's "
        "gate and controllers read); *rollout entropy* is the mean surprisal of all fresh rollouts. "
        f"*In band* is the fraction of steps after step {study.warmup_steps} whose entropy lies in "
        f"[{study.band[0]}, {study.band[1]}] × H_tgt (a step with no informative group has no batch and "
        "counts as outside). *Final* values average the last fifth of the steps (at least 3). "
        f"Held-out mean@{k} / pass@{k} are on {study.eval_tasks} test tasks at the end. Values are "
        "mean ± standard deviation over seeds.",
        "",
        "The same methods in the tabular entropy lab (V = 16, many correct answers, 3 seeds, 400 steps), "
        "where the controllers were first measured, are in "
        f"[algorithms.md]({docs}/algorithms.md#the-entropy-lab--benchentropy_labpy); how the study works "
        f"is in [study.md]({docs}/study.md).",
        "",
        f"H_tgt rule: `{study.target.rule}`"
        + (
            f", H_tgt = {study.target.scale} × H0, where H0 is the warm start's token-mean entropy over the "
            f"policy tokens of {study.target.probe_prompts} training prompts × group size fresh episodes."
            if study.target.rule == "initial"
            else f", H_tgt = {study.target.value}."
        ),
        "",
    ]
    summary: dict[str, Any] = {}
    for family, prep in preps.items():
        target = prep["target_entropy"]
        by_method: dict[str, list[dict]] = {}
        failed: list[str] = []
        for r in runs:
            if r.family != family:
                continue
            d = Path(r.out)
            if (d / "result.json").exists():
                by_method.setdefault(r.method, []).append(
                    summarize_run(d, target, study.band, study.warmup_steps)
                )
            else:
                failed.append(f"{r.method} seed {r.seed}")
        ie = prep["initial_eval"]
        lines += [
            f"## {family}",
            "",
            f"Config `{prep['config']}`. Warm start: H0 = {prep['h0']:.4f} nats, H_tgt = {target:.4f}, "
            f"probe reward {prep['probe_reward']:.3f}, held-out mean@{k} {ie['eval/mean@k']:.3f}, "
            f"pass@{k} {ie['eval/pass@k']:.3f} before RL.",
            "",
            f"| method | final entropy | in band | rollout entropy | rollout in band | branching entropy | "
            f"STARE gate on | informative groups | final reward | mean@{k} | pass@{k} | length | time/run | "
            "policy tokens/run |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for method, rs in by_method.items():

            def col(key: str, rs: list[dict] = rs) -> list[float]:
                return [r[key] for r in rs]

            lines.append(
                f"| {method} | {_cell(col('final_entropy'))} | {_cell(col('in_band'), pct=True)} | "
                f"{_cell(col('final_entropy_rollout'))} | {_cell(col('in_band_rollout'), pct=True)} | "
                f"{_cell(col('final_entropy_branching'))} | {_cell(col('gate_on'), pct=True)} | "
                f"{_cell(col('informative'), '{:.1f}')} | {_cell(col('final_reward'))} | "
                f"{_cell(col('mean_at_k'))} | {_cell(col('pass_at_k'))} | {_cell(col('final_length'), '{:.1f}')} | "
                f"{_cell(col('seconds'), '{:.0f}')} s | {_cell(col('policy_tokens'), '{:.0f}')} |"
            )
        lines += _per_seed_lines(by_method, runs, family, study)
        if failed:
            lines += ["", f"Runs without a result (failed or not run): {', '.join(failed)}."]
        pngs = _plot_family(family, target, study.band, by_method, img) if by_method else []
        lines += [""] + [f"![{p.stem}](img/{p.name})" for p in pngs] + [""]
        summary[family] = {
            "prep": {k2: v for k2, v in prep.items() if k2 != "key"},
            "methods": {
                m: [{k2: v for k2, v in r.items() if k2 != "series"} for r in rs]
                for m, rs in by_method.items()
            },
        }
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    path = out / "results.md"
    path.write_text("\n".join(lines) + "\n")
    return path
