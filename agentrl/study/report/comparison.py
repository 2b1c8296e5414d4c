"""The methods compared over seeds: mean ± sd cells, differences paired by seed against the
baseline, when the seeds support one, and the study's answers drawn from them."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from agentrl.study.report.significance import ALPHA, MIN_SEEDS_ACCURACY, smallest_supported, supported


def _mean_sd(xs: Sequence[float]) -> tuple[float, float]:
    xs = [x for x in xs if not math.isnan(x)]
    if not xs:
        return math.nan, math.nan
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def cell(xs: Sequence[float], fmt: str = "{:.3f}", pct: bool = False) -> str:
    m, sd = _mean_sd(xs)
    if math.isnan(m):
        return "–"
    if pct:
        return f"{100 * m:.0f} % ± {100 * sd:.0f}" if len(xs) > 1 else f"{100 * m:.0f} %"
    # a spread has no sign, even where the mean's format shows one ("+0.040 ± 0.003")
    return (fmt.format(m) + " ± " + fmt.replace("+", "").format(sd)) if len(xs) > 1 else fmt.format(m)


def paired_differences(by_method: dict[str, list[dict]], base: str, key: str) -> dict[str, list[float]]:
    """Per method, ``key`` minus the baseline's on the same seed, for the seeds both finished."""
    ref = {r["seed"]: r.get(key, math.nan) for r in by_method.get(base, [])}
    out = {}
    for method, runs in by_method.items():
        if method == base:
            continue
        diffs = [r.get(key, math.nan) - ref[r["seed"]] for r in runs if r["seed"] in ref]
        out[method] = [d for d in diffs if not math.isnan(d)]
    return out


def diff_cell(diffs: Sequence[float], pct: bool = False, accuracy: bool = False) -> str:
    """A paired difference as a table cell: mean ± sd over the seeds, how many are above zero, and
    **supported** where ``supported`` says so; an ``accuracy`` difference over fewer than
    ``MIN_SEEDS_ACCURACY`` seeds says it is not testable instead of marking anything."""
    if not diffs:
        return "–"
    if accuracy and len(diffs) < MIN_SEEDS_ACCURACY:
        m, sd = statistics.fmean(diffs), (statistics.stdev(diffs) if len(diffs) > 1 else 0.0)
        return f"{m:+.3f} ± {sd:.3f} (not testable at n = {len(diffs)})"
    scale, unit = (100.0, " pp") if pct else (1.0, "")
    m = statistics.fmean(diffs) * scale
    sd = (statistics.stdev(diffs) if len(diffs) > 1 else 0.0) * scale
    pos = sum(d > 0 for d in diffs)
    mark = " **supported**" if supported(diffs) else ""
    fmt = "{:+.0f}" if pct else "{:+.3f}"
    return f"{fmt.format(m)}{unit} ± {sd:.{0 if pct else 3}f} ({pos}/{len(diffs)} seeds > 0){mark}"


COMPARED = (  # (summary key, column title, percentage)
    ("h_ratio", "final entropy / H0", False),
    ("in_band", "in band", True),
    ("final_entropy_branching", "branching entropy", False),
    ("mean_at_k", "mean@k", False),
    ("pass_at_k", "pass@k", False),
)
ACCURACY = ("mean_at_k", "pass_at_k")
"""Held-out accuracy: compared only with ``MIN_SEEDS_ACCURACY`` seeds or more."""


def rule_text(n_comparisons: int) -> str:
    """What **supported** means in a report, with its false-positive rate."""
    return (
        f"**supported** marks a difference whose two-sided paired t test over the seeds (df = seeds − 1) "
        f"rejects a zero mean at α = {ALPHA}: under the null it marks {ALPHA:.0%} of comparisons, so of the "
        f"{n_comparisons} here expect about {ALPHA * n_comparisons:.1f} marked by chance. Held-out accuracy "
        f"is compared only with ≥ {MIN_SEEDS_ACCURACY} seeds; with fewer it is reported as not testable."
    )


def comparison_lines(by_method: dict[str, list[dict]], base: str, k: int, pass_k: int) -> list[str]:
    """Every method against the baseline, paired by seed: mean ± sd of the difference, how many
    seeds it is positive on, and whether the seeds support it (``supported``)."""
    if base not in by_method or len(by_method) < 2:
        return []
    titles = [t.replace("mean@k", f"mean@{k}").replace("pass@k", f"pass@{pass_k}") for _, t, _ in COMPARED]
    lines = [
        "",
        f"Paired by seed against `{base}` (method minus `{base}` on the same seed: mean ± standard "
        "deviation of the differences, and on how many seeds it is positive). "
        + rule_text(len(COMPARED) * (len(by_method) - 1))
        + " Every other difference is within seed noise and the text claims nothing from it.",
        "",
        "| method | " + " | ".join(f"Δ {t}" for t in titles) + " |",
        "|---|" + "---|" * len(titles),
    ]
    diffs = {key: paired_differences(by_method, base, key) for key, _, _ in COMPARED}
    for method in by_method:
        if method == base:
            continue
        cells = [diff_cell(diffs[key][method], pct, key in ACCURACY) for key, _, pct in COMPARED]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines


def verdict_lines(by_method: dict[str, list[dict]], base: str, study: Any, pass_k: int) -> list[str]:
    """The study's questions, answered from the per-seed numbers: did the baseline collapse on every
    seed, which methods held the band on ≥ 80 % of post-warm-up steps on every seed, and which
    paired pass@k / mean@k differences the seeds support."""
    if base not in by_method:
        return []
    floor = study.band[0]
    ratios = [r["h_ratio"] for r in by_method[base]]
    collapsed = sum(x < floor for x in ratios)
    lines = [
        "",
        "**Answers, per seed.**",
        "",
        f"- `{base}` collapsed (final entropy < {floor} × H0) on **{collapsed}/{len(ratios)}** seeds "
        f"(final / H0: {', '.join(f'{x:.2f}' for x in ratios)})",
    ]
    if collapsed == len(ratios):
        lines[-1] += ". The setup is a test of entropy control."
    else:
        lines[-1] += ". Where it did not collapse, holding the band says nothing about entropy control."
    held = []
    for method, runs in by_method.items():
        n_ok = sum(r["in_band"] >= 0.8 for r in runs if not math.isnan(r["in_band"]))
        held.append(f"`{method}` {n_ok}/{len(runs)}")
    lines.append("- In band on ≥ 80 % of post-warm-up steps, seeds: " + ", ".join(held) + ".")
    slopes = [f"`{m}` {cell([r['entropy_slope'] for r in rs], '{:+.4f}')}" for m, rs in by_method.items()]
    lines.append(
        f"- Entropy trend after step {study.warmup_steps} (least-squares slope, nats per 10 steps, "
        "mean ± sd over seeds): " + ", ".join(slopes) + "."
    )
    for key, name in (("pass_at_k", f"pass@{pass_k}"), ("mean_at_k", f"mean@{study.eval_k}")):
        diffs = paired_differences(by_method, base, key)
        seeds = min((len(d) for d in diffs.values()), default=0)
        if seeds < MIN_SEEDS_ACCURACY:
            need = max((smallest_supported(d) for d in diffs.values()), default=math.inf)
            lines.append(
                f"- Held-out {name} against `{base}`: not testable at n = {seeds} seeds (≥ {MIN_SEEDS_ACCURACY} "
                f"needed; at this spread a difference would have to exceed {need:.3f} to be supported)."
            )
            continue
        better = [m for m, d in diffs.items() if supported(d) and statistics.fmean(d) > 0]
        worse = [m for m, d in diffs.items() if supported(d) and statistics.fmean(d) < 0]
        lines.append(
            f"- Held-out {name} against `{base}`: supported higher for "
            + (", ".join(f"`{m}`" for m in better) or "none")
            + "; supported lower for "
            + (", ".join(f"`{m}`" for m in worse) or "none")
            + "; every other difference is within seed noise."
        )
    return lines


def sampling_lines(by_method: dict[str, list[dict]], base: str, study: Any, prep: dict) -> list[str]:
    """Held-out mean@k at the study's other sampling settings (``eval_sampling``): each method's,
    the warm start's, and the difference against the baseline paired by seed, tested as accuracy."""
    names = list(study.eval_sampling)
    if not names or not by_method:
        return []
    start = prep.get("initial_extra_evals") or {}
    lines = [
        "",
        "**Held-out mean@k at other sampling settings** (`eval_sampling`: "
        + "; ".join(f"{n} = {', '.join(study.eval_sampling[n])}" for n in names)
        + f"). Mean ± sd over seeds; Δ is paired by seed against `{base}`.",
        "",
        "| method | " + " | ".join(f"{n} | Δ {n}" for n in names) + " |",
        "|---|" + "---|---|" * len(names),
        "| warm start | "
        + " | ".join(f"{start[n]['eval/mean@k']:.3f} | –" if n in start else "– | –" for n in names)
        + " |",
    ]
    diffs = {n: paired_differences(by_method, base, f"mean_at_k:{n}") for n in names}
    for method, runs in by_method.items():
        cells = []
        for n in names:
            own = cell([r.get(f"mean_at_k:{n}", math.nan) for r in runs])
            cells += [own, "–" if method == base else diff_cell(diffs[n][method], accuracy=True)]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines
