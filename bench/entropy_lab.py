"""The entropy lab: entropy collapse and STARE's control of it, without a language model.

A tabular autoregressive softmax policy (logits indexed by prompt, position and previous token)
writes T tokens from a vocabulary of V. The verifiable reward has many correct answers: a sequence
is correct when every transition is allowed, (y_t + y_{t-1} + prompt) mod 4 ≠ 0, so 12 of the 16
tokens are right at each position and the best policies keep high entropy (up to log 12 ≈ 2.48
nats). It is trained with the real ``agentrl.algorithms`` functions: GRPO advantages, DAPO dynamic
sampling, token statistics from logits, a token weighting, the dual-clip surrogate with token-mean
aggregation, and Adam.

What it shows (numbers in docs/algorithms.md): GRPO-ds drifts to low entropy although nothing in the
reward asks for it; STARE with enough strength (or the PI controller) holds entropy near the target.
"In band" is the fraction of the second half of the run (after a warm-up of steps/2, by which time
every method has come down from the uniform start, log 16 = 2.77 nats) with the fresh-rollout
entropy in [0.5, 1.5]·H_tgt.

Usage: .venv/bin/python bench/entropy_lab.py [--steps 400] [--seeds 0 1 2] [--out docs/img/entropy_lab.png]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from agentrl.algorithms import (
    StareController,
    WeightingInputs,
    compute_advantages,
    compute_weights,
    dynamic_sampling_keep,
    loss_normaliser,
    masked_mean,
    policy_loss,
    token_logprobs_and_entropy,
)


@dataclass(frozen=True)
class LabConfig:
    vocab: int = 16
    length: int = 8
    n_prompts: int = 4
    prompts_per_step: int = 16
    group_size: int = 8
    max_rounds: int = 3
    """Dynamic sampling: generation rounds per step until the batch holds ``prompts_per_step`` groups."""
    lr: float = 0.1
    steps: int = 400
    target_entropy: float = 1.0
    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float = 10.0


@dataclass(frozen=True)
class Method:
    name: str
    weighting: str = "none"
    params: dict = field(default_factory=dict)


def methods() -> list[Method]:
    """The compared methods, all STARE variant C2 (docs/algorithms.md, "The entropy lab" lists the same rows)."""
    return [
        Method("GRPO-ds"),
        Method("STARE paper gate (W1.1 M0.9)", "stare", {"controller": StareController()}),
        Method(
            "STARE adaptive (paper: a.01 W<=1.5 M>=.5)",
            "stare",
            {"controller": StareController(law="adaptive", alpha=0.01, w_max=1.5, m_min=0.5)},
        ),
        Method(
            "STARE adaptive (a.05 W<=3 M>=0)",
            "stare",
            {"controller": StareController(law="adaptive", alpha=0.05, w_max=3.0, m_min=0.0)},
        ),
        Method("STARE gate strong (W3 M0.5)", "stare", {"controller": StareController(w=3.0, m=0.5)}),
        Method("STARE PI (W<=3 M>=.5 P<=.2)", "stare", {"controller": pi_controller()}),
    ]


def pi_controller() -> StareController:
    """The PI settings measured in this lab (docs/algorithms.md): tiny policies need W up to ~3."""
    return StareController(law="pi", kp=2.0, ki=0.2, w_max=3.0, m_min=0.5, p_max=0.2)


class TabularPolicy(torch.nn.Module):
    """logits[prompt, position, previous token (V = start), next token]."""

    def __init__(self, cfg: LabConfig):
        super().__init__()
        self.cfg = cfg
        self.table = torch.nn.Parameter(torch.zeros(cfg.n_prompts, cfg.length, cfg.vocab + 1, cfg.vocab))

    def logits(self, prompts: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """prompts [B], tokens [B, T] -> logits [B, T, V] for each position given the previous token."""
        b, t = tokens.shape
        prev = torch.cat([torch.full((b, 1), self.cfg.vocab), tokens[:, :-1]], dim=1)  # [B, T]
        pos = torch.arange(t).expand(b, t)
        return self.table[prompts[:, None].expand(b, t), pos, prev]  # [B, T, V]

    @torch.no_grad()
    def sample(self, prompts: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        b, prev = prompts.shape[0], torch.full((prompts.shape[0],), self.cfg.vocab)
        out = torch.empty(b, self.cfg.length, dtype=torch.long)
        for t in range(self.cfg.length):
            probs = torch.softmax(self.table[prompts, t, prev], dim=-1)
            prev = torch.multinomial(probs, 1, generator=gen).squeeze(-1)
            out[:, t] = prev
        return out


def rewards_of(prompts: torch.Tensor, tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """1.0 when every transition satisfies (y_t + y_{t-1} + prompt) mod 4 != 0 (start token = 0)."""
    prev = torch.cat([torch.zeros_like(tokens[:, :1]), tokens[:, :-1]], dim=1)
    ok = (tokens + prev + prompts[:, None]) % 4 != 0
    return ok.all(dim=1).float()


def collect(policy: TabularPolicy, cfg: LabConfig, gen: torch.Generator):
    """Rollouts with dynamic sampling; also returns the fresh (pre-filter) rollouts of round one."""
    kept_p, kept_y, kept_r, fresh = [], [], [], None
    n_groups = 0
    for _ in range(cfg.max_rounds):
        prompts = torch.randint(cfg.n_prompts, (cfg.prompts_per_step,), generator=gen)
        prompts = prompts.repeat_interleave(cfg.group_size)  # [P·G]
        tokens = policy.sample(prompts, gen)
        rewards = rewards_of(prompts, tokens, cfg.vocab)
        if fresh is None:
            fresh = (prompts, tokens, rewards)
        groups = torch.arange(prompts.shape[0]) // cfg.group_size
        keep = dynamic_sampling_keep(rewards.tolist(), groups.tolist())
        keep = keep[: (cfg.prompts_per_step - n_groups) * cfg.group_size]
        kept_p.append(prompts[keep])
        kept_y.append(tokens[keep])
        kept_r.append(rewards[keep])
        n_groups += len(keep) // cfg.group_size
        if n_groups >= cfg.prompts_per_step:
            break
    return torch.cat(kept_p), torch.cat(kept_y), torch.cat(kept_r), fresh


def train_step(policy, opt, cfg: LabConfig, method: Method, state, gen: torch.Generator):
    prompts, tokens, rewards, (fp, fy, fr) = collect(policy, cfg, gen)
    with torch.no_grad():
        _, fresh_ent = token_logprobs_and_entropy(policy.logits(fp, fy), fy)
        fresh_entropy = float(fresh_ent.mean())
    out = {"fresh_entropy": fresh_entropy, "reward": float(fr.mean()), "batch_size": int(tokens.shape[0])}
    out.update(batch_entropy=math.nan, gate_on=0.0, w=1.0, m=1.0)
    if tokens.shape[0] == 0:
        return out, state
    groups = torch.arange(tokens.shape[0]) // cfg.group_size
    adv = compute_advantages("grpo", rewards, groups)  # [B]
    mask = torch.ones_like(tokens, dtype=torch.bool)
    with torch.no_grad():
        logp_old, ent = token_logprobs_and_entropy(policy.logits(prompts, tokens), tokens)
    inputs = WeightingInputs.build(logp_old, ent, adv, mask)
    params = dict(method.params)
    if method.weighting == "stare":
        params.update(variant="C2", target_entropy=cfg.target_entropy, state=state)
    tw = compute_weights(method.weighting, inputs, **params)
    logp, _ = token_logprobs_and_entropy(policy.logits(prompts, tokens), tokens)
    loss, _, _ = policy_loss(
        logp,
        logp_old,
        adv,
        tw.mask,
        normaliser=loss_normaliser(tw.mask, "token-mean"),
        weights=tw.weights,
        clip=tw.clip,
        clip_low=cfg.clip_low,
        clip_high=cfg.clip_high,
        dual_clip=cfg.dual_clip,
    )
    opt.zero_grad()
    loss.backward()
    opt.step()
    out["batch_entropy"] = float(masked_mean(ent, mask))
    out["gate_on"] = tw.stats.get("gate_on", 0.0)
    out["w"] = tw.stats.get("w", 1.0)
    out["m"] = tw.stats.get("m", 1.0)
    return out, tw.state


def run(method: Method, seed: int, cfg: LabConfig) -> dict[str, list[float]]:
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    policy = TabularPolicy(cfg)
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    curves: dict[str, list[float]] = {}
    state = None
    for _ in range(cfg.steps):
        out, state = train_step(policy, opt, cfg, method, state, gen)
        for k, v in out.items():
            curves.setdefault(k, []).append(v)
    return curves


def in_band_fraction(entropy: list[float], target: float, warmup: int) -> float:
    """Fraction of the steps after ``warmup`` with entropy in [0.5, 1.5]·H_tgt."""
    tail = entropy[warmup:]
    return sum(0.5 * target <= h <= 1.5 * target for h in tail) / max(len(tail), 1)


def summarise(curves: dict[str, list[float]], target: float, tail: int = 20) -> dict[str, float]:
    h, r = curves["fresh_entropy"], curves["reward"]
    hb = [x for x in curves["batch_entropy"][-tail:] if math.isfinite(x)]
    return {
        "final_entropy": sum(h[-tail:]) / tail,
        "final_batch_entropy": sum(hb) / len(hb) if hb else math.nan,
        "in_band": in_band_fraction(h, target, warmup=len(h) // 2),
        "final_reward": sum(r[-tail:]) / tail,
        "min_entropy": min(h),
    }


def compare(cfg: LabConfig, seeds: list[int]) -> tuple[dict, dict]:
    """Run every method on every seed; returns (summary per method, mean curves per method)."""
    summary, mean_curves = {}, {}
    for method in methods():
        runs = [run(method, s, cfg) for s in seeds]
        per_seed = [summarise(c, cfg.target_entropy) for c in runs]
        summary[method.name] = {k: sum(p[k] for p in per_seed) / len(per_seed) for k in per_seed[0]}
        summary[method.name]["per_seed_final_entropy"] = [p["final_entropy"] for p in per_seed]
        mean_curves[method.name] = {
            k: [sum(c[k][i] for c in runs) / len(runs) for i in range(cfg.steps)]
            for k in ("fresh_entropy", "reward")
        }
    return summary, mean_curves


def plot(mean_curves: dict, cfg: LabConfig, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_h, ax_r) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, c in mean_curves.items():
        ax_h.plot(c["fresh_entropy"], label=name)
        ax_r.plot(c["reward"], label=name)
    ax_h.axhline(cfg.target_entropy, color="k", ls="--", lw=0.8, label="H_tgt")
    ax_h.axhspan(0.5 * cfg.target_entropy, 1.5 * cfg.target_entropy, color="k", alpha=0.06)
    ax_h.set(xlabel="step", ylabel="token-mean entropy, fresh rollouts (nats)", title="Entropy")
    ax_r.set(xlabel="step", ylabel="mean reward, fresh rollouts", title="Reward")
    ax_h.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--target", type=float, default=1.0)
    ap.add_argument("--out", type=Path, default=Path("docs/img/entropy_lab.png"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = LabConfig(steps=args.steps, target_entropy=args.target)
    t0 = time.time()
    summary, curves = compare(cfg, args.seeds)
    print(f"entropy lab: {cfg}\nseeds {args.seeds}, {time.time() - t0:.1f} s")
    print(f"{'method':42s} {'final H':>8s} {'batch H':>8s} {'in band':>8s} {'reward':>7s} {'min H':>7s}")
    for name, s in summary.items():
        print(
            f"{name:42s} {s['final_entropy']:8.3f} {s['final_batch_entropy']:8.3f} {100 * s['in_band']:7.0f}% "
            f"{s['final_reward']:7.3f} {s['min_entropy']:7.3f}"
        )
    plot(curves, cfg, args.out)
    args.out.with_suffix(".json").write_text(
        json.dumps({"config": cfg.__dict__, "summary": summary}, indent=1)
    )
    print(f"wrote {args.out} and {args.out.with_suffix('.json')}")
    assert all(math.isfinite(s["final_entropy"]) for s in summary.values())


if __name__ == "__main__":
    main()
