"""The critical weight W* of STARE at small scale: tabular against network-level, against the
response length T and the batch size (issue 69; docs/study.md, "The critical-weight map").

For each task (a config with overrides), checkpoint and batch size G (informative groups), on
fresh batches of the policy's own rollouts at π = π_old:
- the tabular balance from the π_old pass's φ (``stare_balance.entropy_balance``): W*_tab;
- the network-level first-order balance. Three gradients of the same batch's loss, with ω ≡ 1
  (g1), ω = 1 on STARE's L+ only (g+) and on L− only (g−), against the gradient h of the summed
  entropy of the trained tokens. A step Δθ = −η·P·g(W, M) with g(W, M) = g1 + (W−1)·g+ − (1−M)·g−
  changes the entropy by ΔH/η = −h·P·g1 + (W−1)·(−h·P·g+) + (1−M)·(h·P·g−) to first order: the
  same form as the tabular balance with Λ = h·P·g1, Γ+ = −h·P·g+, Γ− = h·P·g−. P is the identity
  (SGD: what parameter sharing alone changes) and Adam's preconditioner 1/(√v + ε), with v the mean
  square of the ω ≡ 1 gradients of every batch measured at that checkpoint (a run's v is an average
  of its recent steps' squared gradients; the checkpoints here carry no optimizer state);
- one real preconditioned step θ' = θ − lr·P_Adam·g(W, 1) at W ∈ {1, 1.1, W*_net,Adam} (O1, at the
  config's ``trainer.lr``), and the batch's measured entropy change beside the first-order one: the
  second-order gap.

The tabular picture (one softmax per position, no shared parameters, SGD on the logits) is exact
for a tabular policy: ``tests/algorithms/test_critical_weight.py`` checks that this script's network
balance equals ``entropy_balance`` there.

Usage (the CPU subset of docs/study.md; each task builds its own warm start, cached):
  .venv/bin/python bench/critical_weight.py \\
      --task "short1=configs/real/short_cot_smollm2.yaml" \\
      --task "short3=configs/real/short_cot_smollm2.yaml data.options.steps=3" \\
      --groups 2,8,32 --repeats 2 --out docs/critical_weight.json --plot docs/img/critical_weight.png
  --checkpoint LABEL=DIR adds a checkpoint (model.path=DIR, sft.enabled=false) beside the task's
  warm start, e.g. a GRPO-ds run's ``checkpoints/step_N``.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from agentrl.algorithms.stare import stare_selection
from agentrl.algorithms.stare_balance import Balance, entropy_balance
from agentrl.training.learner import weighting_inputs

ADAM_EPS = 1e-8


# -- the network-level balance: pure functions of flat gradients (tested on a tabular policy) --------
def network_balance(
    h: torch.Tensor, g1: torch.Tensor, gp: torch.Tensor, gn: torch.Tensor, p: torch.Tensor | None
) -> Balance:
    """Λ, Γ+, Γ− of the first-order entropy change of a step −η·P·g(W, M) (see the module's
    docstring); ``p`` the diagonal preconditioner (None: the identity). Sums in float64."""
    hp = h.double() if p is None else h.double() * p.double()
    return Balance(
        drive=float(hp @ g1.double()),
        gain_pos=-float(hp @ gp.double()),
        gain_neg=float(hp @ gn.double()),
        lowering_frac=math.nan,
    )


def adam_preconditioner(squares: torch.Tensor) -> torch.Tensor:
    """1/(√v + ε) of a second-moment estimate ``squares`` (the mean of g1² over batches)."""
    return 1.0 / (squares.sqrt() + ADAM_EPS)


def first_order_change(balance: Balance, lr: float, w: float, m: float = 1.0) -> float:
    """The predicted ΔH of a step at learning rate ``lr`` (``Balance.change`` is ΔH/η)."""
    return lr * balance.change(w, m)


# -- the model side: gradients of one batch, a step, the entropy --------------------------------
def _params(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def batch_gradients(
    learner: Any, batch: Any, share: torch.Tensor, l_pos: torch.Tensor, l_neg: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Flat gradients g1, g+, g− of the policy loss at π = π_old (where the clipped objective's
    gradient is −Σ c·ω·A·∇log π) and h of the summed entropy of the trained tokens, accumulated
    over micro-batches of ``trainer.micro_batch_size`` rows."""
    params = _params(learner.train_module)
    size = sum(p.numel() for p in params)
    out = {k: torch.zeros(size, dtype=torch.float32) for k in ("g1", "gp", "gn", "h")}
    for rows in torch.arange(batch.size).split(learner.settings.trainer.micro_batch_size):
        sub = batch.rows(rows)
        logp, ent = learner.passes.forward(learner.train_module, sub, grad=True)
        w = sub.mask.shape[1]
        coef = share[rows, :w] * sub.advantages[:, None]
        objectives = {
            "g1": -(coef * logp).sum(),
            "gp": -(coef * l_pos[rows, :w] * logp).sum(),
            "gn": -(coef * l_neg[rows, :w] * logp).sum(),
            "h": (sub.mask * ent).sum(),
        }
        for i, (name, value) in enumerate(objectives.items()):
            grads = torch.autograd.grad(
                value, params, retain_graph=i < len(objectives) - 1, allow_unused=True
            )
            flat = torch.cat(
                [(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, params)]
            )
            out[name] += flat.float()
    return out


def summed_entropy(learner: Any, batch: Any) -> float:
    """Σ of the entropy over the batch's trained tokens under the current weights (no grad)."""
    _, ent = learner.passes.no_grad(learner.model, batch)[:2]
    return float((batch.mask * ent).sum())


def measured_step(
    learner: Any, batch: Any, grads: dict[str, torch.Tensor], p: torch.Tensor, lr: float, w: float
) -> float:
    """The batch's measured entropy change after θ' = θ − lr·P·(g1 + (W−1)·g+); θ restored after."""
    params = _params(learner.train_module)
    before = summed_entropy(learner, batch)
    step = (lr * p * (grads["g1"] + (w - 1.0) * grads["gp"])).to(params[0].dtype)
    saved = [q.detach().clone() for q in params]
    with torch.no_grad():
        offset = 0
        for q in params:
            q.sub_(step[offset : offset + q.numel()].view_as(q))
            offset += q.numel()
    try:
        return summed_entropy(learner, batch) - before
    finally:
        with torch.no_grad():
            for q, s in zip(params, saved):
                q.copy_(s)


# -- batches of informative groups --------------------------------------------------------------
def informative_groups(trainer: Any, need: int, max_steps: int) -> list[list[Any]]:
    """``need`` informative groups of fresh rollouts (dynamic sampling keeps only those)."""
    groups: dict[str, list[Any]] = {}
    for step in range(max_steps):
        _, kept, _ = trainer.collect(step)
        for ep in kept:
            groups.setdefault(f"{step}/{ep.group}", []).append(ep)
        if len(groups) >= need:
            break
    if len(groups) < need:
        raise SystemExit(f"only {len(groups)} informative groups in {max_steps} collections; {need} needed")
    return list(groups.values())[:need]


def measure_batch(trainer: Any, episodes: list[Any]) -> dict[str, Any]:
    """One batch at π = π_old: its tabular balance and its four gradients."""
    learner = trainer.learner
    batch = learner.make_batch(episodes)
    stats = learner.policy_stats(batch)
    batch.advantages, _ = learner.advantages(batch, stats, None)

    inputs = weighting_inputs(learner.settings.algorithm, batch, stats)  # φ and the shares c
    top_ratio = learner.settings.weighting_settings.P  # algorithm.stare
    l_pos, l_neg, _, _ = stare_selection(inputs, top_ratio, [torch.arange(batch.size)])
    assert inputs.phi is not None and inputs.share is not None
    tab = entropy_balance(inputs.phi, inputs.advantages, inputs.share, l_pos, l_neg)
    grads = batch_gradients(learner, batch, inputs.share, l_pos.float(), l_neg.float())
    lengths = batch.mask.sum(1)
    return {
        "batch": batch,
        "grads": grads,
        "episodes": len(episodes),
        "tokens": float(batch.mask.sum()),
        "T_mean": float(lengths.mean()),
        "tab": tab,
    }


def _row(m: dict[str, Any], p_adam: torch.Tensor, trainer: Any, weights: list[float]) -> dict[str, Any]:
    g = m["grads"]
    sgd = network_balance(g["h"], g["g1"], g["gp"], g["gn"], None)
    adam = network_balance(g["h"], g["g1"], g["gp"], g["gn"], p_adam)
    lr = trainer.learner.settings.trainer.lr
    steps = []
    for w in [*weights, adam.w_star]:
        if not math.isfinite(w):
            continue
        steps.append(
            {
                "W": w,
                "predicted": first_order_change(adam, lr, w),
                "measured": measured_step(trainer.learner, m["batch"], g, p_adam, lr, w),
            }
        )
    return {
        "episodes": m["episodes"],
        "tokens": m["tokens"],
        "T_mean": m["T_mean"],
        "tab": asdict(m["tab"]) | {"w_star": m["tab"].w_star, "w_star_c2": m["tab"].w_star_c2},
        "net_sgd": asdict(sgd) | {"w_star": sgd.w_star, "w_star_c2": sgd.w_star_c2},
        "net_adam": asdict(adam) | {"w_star": adam.w_star, "w_star_c2": adam.w_star_c2},
        "steps": steps,
    }


def run_point(
    label: str, overrides: list[str], groups: list[int], repeats: int, group_size: int
) -> Iterator[dict[str, Any]]:
    """Every (batch size, repeat) of one task at one checkpoint."""
    from agentrl.assembly import make_trainer
    from agentrl.config import load_config

    config, *over = overrides
    cfg = load_config(
        None if config == "-" else config,
        [
            *over,
            "algorithm.name=stare",
            "algorithm.stare.variant=O1",
            "algorithm.dynamic_sampling=true",
            "algorithm.max_sampling_rounds=1",
            f"rollout.group_size={group_size}",
            f"rollout.prompts_per_step={max(groups)}",
            "logging.tensorboard=false",
            "logging.plots=false",
            "trainer.checkpoint_every=0",
        ],
    )
    trainer = make_trainer(cfg, log=lambda *_: None)
    pool = informative_groups(trainer, sum(groups) * repeats, max_steps=64)
    measured, start = [], 0
    for n in groups:
        for r in range(repeats):
            eps = [ep for grp in pool[start : start + n] for ep in grp]
            start += n
            t0 = time.perf_counter()
            measured.append((n, r, measure_batch(trainer, eps), time.perf_counter() - t0))
    squares = torch.stack([m["grads"]["g1"].square() for _, _, m, _ in measured]).mean(0)
    p_adam = adam_preconditioner(squares)
    for n, r, m, took in measured:
        t0 = time.perf_counter()
        row = _row(m, p_adam, trainer, weights=[1.0, 1.1])
        yield {"label": label, "groups": n, "repeat": r, "seconds": took + time.perf_counter() - t0, **row}


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """W* − 1 against the mean response length T, per batch size, tabular and network-level."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 4), sharey=True)
    for ax, kind, title in zip(
        axes, ("tab", "net_sgd", "net_adam"), ("tabular", "network, SGD", "network, Adam")
    ):
        for n in sorted({r["groups"] for r in rows}):
            pts = [(r["T_mean"], r[kind]["w_star"] - 1.0) for r in rows if r["groups"] == n]
            pts = [(t, y) for t, y in pts if math.isfinite(y) and y > 0]
            if pts:
                ax.scatter(*zip(*pts), label=f"{n} groups")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("mean response length T (policy tokens)")
        ax.set_title(f"W* − 1, {title}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("W* − 1 (finite, > 0)")
    axes[0].legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: per (task, batch size), W* tabular / SGD / Adam (median over repeats) and the
    measured entropy change at W*_Adam beside the predicted one."""
    lines = [
        "| task | groups | T | tokens | W* tab | W* net SGD | W* net Adam | ΔH at W*_Adam: first order / measured |",
        "|---|---|---|---|---|---|---|---|",
    ]
    keys = sorted({(r["label"], r["groups"]) for r in rows}, key=lambda k: (k[0], k[1]))
    for label, n in keys:
        rs = [r for r in rows if r["label"] == label and r["groups"] == n]

        def med(kind: str, rs: list[dict[str, Any]] = rs) -> str:
            xs = [r[kind]["w_star"] for r in rs]
            finite = [x for x in xs if math.isfinite(x)]
            return (
                f"{statistics.median(finite):.2f}"
                if len(finite) == len(xs)
                else f"{', '.join(f'{x:.2f}' for x in xs)}"
            )

        last = [s for r in rs for s in r["steps"][-1:] if s["W"] not in (1.0, 1.1)]
        dh = "; ".join(f"{s['predicted']:+.3g} / {s['measured']:+.3g}" for s in last) or "–"
        lines.append(
            f"| {label} | {n} | {statistics.fmean(r['T_mean'] for r in rs):.0f} | "
            f"{statistics.fmean(r['tokens'] for r in rs):.0f} | {med('tab')} | {med('net_sgd')} | {med('net_adam')} | {dh} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--task",
        action="append",
        required=True,
        help="LABEL=CONFIG [overrides...] (quoted; CONFIG - for none)",
    )
    ap.add_argument("--checkpoint", action="append", default=[], help="LABEL=DIR: also measure these weights")
    ap.add_argument("--groups", default="2,8,32")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--set", nargs="*", default=[], help="overrides for every task")
    ap.add_argument("--out", type=Path, default=Path("critical_weight.json"))
    ap.add_argument("--plot", type=Path, default=None)
    args = ap.parse_args()
    groups = [int(x) for x in args.groups.split(",")]
    points = []
    for spec in args.task:
        label, rest = spec.split("=", 1)
        words = shlex.split(rest)
        points.append((f"{label}/warm", [*words, *args.set]))
        for ck in args.checkpoint:
            name, path = ck.split("=", 1)
            points.append((f"{label}/{name}", [*words, *args.set, f"model.path={path}", "sft.enabled=false"]))
    rows: list[dict[str, Any]] = []
    for label, over in points:
        for row in run_point(label, over, groups, args.repeats, args.group_size):
            rows.append(row)
            args.out.write_text(json.dumps(rows, indent=1))
            print(
                f"{label} G={row['groups']} r={row['repeat']}: T={row['T_mean']:.0f} W*tab {row['tab']['w_star']:.3g} "
                f"net SGD {row['net_sgd']['w_star']:.3g} Adam {row['net_adam']['w_star']:.3g} ({row['seconds']:.0f} s)",
                flush=True,
            )
    print(table(rows))
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
