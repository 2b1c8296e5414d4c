"""One run's numbers for the study's report, from its ``metrics.jsonl`` and ``result.json``.

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
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl.transcripts import read_metrics

SERIES = {
    "entropy": "entropy/mean",
    "entropy_rollout": "entropy/rollout",
    "entropy_branching": "entropy/branching",
    "groups_trained": "groups/trained_count",
    "reward": "reward/mean",
    "length": "length/policy_tokens",
    "entropy_answer": "entropy/answer",
    "entropy_rollout_answer": "entropy/rollout_answer",
    "after_answer": "length/after_answer_frac",
    "episodes_after_answer": "episodes/after_answer_frac",
}


RENAMED = {"groups/trained_count": "groups/informative"}
"""A metric's name in runs recorded before it was renamed, read when the new name is absent (the
old ``groups/informative`` counted the groups trained on, as ``groups/trained_count`` does)."""


def _values(rows: Sequence[dict[str, Any]], key: str) -> list[float | None]:
    out: list[float | None] = []
    for r in rows:
        v = r.get(key, r.get(RENAMED.get(key, key)))
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


def _pass_at(result: dict[str, Any], k: int | None, default: float) -> float:
    """pass@k from the run's pass@j curve (unbiased, from all its samples), else ``default``."""
    curve = result.get("pass_curve") or {}
    return float(curve.get(str(k), default)) if k is not None else default


def summarize_run(
    run_dir: Path,
    target: float,
    band: tuple[float, float],
    warmup: int,
    h0: float | None = None,
    pass_k: int | None = None,
) -> dict[str, Any]:
    """One run's numbers for the report, from its ``metrics.jsonl`` and ``result.json``; ``h_ratio``
    is the final entropy over the warm start's H0, ``pass_at_k`` read at ``pass_k`` from the curve."""
    rows = read_metrics(run_dir)
    result = json.loads((run_dir / "result.json").read_text())
    target = _run_target(run_dir, target)
    n_tail = max(3, len(rows) // 5)
    series = {name: _values(rows, key) for name, key in SERIES.items()}
    gate = [x for x in _values(rows, "stare/gate_on") if x is not None]
    final_eval = result.get("final_eval", {})
    return {
        "seed": result.get("seed"),
        "series": series,
        "target": target,
        "steps": len(rows),
        "final_entropy": _tail_mean(series["entropy"], n_tail),
        "final_entropy_rollout": _tail_mean(series["entropy_rollout"], n_tail),
        "final_entropy_branching": _tail_mean(series["entropy_branching"], n_tail),
        "groups_trained": _tail_mean(series["groups_trained"], len(rows)),
        "final_reward": _tail_mean(series["reward"], n_tail),
        "final_length": _tail_mean(series["length"], n_tail),
        "in_band": band_fraction(series["entropy"], target, band, warmup),
        "in_band_rollout": band_fraction(series["entropy_rollout"], target, band, warmup),
        "final_entropy_answer": _tail_mean(series["entropy_answer"], n_tail),
        "final_entropy_rollout_answer": _tail_mean(series["entropy_rollout_answer"], n_tail),
        "in_band_answer": band_fraction(series["entropy_answer"], target, band, warmup)
        if any(x is not None for x in series["entropy_answer"])
        else math.nan,
        "after_answer": _tail_mean(series["after_answer"], n_tail),
        "episodes_after_answer": _tail_mean(series["episodes_after_answer"], n_tail),
        "gate_on": sum(gate) / len(gate) if gate else math.nan,
        "skipped_updates": sum(1 for r in rows if r.get("update/skipped")),
        "mean_at_k": final_eval.get("eval/mean@k", math.nan),
        "pass_at_k": _pass_at(result, pass_k, final_eval.get("eval/pass@k", math.nan)),
        "pass_curve": {int(j): v for j, v in result.get("pass_curve", {}).items()},
        **{f"mean_at_k:{name}": m["eval/mean@k"] for name, m in result.get("extra_evals", {}).items()},
        "h_ratio": _tail_mean(series["entropy"], n_tail) / h0 if h0 else math.nan,
        "seconds": result.get("seconds", math.nan),
        "policy_tokens": result.get("policy_tokens", math.nan),
        "entropy_slope": entropy_slope(series["entropy"], warmup),
        "warm_start_sha256": result.get("warm_start_sha256"),
        "run_dir": str(run_dir),
    }


def entropy_slope(xs: Sequence[float | None], warmup: int, per: int = 10) -> float:
    """The least-squares slope of the batch entropy against the step after ``warmup``, per ``per``
    steps (NaN with fewer than 3 points): the trend where the run is too short to collapse."""
    pts = [(i, x) for i, x in enumerate(xs) if i >= warmup and x is not None]
    if len(pts) < 3:
        return math.nan
    mx = statistics.fmean(i for i, _ in pts)
    my = statistics.fmean(x for _, x in pts)
    num = sum((i - mx) * (x - my) for i, x in pts)
    den = sum((i - mx) ** 2 for i, _ in pts)
    return per * num / den
