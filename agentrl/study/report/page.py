"""The study's report: per-run summaries, per-method aggregates over seeds, PNG plots and one
markdown file (``results.md``), regenerated from the run directories alone.

The numbers of each run are in ``summaries.py``, with their definitions; the plots in ``plots.py``.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl.study import sections
from agentrl.study.archive import warm_start_lines
from agentrl.study.report.plots import plot_family, plot_pass_curves
from agentrl.study.report.summaries import summarize_run
from agentrl.study.tokens import token_lines


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
    # a spread has no sign, even where the mean's format shows one ("+0.040 ± 0.003")
    return (fmt.format(m) + " ± " + fmt.replace("+", "").format(sd)) if len(xs) > 1 else fmt.format(m)


def paired_differences(by_method: dict[str, list[dict]], base: str, key: str) -> dict[str, list[float]]:
    """Per method, ``key`` minus the baseline's on the same seed, for the seeds both finished."""
    ref = {r["seed"]: r[key] for r in by_method.get(base, [])}
    out = {}
    for method, runs in by_method.items():
        if method == base:
            continue
        diffs = [r[key] - ref[r["seed"]] for r in runs if r["seed"] in ref]
        out[method] = [d for d in diffs if not math.isnan(d)]
    return out


def supported(diffs: Sequence[float]) -> bool:
    """A paired difference the seeds support: at least two seeds, the same sign on every seed, and
    the mean more than two standard errors from zero. Anything else is reported as seed noise."""
    if len(diffs) < 2:
        return False
    same_sign = all(d > 0 for d in diffs) or all(d < 0 for d in diffs)
    m, sd = statistics.fmean(diffs), statistics.stdev(diffs)
    return same_sign and abs(m) > 2 * sd / math.sqrt(len(diffs))


def diff_cell(diffs: Sequence[float], pct: bool = False) -> str:
    """A paired difference as a table cell: mean ± sd over the seeds, how many are above zero, and
    **supported** where ``supported`` says so."""
    if not diffs:
        return "–"
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


def _comparison_lines(by_method: dict[str, list[dict]], base: str, k: int, pass_k: int) -> list[str]:
    """Every method against the baseline, paired by seed: mean ± sd of the difference, how many
    seeds it is positive on, and whether the seeds support it (``supported``)."""
    if base not in by_method or len(by_method) < 2:
        return []
    titles = [t.replace("mean@k", f"mean@{k}").replace("pass@k", f"pass@{pass_k}") for _, t, _ in COMPARED]
    lines = [
        "",
        f"Paired by seed against `{base}` (method minus `{base}` on the same seed: mean ± standard "
        "deviation of the differences, and on how many seeds it is positive). **supported** marks a "
        "difference with the same sign on every seed and a mean more than two standard errors from "
        "zero; every other difference is within seed noise and the text claims nothing from it.",
        "",
        "| method | " + " | ".join(f"Δ {t}" for t in titles) + " |",
        "|---|" + "---|" * len(titles),
    ]
    diffs = {key: paired_differences(by_method, base, key) for key, _, _ in COMPARED}
    for method in by_method:
        if method == base:
            continue
        cells = [diff_cell(diffs[key][method], pct) for key, _, pct in COMPARED]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines


def _verdict_lines(by_method: dict[str, list[dict]], base: str, study: Any, pass_k: int) -> list[str]:
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
    slopes = [f"`{m}` {_cell([r['entropy_slope'] for r in rs], '{:+.4f}')}" for m, rs in by_method.items()]
    lines.append(
        f"- Entropy trend after step {study.warmup_steps} (least-squares slope, nats per 10 steps, "
        "mean ± sd over seeds): " + ", ".join(slopes) + "."
    )
    for key, name in (("pass_at_k", f"pass@{pass_k}"), ("mean_at_k", f"mean@{study.eval_k}")):
        diffs = paired_differences(by_method, base, key)
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


def _per_run_lines(by_method: dict[str, list[dict]], k: int, pass_k: int) -> list[str]:
    """Every run on its own row: the numbers the means above are made of."""
    lines = [
        "",
        "<details><summary>Per seed</summary>",
        "",
        f"| method | seed | final entropy | / H0 | in band | branching | final reward | mean@{k} | "
        f"pass@{pass_k} | length | time |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for method, runs in by_method.items():
        for r in runs:
            lines.append(
                f"| {method} | {r['seed']} | {r['final_entropy']:.4f} | {r['h_ratio']:.2f} | "
                f"{100 * r['in_band']:.0f} % | {r['final_entropy_branching']:.3f} | {r['final_reward']:.3f} | "
                f"{r['mean_at_k']:.3f} | {r['pass_at_k']:.3f} | {r['final_length']:.1f} | {r['seconds']:.0f} s |"
            )
    return [*lines, "", "</details>"]


def _cost_line(study: Any, preps: dict[str, dict], runs: Sequence[Any]) -> str:
    """What the study cost, from the run directories (so a resumed or report-only invocation tells
    the whole study's cost): run time summed and divided by ``parallel``, and the warm starts'."""
    by_group: dict[bool, list[float]] = {True: [], False: []}
    required = set(study.methods)
    for r in runs:
        f = Path(r.out) / "result.json"
        if f.exists():
            by_group[r.method in required].append(float(json.loads(f.read_text()).get("seconds", 0.0)))
    sft = sum(float((p.get("sft") or {}).get("seconds", 0.0)) for p in preps.values())
    probe = sum(float(p.get("seconds", 0.0)) for p in preps.values())
    par = max(1, study.parallel)
    text = (
        f"Cost: warm starts {sft / 60:.1f} min of SFT and {probe / 60:.1f} min of probing and evaluation; "
        f"{len(by_group[True])} required runs {sum(by_group[True]) / 60:.0f} run-min "
        f"(≈ {sum(by_group[True]) / par / 60:.0f} min at {par} at a time)"
    )
    if by_group[False]:
        text += (
            f", {len(by_group[False])} extra runs {sum(by_group[False]) / 60:.0f} run-min "
            f"(≈ {sum(by_group[False]) / par / 60:.0f} min)"
        )
    return text + "."


def _finite(x: Any) -> Any:
    """``x`` with every NaN or infinity (a value a run did not record) as None, so that
    ``summary.json`` is strict JSON: null, which every parser reads, not Python's bare NaN."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def write_report(study: Any, preps: dict[str, dict], runs: Sequence[Any], wall_seconds: float) -> Path:
    """Summaries, plots and ``results.md`` in ``study.report_dir``; returns the markdown's path."""
    out = Path(study.report_dir)
    img = out / "img"
    img.mkdir(parents=True, exist_ok=True)
    lines = _header_lines(study, preps, runs, wall_seconds, out)
    summary: dict[str, Any] = {}
    for family, prep in preps.items():
        by_method, failed = _family_summaries(study, family, prep, runs)
        lines += _family_lines(study, family, prep, by_method, failed, img)
        summary[family] = {
            "prep": {k: v for k, v in prep.items() if k != "key"},
            "methods": {
                m: [{k: v for k, v in r.items() if k != "series"} for r in rs] for m, rs in by_method.items()
            },
        }
    (out / "summary.json").write_text(json.dumps(_finite(summary), indent=1, default=str, allow_nan=False))
    path = out / "results.md"
    lines += [
        x for block in sections.others(path, study.name) for x in ("", block)
    ]  # other studies' sections
    path.write_text("\n".join(lines) + "\n")
    return path


def _header_lines(
    study: Any, preps: dict[str, dict], runs: Sequence[Any], wall_seconds: float, out: Path
) -> list[str]:
    """The report's title, machine and definitions."""
    import platform

    docs = os.path.relpath(Path(__file__).resolve().parents[3] / "docs", out.resolve())  # links below
    k = study.eval_k
    pass_k = study.pass_k or k
    return [
        f"# Entropy-stability study: {study.name}",
        "",
        "Generated by `agentrl study` from the run directories; do not edit by hand.",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores; seeds {list(study.seeds)}; "
        f"{study.steps} RL steps per run; {study.parallel} run{'s' * (study.parallel != 1)} at a time. "
        f"{_cost_line(study, preps, runs)} "
        f"This invocation took {wall_seconds / 60:.1f} min.",
        "",
        "Definitions: *entropy* is the token-mean entropy of the batch each update trains on (what STARE's "
        "gate and controllers read); *rollout entropy* is the mean surprisal of all fresh rollouts. "
        f"*In band* is the fraction of steps after step {study.warmup_steps} whose entropy lies in "
        f"[{study.band[0]}, {study.band[1]}] × H_tgt (a step with no informative group has no batch and "
        "counts as outside). *Final* values average the last fifth of the steps (at least 3). "
        "*Branching entropy* is the mean over the top 10 % most uncertain policy tokens of a batch. "
        f"Held-out mean@{k} and pass@{pass_k} are on {study.eval_tasks} test tasks at the end, from {k} "
        f"samples per task (pass@j with the unbiased estimator, curves for j = 1…{k} in the plots). "
        "Values are mean ± standard deviation over seeds.",
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


def _family_summaries(
    study: Any, family: str, prep: dict, runs: Sequence[Any]
) -> tuple[dict[str, list[dict]], list[str]]:
    """One family's run summaries by method, and the runs that left no result."""
    by_method: dict[str, list[dict]] = {}
    failed: list[str] = []
    for r in runs:
        if r.family != family:
            continue
        d = Path(r.out)
        if (d / "result.json").exists():
            by_method.setdefault(r.method, []).append(
                summarize_run(
                    d,
                    prep["target_entropy"],
                    study.band,
                    study.warmup_steps,
                    prep["h0"],
                    study.pass_k or study.eval_k,
                )
            )
        else:
            failed.append(f"{r.method} seed {r.seed}")
    return by_method, failed


def _family_lines(
    study: Any, family: str, prep: dict, by_method: dict[str, list[dict]], failed: list[str], img: Path
) -> list[str]:
    """One family's section: its warm start, the table of methods, the verdicts and the plots."""
    k = study.eval_k
    pass_k = study.pass_k or k
    target = prep["target_entropy"]
    base = "grpo_ds" if "grpo_ds" in study.methods else next(iter(study.methods))  # the paired baseline
    ie = prep["initial_eval"]
    start_curve = prep.get("initial_pass_curve") or {}
    start_pass = start_curve.get(str(pass_k), start_curve.get(pass_k, ie["eval/pass@k"]))
    branching = f" (branching {prep['h0_branching']:.3f})" if "h0_branching" in prep else ""
    sft = prep.get("sft") or {}
    sft_text = ""
    if sft.get("holdout_losses"):
        best = min(v for _, v in sft["holdout_losses"])
        sft_text = (
            f" SFT: {sft.get('examples')} demonstrations, {sft.get('holdout_examples')} held out; kept "
            f"step {sft.get('best_step')} of {sft.get('steps')} (lowest held-out loss {best:.3f})."
        )
    lines = [
        f"## {family}",
        "",
        f"Config `{prep['config']}`. Warm start: H0 = {prep['h0']:.4f} nats{branching}, H_tgt = "
        f"{target:.4f}, probe reward {prep['probe_reward']:.3f}, held-out mean@{k} "
        f"{ie['eval/mean@k']:.3f}, pass@{pass_k} {start_pass:.3f} before RL.{sft_text}",
        *warm_start_lines(prep, [{**r, "method": m} for m, rs in by_method.items() for r in rs]),
        "",
        f"| method | final entropy | / H0 | in band | rollout entropy | rollout in band | branching entropy | "
        f"STARE gate on | groups trained | final reward | mean@{k} | pass@{pass_k} | length | time/run | "
        "policy tokens/run |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [_method_row(method, rs) for method, rs in by_method.items()]
    lines += _answer_lines(by_method)
    lines += _verdict_lines(by_method, base, study, pass_k)
    lines += _comparison_lines(by_method, base, k, pass_k)
    lines += _per_run_lines(by_method, k, pass_k)
    lines += _token_lines(prep, by_method)
    if failed:
        lines += ["", f"Runs without a result (failed or not run): {', '.join(failed)}."]
    pngs = plot_family(family, target, study.band, by_method, img) if by_method else []
    curve_png = plot_pass_curves(family, prep, by_method, img) if by_method else None
    pngs += [curve_png] if curve_png else []
    return lines + [""] + [f"![{p.stem}](img/{p.name})" for p in pngs] + [""]


def _answer_lines(by_method: dict[str, list[dict]]) -> list[str]:
    """The entropies up to the end of each turn's answer (the text the reward reads), beside how
    much was written after it: from ``entropy/answer``, ``entropy/rollout_answer`` and the
    ``after_answer`` fractions the runs record where the environment declares stop conditions."""
    if all(math.isnan(r["final_entropy_answer"]) for rs in by_method.values() for r in rs):
        return [
            "",
            "These runs' records hold no entropy up to the answer (`entropy/answer`, recorded since "
            "issue 52); `bench/answer_tail.py` splits their transcripts at the answer instead.",
        ]
    lines = [
        "",
        "**Up to the answer.** The same entropies over the policy tokens up to the end of each turn's "
        "answer (the text the reward reads), and what was written after it (final values):",
        "",
        "| method | entropy to answer | in band (to answer) | rollout entropy to answer | policy tokens after "
        "the answer | episodes with text after the answer |",
        "|---|---|---|---|---|---|",
    ]
    for method, rs in by_method.items():

        def col(key: str, rs: list[dict] = rs) -> list[float]:
            return [r[key] for r in rs]

        lines.append(
            f"| {method} | {_cell(col('final_entropy_answer'))} | {_cell(col('in_band_answer'), pct=True)} | "
            f"{_cell(col('final_entropy_rollout_answer'))} | {_cell(col('after_answer'), pct=True)} | "
            f"{_cell(col('episodes_after_answer'), pct=True)} |"
        )
    return lines


def _token_lines(prep: dict, by_method: dict[str, list[dict]]) -> list[str]:
    """Which tokens each weighting method selected, decoded with the warm start's tokenizer."""
    from transformers import AutoTokenizer

    dirs = {m: [Path(r["run_dir"]) for r in rs] for m, rs in by_method.items()}
    # SFT leaves the tokenizer as it was: without the warm start here (a report of archived runs),
    # the configured model's decodes the same ids
    source = prep["policy"] if Path(prep["policy"]).is_dir() else prep["tokenizer"]
    tokenizer = AutoTokenizer.from_pretrained(source)
    return token_lines(dirs, lambda tok: str(tokenizer.decode([tok])))


def _method_row(method: str, rs: list[dict]) -> str:
    """One method's row of a family's table: each cell mean ± std over seeds."""

    def col(key: str) -> list[float]:
        return [r[key] for r in rs]

    return (
        f"| {method} | {_cell(col('final_entropy'))} | {_cell(col('h_ratio'), '{:.2f}')} | "
        f"{_cell(col('in_band'), pct=True)} | "
        f"{_cell(col('final_entropy_rollout'))} | {_cell(col('in_band_rollout'), pct=True)} | "
        f"{_cell(col('final_entropy_branching'))} | {_cell(col('gate_on'), pct=True)} | "
        f"{_cell(col('groups_trained'), '{:.1f}')} | {_cell(col('final_reward'))} | "
        f"{_cell(col('mean_at_k'))} | {_cell(col('pass_at_k'))} | {_cell(col('final_length'), '{:.1f}')} | "
        f"{_cell(col('seconds'), '{:.0f}')} s | {_cell(col('policy_tokens'), '{:.0f}')} |"
    )
