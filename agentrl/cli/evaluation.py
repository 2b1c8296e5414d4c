"""``agentrl eval``: mean@k and pass@k of a run's policy on held-out tasks, written with its episodes, and
compared with another evaluation (``--against``) by a paired bootstrap."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from agentrl.cli.args import checked_inputs, command_config


def cmd_eval(args: argparse.Namespace) -> int:
    cfg = command_config(args)
    from agentrl.assembly import evaluate
    from agentrl.assembly.policy import chosen_policy, policy_engine
    from agentrl.training.checkpoint import latest_checkpoint
    from agentrl.training.metrics import failure_summary

    against = _baseline_outcomes(args.against) if args.against else None  # a bad file: before any work
    run_dir = Path(args.config) if args.config and Path(args.config).is_dir() else None
    newest = latest_checkpoint(run_dir) if run_dir and not args.checkpoint else None
    held_out = cfg.eval.split == "test"
    checked = checked_inputs(
        cfg, train=True, test=held_out, sft=cfg.sft.enabled and not (args.checkpoint or newest)
    )
    if not held_out:
        print(
            f"note: eval.split={cfg.eval.split!r}: these are training tasks, not held-out ones",
            file=sys.stderr,
        )
    policy = chosen_policy(args.config, args.checkpoint, cfg, "evaluating")
    path, label = policy.path, policy.label
    print(f"evaluating {path}", file=sys.stderr)
    engine, tokenizer = policy_engine(cfg, policy)
    tasks = (checked.test_tasks if held_out else checked.train_tasks) or []
    if cfg.eval.num_tasks:
        tasks = tasks[: cfg.eval.num_tasks]
    metrics, episodes = evaluate(cfg, engine, tokenizer, tasks)
    trained = {t.prompt for t in checked.train_tasks or []}
    metrics["tasks_also_in_training"] = float(sum(t.prompt in trained for t in tasks))
    shown: dict[str, float | None] = {k: None if v != v else v for k, v in metrics.items()}  # NaN: JSON null
    out = Path(args.output or (run_dir or Path(cfg.run.output_dir or "runs/eval")) / "eval" / f"{label}.json")
    _write_eval(out, args, cfg, path, shown, episodes, against)
    print(json.dumps(shown, indent=2))
    print(f"written to {out}")
    failure = failure_summary(episodes)
    if failure is not None and failure.fraction < 1.0:  # failed episodes count as wrong: say why they failed
        print(
            f"note: {failure.fraction:.1%} of the episodes failed (counted as wrong), most at the "
            f"'{failure.boundary}' boundary: {failure.message}",
            file=sys.stderr,
        )
    if failure is not None and failure.fraction == 1.0:  # the scores say nothing: say so in the status
        print(
            f"every episode failed, most at the '{failure.boundary}' boundary: {failure.message}",
            file=sys.stderr,
        )
        return 3
    return 0


def _write_eval(
    out: Path,
    args: argparse.Namespace,
    cfg: Any,
    path: str,
    shown: dict[str, float | None],
    episodes: list[Any],
    against: dict[str, list[bool]] | None,
) -> None:
    """The evaluation's JSON record (per-task outcomes, the paired comparison) and its transcripts."""
    from agentrl.training.evaluation import outcomes

    out.parent.mkdir(parents=True, exist_ok=True)
    by_task = outcomes(episodes)
    record: dict[str, Any] = {"checkpoint": str(path), "split": cfg.eval.split, **shown}
    record["per_task"] = {t: [sum(v), len(v)] for t, v in by_task.items()}  # correct of n samples
    if against is not None:
        record["compared_with"] = {"file": args.against, **_compare(against, by_task, args.against)}
    out.write_text(json.dumps(record, indent=2))
    if args.transcripts:
        from agentrl.transcripts import TranscriptWriter

        with TranscriptWriter(args.transcripts) as w:
            w.write(episodes)


def _baseline_outcomes(path: str) -> dict[str, list[bool]]:
    """``--against FILE``: per task, the outcomes of an earlier ``agentrl eval`` JSON."""
    from agentrl.config import ConfigError

    try:
        per_task = json.loads(Path(path).read_text())["per_task"]
        return {t: [True] * int(c) + [False] * (int(n) - int(c)) for t, (c, n) in per_task.items()}
    except FileNotFoundError:
        raise ConfigError(f"--against {path}: no such file (an earlier agentrl eval's JSON)") from None
    except (KeyError, ValueError, TypeError) as e:
        raise ConfigError(
            f"--against {path}: not an agentrl eval JSON with per-task results ({type(e).__name__}: {e}); "
            "evaluations written before per_task existed need to be run again"
        ) from None


def _compare(before: dict[str, list[bool]], after: dict[str, list[bool]], label: str) -> dict[str, Any]:
    """The paired bootstrap of ``after`` against ``before``, printed and returned."""
    from agentrl.training.evaluation import paired_bootstrap

    result = paired_bootstrap(before, after)
    for name, r in result.items():
        print(
            f"{name}: {r['before']:.3f} ({label}) -> {r['after']:.3f}: {r['change']:+.3f} "
            f"(95% interval {r['ci_low']:+.3f} to {r['ci_high']:+.3f}, paired bootstrap over "
            f"{int(r['tasks'])} tasks)"
        )
    return result
