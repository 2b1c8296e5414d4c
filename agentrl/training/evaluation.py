"""Evaluation: mean@k and pass@k of a policy on held-out tasks, as the trainer, ``agentrl eval`` and
the study run it (``agentrl/assembly/evaluation.py`` builds the runner from a config)."""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence

from agentrl.env import Task
from agentrl.episode import Episode
from agentrl.rollout.runner import EpisodeRequest, EpisodeRunner
from agentrl.training.metrics import is_correct

Gather = Callable[[Callable[[list], list], list], list]
"""``(run, requests) -> episodes``: how the ranks share a batch (``Collector.gather``)."""


EVAL_SEED = 10_007
"""Added to ``run.seed`` for the evaluation's runner: its samples never repeat a training step's."""


def evaluate_with(
    runner: EpisodeRunner, tasks: Sequence[Task], k: int, gather: Gather | None = None
) -> tuple[dict[str, float], list[Episode]]:
    """mean@k (average correctness over k samples per task) and pass@k (any of k correct) on
    ``tasks``, run by ``runner`` (closed here). ``gather``: under torchrun, how the ranks split the
    episodes and share them (the trainer's ``Collector.gather``); None runs them all here."""
    try:
        reqs = [
            EpisodeRequest(t, seed=i * k + j, group=f"eval-{t.id}", episode_id=f"eval-{t.id}-{j}")
            for i, t in enumerate(tasks)
            for j in range(k)
        ]
        episodes = gather(runner.run, reqs) if gather else runner.run(reqs)
    finally:
        runner.close()
    by_task = outcomes(episodes)
    mean_k = sum(sum(v) / len(v) for v in by_task.values()) / max(len(by_task), 1)
    pass_k = sum(any(v) for v in by_task.values()) / max(len(by_task), 1)
    rewards = [e.reward for e in episodes if not e.failed]
    n = max(len(episodes), 1)
    metrics = {
        "eval/mean@k": mean_k,
        "eval/pass@k": pass_k,
        "eval/k": float(k),
        "eval/tasks": float(len(by_task)),
        "eval/reward": sum(rewards) / len(rewards) if rewards else math.nan,
        "eval/failed_frac": sum(e.failed for e in episodes) / max(len(episodes), 1),
        "eval/tool_frac": sum(any(s.role == "tool" for s in e.segments) for e in episodes) / n,
        "eval/policy_tokens": sum(sum(e.loss_mask()) for e in episodes) / n,
    }
    return metrics, episodes


def outcomes(episodes: Sequence[Episode]) -> dict[str, list[bool]]:
    """Per task id, whether each of its samples was correct (a failed episode counts as wrong)."""
    by_task: dict[str, list[bool]] = defaultdict(list)
    for e in episodes:
        by_task[e.task_id].append(is_correct(e) and not e.failed)
    return dict(by_task)


def paired_bootstrap(
    before: Mapping[str, Sequence[bool]],
    after: Mapping[str, Sequence[bool]],
    resamples: int = 10_000,
    seed: int = 0,
) -> dict[str, dict[str, float]]:
    """The change in mean@k and pass@k from ``before`` to ``after`` (per task, its samples' outcomes)
    with a 95 % interval from a paired bootstrap over tasks: the same tasks are drawn with replacement
    for both sides, ``resamples`` times, and the 2.5th and 97.5th percentiles of the difference are
    kept. Both must hold the same task ids (the same held-out tasks and seeds)."""
    if set(before) != set(after):
        only = sorted(set(before) ^ set(after))
        raise ValueError(
            f"the two evaluations are not on the same tasks ({len(only)} task ids in one only, e.g. "
            f"{only[0]!r}): evaluate both with the same config, data and eval.num_tasks"
        )
    ids = sorted(before)
    if not ids:
        raise ValueError("no tasks to compare")
    rows = {
        "mean@k": (
            [sum(before[t]) / len(before[t]) for t in ids],
            [sum(after[t]) / len(after[t]) for t in ids],
        ),
        "pass@k": ([float(any(before[t])) for t in ids], [float(any(after[t])) for t in ids]),
    }
    rng = random.Random(seed)
    draws = [[rng.randrange(len(ids)) for _ in ids] for _ in range(resamples)]
    out = {}
    for name, (b, a) in rows.items():
        diffs = sorted(sum(a[i] - b[i] for i in d) / len(d) for d in draws)
        out[name] = {
            "before": sum(b) / len(b),
            "after": sum(a) / len(a),
            "change": (sum(a) - sum(b)) / len(ids),
            "ci_low": diffs[int(0.025 * resamples)],
            "ci_high": diffs[min(int(0.975 * resamples), resamples - 1)],
            "tasks": float(len(ids)),
        }
    return out


def pass_at_k_curve(episodes: Sequence[Episode], k_max: int) -> dict[int, float]:
    """pass@j for j = 1 … ``k_max``, averaged over tasks, with the unbiased estimator of Chen et al.
    (2021): for a task with n samples of which c are correct, pass@j = 1 - C(n-c, j) / C(n, j).
    Every task needs at least ``k_max`` samples; a failed episode counts as wrong."""
    by_task = outcomes(episodes)
    if not by_task:
        return {}
    short = min(len(v) for v in by_task.values())
    if short < k_max:
        raise ValueError(f"pass@{k_max} needs at least {k_max} samples per task; a task has {short}")
    curve = {}
    for j in range(1, k_max + 1):
        total = 0.0
        for v in by_task.values():
            n, c = len(v), sum(v)
            total += 1.0 if n - c < j else 1.0 - math.comb(n - c, j) / math.comb(n, j)
        curve[j] = total / len(by_task)
    return curve
