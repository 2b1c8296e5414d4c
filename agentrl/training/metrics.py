"""Step metrics: ``metrics.jsonl`` (one line per step, flushed), TensorBoard, optional wandb, and PNG
plots regenerated from the JSONL file (``agentrl plot RUN_DIR``)."""

from __future__ import annotations

import json
import math
import os
import warnings
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.episode import Episode
from agentrl.transcripts import read_metrics

CURVES: dict[str, str] = {
    "reward": "reward/mean",
    "correct": "reward/correct",
    "entropy": "entropy/mean",
    "entropy_branching": "entropy/branching",
    "entropy_rollout": "entropy/rollout",
    "length": "length/policy_tokens",
    "turns": "length/turns",
    "failed": "episodes/failed_frac",
    "gate": "stare/gate_on",
    "W": "stare/w",
    "M": "stare/m",
    "target": "stare/target_entropy",
    "mean_weight": "stare/mean_weight",
    "W_star": "stare/w_star",
    "drive": "stare/lambda",
    "gain_pos": "stare/gamma_pos",
    "gain_neg": "stare/gamma_neg",
    "dH": "stare/dH_first_order",
    "clip_low": "loss/clip_frac_low",
    "clip_high": "loss/clip_frac_high",
    "clip_dual": "loss/dual_clip_frac",
    "eval_mean": "eval/mean@k",
    "eval_pass": "eval/pass@k",
    "step_s": "time/step_s",
    "tokens_s": "tokens/s",
}
"""The one table of metric names the views read (the HTML viewer, the PNG plots, the console summary):
what a view calls a curve -> the name the trainer writes in ``metrics.jsonl``. STARE's are its record's
``stats`` keys under ``stare/``; ``tests/views/test_viewer_browser.py`` checks every name against a real run."""
IMPORTANT = [
    CURVES[k]
    for k in (
        "reward",
        "entropy",
        "length",
        "gate",
        "entropy_branching",
        "W",
        "W_star",
        "M",
        "clip_low",
        "clip_high",
        "failed",
        "step_s",
        "tokens_s",
    )
]
"""The curves the viewer shows first, in this order."""
PLOTS: dict[str, list[str]] = {
    "entropy": [CURVES[k] for k in ("entropy", "entropy_branching", "entropy_rollout", "target")],
    "reward": [CURVES[k] for k in ("reward", "correct", "eval_mean", "eval_pass")],
    "length": [CURVES[k] for k in ("length", "turns")],
    "clip": [CURVES[k] for k in ("clip_low", "clip_high", "clip_dual")],
    "stare_gate": [CURVES[k] for k in ("gate", "W", "W_star", "M", "mean_weight")],
    "stare_balance": [CURVES[k] for k in ("drive", "gain_pos", "gain_neg", "dH")],
}


def episode_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """Metrics over all episodes of the step (fresh rollouts, before any filter)."""
    ok = [e for e in episodes if not e.failed]
    out: dict[str, float] = {"episodes/count": float(len(episodes)), **group_metrics(episodes)}
    out["episodes/failed_frac"] = 1 - len(ok) / max(len(episodes), 1)
    for boundary, n in Counter(e.failure.boundary for e in episodes if e.failure).items():
        out[f"failures/{boundary}"] = float(n)
    if any(e.metrics.get("judged") for e in episodes):  # a judge reward scored (or failed) these
        out["rewards/judge_failed_frac"] = out.get("failures/judge", 0.0) / len(episodes)
    for reason, n in Counter(e.stop_reason for e in episodes).items():
        out[f"stop/{reason}"] = n / len(episodes)
    if ok:
        out["reward/mean"] = sum(e.reward for e in ok) / len(ok)
        comps = defaultdict(list)
        for e in ok:
            for k, v in e.reward_components.items():
                comps[k].append(v)
        out.update({f"reward/{k}": sum(v) / len(v) for k, v in comps.items()})
        out["length/policy_tokens"] = sum(e.num_policy_tokens for e in ok) / len(ok)
        out["length/turns"] = sum(e.num_turns for e in ok) / len(ok)
        out["tools/calls"] = sum(e.metrics.get("tool_calls", 0) for e in ok) / len(ok)
    out["length/policy_tokens_total"] = float(sum(e.num_policy_tokens for e in episodes))
    surprisal = [-lp for e in episodes for s in e.segments if s.logprobs for lp in s.logprobs]
    if surprisal:
        # E[-log p(y)] over sampled tokens is the sampling distribution's entropy, averaged over the
        # positions visited: the entropy of fresh rollouts, with no extra forward pass.
        out["entropy/rollout"] = sum(surprisal) / len(surprisal)
    out.update(answer_metrics(episodes))
    out.update(context_metrics(episodes))
    return out


def context_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """What ``rollout.context`` did (written on steps where it acted): the share of episodes that
    compacted, windowed or stopped at the budget, compactions and windows per episode, and the mean
    summary length in tokens."""
    events = [e.metrics.get("context") or [] for e in episodes]
    if not any(events):
        return {}
    n = len(episodes)
    out = {}
    for kind in ("compaction", "window", "stop"):
        counts = [sum(1 for x in ev if x["kind"] == kind) for ev in events]
        out[f"context/{kind}_frac"] = sum(1 for c in counts if c) / n
        if kind != "stop":
            out[f"context/{kind}s"] = sum(counts) / n
    summaries = [
        next(len(s.token_ids) for s in reversed(e.segments[: b["segment"]]) if s.role == "policy")
        for e in episodes
        for b in e.sample_breaks
        if b.get("reason") == "compaction"
    ]
    if summaries:
        out["context/summary_tokens"] = sum(summaries) / len(summaries)
    return out


def answer_flags(ep: Episode) -> list[bool] | None:
    """Per token of ``ep.token_ids()``: a policy token written up to (and including) the end of its
    turn's answer (``metrics.answer_tokens``, recorded where the environment declares stop
    conditions); None when the episode has no such record."""
    counts = ep.metrics.get("answer_tokens")
    if counts is None:
        return None
    flags: list[bool] = []
    used: dict[int, int] = {}
    for seg in ep.segments:
        if seg.role != "policy":
            flags += [False] * len(seg.token_ids)
            continue
        limit, before = counts.get(str(seg.turn), len(seg.token_ids)), used.get(seg.turn, 0)
        flags += [before + k < limit for k in range(len(seg.token_ids))]
        used[seg.turn] = before + len(seg.token_ids)
    return flags


def answer_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """Where the answer ends (episodes whose environment declares stop conditions): the mean
    surprisal of the policy tokens up to each turn's answer end (``entropy/rollout_answer``, beside
    ``entropy/rollout`` over all of them), the fraction of policy tokens written after it and of
    episodes with any (``length/after_answer_frac``, ``episodes/after_answer_frac``). With the answer
    stop on, nothing follows an answer and the two entropies agree."""
    inside: list[float] = []
    after = with_tail = counted = 0
    for ep in episodes:
        flags = answer_flags(ep)
        if flags is None:
            continue
        counted += 1
        tail = 0
        for flag, role, lp in zip(flags, ep.roles(), ep.engine_logprobs()):
            if role != "policy" or lp is None:
                continue
            if flag:
                inside.append(-lp)
            else:
                tail += 1
        after += tail
        with_tail += tail > 0
    if not counted:
        return {}
    out = {"episodes/after_answer_frac": with_tail / counted}
    if inside or after:
        out["length/after_answer_frac"] = after / (len(inside) + after)
    if inside:
        out["entropy/rollout_answer"] = sum(inside) / len(inside)
    return out


def group_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """``groups/count``, the step's groups (every group any of its episodes belongs to, over all
    sampling rounds), and the fractions of them whose episodes that did not fail are all correct, or
    all wrong (``is_correct``); a group whose episodes all failed is neither. The collector adds
    ``groups/informative_frac`` of the same count (docs/training.md, "Group metrics")."""
    correct: dict[Any, list[bool]] = {e.group: [] for e in episodes}
    for e in episodes:
        if not e.failed:
            correct[e.group].append(is_correct(e))
    n = max(len(correct), 1)
    return {
        "groups/count": float(len(correct)),
        "groups/all_correct_frac": sum(bool(g) and all(g) for g in correct.values()) / n,
        "groups/all_wrong_frac": sum(bool(g) and not any(g) for g in correct.values()) / n,
    }


@dataclass(frozen=True)
class FailureSummary:
    """The failed episodes of a step: their share and the most frequent failure."""

    fraction: float
    boundary: str
    message: str
    """The first line of the most frequent failure's message."""
    count: int
    """Episodes that failed with this boundary and message."""
    example: str
    """The id of one such episode (``agentrl replay RUN --episode ID``)."""

    def __str__(self) -> str:
        return f"{self.boundary}: {self.message}"


def failure_summary(episodes: Sequence[Episode]) -> FailureSummary | None:
    """None when no episode failed."""
    failed = [(e.id, e.failure.boundary, _one_line(e.failure.message)) for e in episodes if e.failure]
    if not failed:
        return None
    (boundary, message), count = Counter((b, m) for _, b, m in failed).most_common(1)[0]
    example = next(i for i, b, m in failed if (b, m) == (boundary, message))
    return FailureSummary(len(failed) / len(episodes), boundary, message, count, example)


def _one_line(message: str) -> str:
    lines = [x for x in message.strip().splitlines() if x.strip()]
    return lines[-1][:300] if lines else ""


def is_correct(ep: Episode) -> bool:
    """A solved episode: its ``correct`` reward component is positive, or (without one) its reward."""
    if "correct" in ep.reward_components:
        return ep.reward_components["correct"] > 0
    return ep.reward > 0


class MetricsLogger:
    """Every step's metrics go to ``metrics.jsonl`` (resume, the viewer and plots read it); TensorBoard
    and W&B get every ``every``-th step (``logging.log_every``) and the last one (``close``)."""

    def __init__(
        self,
        run_dir: Path,
        tensorboard: bool = True,
        wandb_project: str | None = None,
        config: Mapping[str, Any] | None = None,
        every: int = 1,
        start_step: int = 0,
    ):
        """``start_step``: the step a resumed run continues from; TensorBoard hides the events a
        killed invocation wrote from that step on (``purge_step``), so no step shows twice."""
        self.path = Path(run_dir) / "metrics.jsonl"
        self.every = every
        self._pending: tuple[int, dict[str, Any]] | None = None  # a step not yet sent to TB/W&B
        self.tb = None
        self.wandb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(Path(run_dir) / "tensorboard"), purge_step=start_step or None)
        if wandb_project:
            try:
                import wandb
            except ImportError as e:
                raise RuntimeError(
                    "logging.wandb is on but the wandb package is not installed: pip install 'agentrl[wandb]'"
                ) from e
            self.wandb = wandb.init(project=wandb_project, config=config, dir=str(run_dir), resume="allow")

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        row = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self._pending = (step, row)
        if step % self.every == 0:
            self._send()

    def _send(self) -> None:
        if self._pending is None:
            return
        step, row = self._pending
        self._pending = None
        if self.tb is not None:
            for k, v in row.items():
                if k != "step" and isinstance(v, (int, float)):
                    self.tb.add_scalar(k, v, step)
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log(row, step=step)

    def close(self) -> None:
        self._send()  # the last step, whatever ``every`` is
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
            style = "--" if k == CURVES["target"] else "-"
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
