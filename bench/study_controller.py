"""Inside a study's runs, from its committed records: the batch entropy in 10-step windows, how often
STARE's PI controller sat at full strength, and the training reward, paired by seed against the
baseline method.

The study's report gives each run's final values; this script reads the step-by-step metrics the
records hold (``RECORDS/FAMILY/METHOD/sSEED/metrics.jsonl`` and the run's ``config.yaml``) for what
docs/study.md says about the course of the real-model runs:

    .venv/bin/python bench/study_controller.py          # docs/study_real_stop, then docs/study_real
    .venv/bin/python bench/study_controller.py RECORDS [RECORDS ...] --family F --baseline grpo_ds

*Full strength* is the PI controller's ceiling, u = 1: ``stare/w`` at the run's ``stare.pi.W_max``
and ``stare/m`` at its ``stare.pi.M_min``, counted over the steps after ``--warmup`` that updated
(those that logged the weights), and over the last ``--last`` steps. The final reward is the mean of
the last fifth of the steps (at least 3), as in the report. Entropy is ``entropy/mean``, the batch the
update trained on (a step without one has none).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from agentrl.study.report import diff_cell
from agentrl.transcripts import read_metrics

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = [ROOT / "docs/study_real_stop/records", ROOT / "docs/study_real/records"]


def run_summary(run: Path, warmup: int, last: int) -> dict:
    """One run's entropy windows, full-strength counts and final reward, from its record."""
    rows = read_metrics(run)
    stare = (yaml.safe_load((run / "config.yaml").read_text()) or {}).get("algorithm", {}).get("stare", {})
    entropy = {r["step"]: r.get("entropy/mean") for r in rows}
    windows = []
    for start in range(0, max(entropy, default=-1) + 1, 10):
        xs = [entropy[s] for s in range(start, start + 10) if entropy.get(s) is not None]
        windows.append(sum(xs) / len(xs) if xs else None)
    rewards = [r["reward/mean"] for r in rows if r.get("reward/mean") is not None]
    tail = rewards[-max(3, len(rewards) // 5) :]
    steps = sorted(s for s, x in entropy.items() if x is not None)
    out = {"windows": windows, "final_reward": sum(tail) / len(tail) if tail else None}
    out["last_ten"] = [entropy[s] for s in steps[-10:]]
    if stare.get("controller") == "pi":
        w_max, m_min = stare["pi"]["W_max"], stare["pi"]["M_min"]
        updated = [r for r in rows if r["step"] >= warmup and r.get("stare/w") is not None]
        full = [r for r in updated if r["stare/w"] >= w_max - 1e-6 and r["stare/m"] <= m_min + 1e-6]
        end = max(r["step"] for r in rows) - last
        out["full"] = (len(full), len(updated))
        out["full_last"] = (sum(r["step"] > end for r in full), sum(r["step"] > end for r in updated))
    return out


def report(records: Path, family: str, baseline: str, warmup: int, last: int) -> list[str]:
    runs = {
        (m.name, int(s.name[1:])): run_summary(s, warmup, last)
        for m in sorted((records / family).iterdir())
        if m.is_dir()
        for s in sorted(m.glob("s*"))
        if (s / "metrics.jsonl").exists()
    }
    lines = [f"## {records}", "", "| method | seed | entropy, 10-step windows (nats) | its last 10 steps | "
             f"full strength | of the last {last} | final reward |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for (method, seed), r in runs.items():
        win = " ".join("–" if w is None else f"{w:.2f}" for w in r["windows"])
        full = "{} of {}".format(*r["full"]) if "full" in r else "–"
        full_last = "{} of {}".format(*r["full_last"]) if "full_last" in r else "–"
        ten = " ".join(f"{x:.2f}" for x in r["last_ten"])
        lines.append(
            f"| {method} | {seed} | {win} | {ten} | {full} | {full_last} | {r['final_reward']:.3f} |"
        )
    lines += ["", f"Final training reward, method minus `{baseline}` on the same seed:", ""]
    for method in dict.fromkeys(m for m, _ in runs):
        if method == baseline:
            continue
        diffs = [
            r["final_reward"] - runs[baseline, seed]["final_reward"]
            for (m, seed), r in runs.items()
            if m == method and (baseline, seed) in runs
        ]
        lines.append(f"- `{method}`: {diff_cell(diffs)}")
    return [*lines, ""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", nargs="*", type=Path, default=DEFAULT)
    ap.add_argument("--family", default="short_cot_smollm2")
    ap.add_argument("--baseline", default="grpo_ds")
    ap.add_argument("--warmup", type=int, default=3, help="steps before the count (the study's warmup_steps)")
    ap.add_argument("--last", type=int, default=20)
    args = ap.parse_args()
    for records in args.records:
        print("\n".join(report(records, args.family, args.baseline, args.warmup, args.last)))


if __name__ == "__main__":
    main()
