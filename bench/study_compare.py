"""Two runs of the same study side by side, paired by method and seed: what changed between them.

Issue 52 reran the real-model study (docs/study_real) with the turn ended at the answer
(docs/study_real_stop). Each study's report compares its methods with its baseline on the same seed;
this script compares the two studies with each other: per method and seed, the final batch entropy
over each study's own H0, the in-band fraction, the entropy up to the answer where the runs recorded it,
held-out mean@k and pass@k, then each quantity's change (second study minus first) paired by seed,
marked **supported** by the report's rule (a two-sided paired t test at α = 0.05,
``agentrl.study.report.significance``; held-out accuracy only with ≥ 5 seeds). Only the seeds both
studies finished are paired.

    .venv/bin/python bench/study_compare.py                      # docs/study_real vs docs/study_real_stop
    .venv/bin/python bench/study_compare.py A/summary.json B/summary.json

It reads the ``summary.json`` each study's report writes (``agentrl study CONFIG --report-only``
rewrites it from the committed records), nothing else.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from agentrl.study.report import diff_cell

ROOT = Path(__file__).resolve().parents[1]
SHOWN = (  # (summary key, column title, as a percentage)
    ("h_ratio", "entropy / H0", False),
    ("in_band", "in band", True),
    ("final_entropy_answer", "entropy to the answer", False),
    ("mean_at_k", "mean@k", False),
    ("pass_at_k", "pass@k", False),
)


def load(path: Path) -> dict[str, dict]:
    """Family -> {"h0": ..., "runs": {(method, seed): summary}} from a study's summary.json."""
    out = {}
    for family, data in json.loads(path.read_text()).items():
        runs = {(m, r["seed"]): r for m, rs in data["methods"].items() for r in rs}
        out[family] = {"h0": data["prep"]["h0"], "runs": runs}
    return out


def _num(x: object) -> float:
    return float(x) if isinstance(x, (int, float)) else math.nan  # "NaN" strings: not recorded


def _fmt(x: float, pct: bool) -> str:
    return "–" if math.isnan(x) else (f"{100 * x:.0f} %" if pct else f"{x:.3f}")


def compare(before: dict[str, dict], after: dict[str, dict], names: tuple[str, str]) -> list[str]:
    lines = []
    for family in sorted(set(before) & set(after)):
        a, b = before[family], after[family]
        lines += [f"## {family}", "", f"H0: {a['h0']:.4f} nats ({names[0]}), {b['h0']:.4f} ({names[1]})", ""]
        lines += [
            "| method | seed | "
            + " | ".join(f"{title} ({names[0]} → {names[1]})" for _, title, _ in SHOWN)
            + " |",
            "|---|---|" + "---|" * len(SHOWN),
        ]
        paired = [run for run in a["runs"] if run in b["runs"]]  # the first study's order
        for method, seed in paired:
            ra, rb = a["runs"][method, seed], b["runs"][method, seed]
            cells = [f"{_fmt(_num(ra.get(k)), pct)} → {_fmt(_num(rb.get(k)), pct)}" for k, _, pct in SHOWN]
            lines.append(f"| {method} | {seed} | " + " | ".join(cells) + " |")
        lines += ["", f"Change ({names[1]} minus {names[0]}), paired by seed:", ""]
        lines += [
            "| method | " + " | ".join(title for _, title, _ in SHOWN) + " |",
            "|---|" + "---|" * len(SHOWN),
        ]
        for method in dict.fromkeys(m for m, _ in paired):
            cells = []
            for key, _, pct in SHOWN:
                diffs = [
                    _num(b["runs"][m, s].get(key)) - _num(a["runs"][m, s].get(key))
                    for m, s in paired
                    if m == method
                ]
                accuracy = key in ("mean_at_k", "pass_at_k")
                cells.append(diff_cell([d for d in diffs if not math.isnan(d)], pct, accuracy))
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before", nargs="?", type=Path, default=ROOT / "docs/study_real/summary.json")
    ap.add_argument("after", nargs="?", type=Path, default=ROOT / "docs/study_real_stop/summary.json")
    args = ap.parse_args()
    names = (args.before.parent.name, args.after.parent.name)
    print("\n".join(compare(load(args.before), load(args.after), names)))


if __name__ == "__main__":
    main()
