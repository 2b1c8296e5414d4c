"""One RL step of agentrl against TRL's GRPOTrainer: same tiny model, prompts, group size,
completion length and batch, in one run on one machine.

    .venv/bin/pip install trl          # bench-only dependency; it does not touch torch
    .venv/bin/python bench/train_step.py --steps 6 --rounds 3 --preset h128-L8

Both sides: the same randomly initialised tiny Qwen2 model (so completions run to the length cap),
prompts from the calculator tasks (single turn, no tools, to match TRL's single-turn loop), 4 prompts
× 8 generations = 32 sequences per step, up to 128 new tokens, temperature 1, no KL (β = 0), one
optimizer step per batch, float32, AdamW, the same learning rate. Reward: a cheap length-based
function on both sides (the reward is not what is timed). The first step of each side is a warm-up
and is excluded. Reported: median seconds per step, policy tokens per second, peak RSS. With
``--rounds N`` all sides run N times, in a rotated order, and each figure is the median over rounds
(the per-round ratios are printed too): on a shared machine, speed drifts between runs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

import torch

from agentrl.config import load_config
from agentrl.env import Environment, EpisodeState, Reward, StepResult, Task, register
from agentrl.models import ensure_tiny_base, load_policy

PROMPTS = 4
GROUP = 8
MAX_NEW = 128


@register
class BenchSingleTurn(Environment):
    """One turn, no tools; reward = distinct characters / 10 (varied, so every group trains)."""

    name = "bench_single_turn"
    max_turns = 1

    @classmethod
    def load_tasks(cls, split, n=None, seed=0, **options):
        from environments.calculator import Calculator

        return Calculator.load_tasks(split, n=n or 64, seed=seed)

    def step(self, action: str) -> StepResult:
        return StepResult([], 0.0, True, False, {"answer": action})

    def rewards(self):
        return [Reward("variety", variety)]


def variety(task: Task, state: EpisodeState) -> float:
    return len(set(state.final_text or "")) / 10.0


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_agentrl(model_dir: str, steps: int, lr: float, baseline: bool = False) -> dict:
    """``baseline``: the step as it was before the lean decode step, the shared-prefix forward and
    the reuse of the gradient forward's log-probs (all three off), to show what they bring."""
    from agentrl.training.trainer import Trainer

    out = tempfile.mkdtemp(prefix="bench-agentrl-")
    cfg = load_config(
        None,
        [
            f"model.path={model_dir}",
            "env.name=bench_single_turn",
            f"run.output_dir={out}",
            "run.device=cpu",
            f"rollout.prompts_per_step={PROMPTS}",
            f"rollout.group_size={GROUP}",
            f"rollout.max_tokens_per_turn={MAX_NEW}",
            "rollout.max_episode_tokens=512",
            "algorithm.name=grpo",
            "algorithm.dynamic_sampling=false",
            f"trainer.total_steps={steps}",
            f"trainer.lr={lr}",
            f"trainer.micro_batch_size={PROMPTS * GROUP}",
            "logging.tensorboard=false",
            "logging.plots=false",
            "logging.transcripts=false",
            "trainer.checkpoint_every=0",
            f"trainer.share_prefix={str(not baseline).lower()}",
        ],
    )
    trainer = Trainer(cfg, log=lambda *_: None)
    if baseline:
        trainer.learner.fuse_old_logprobs = False
        trainer.engine.decode_path = "transformers"  # type: ignore[attr-defined]
    times, tokens, rollout = [], [], []
    for step in range(steps):
        t0 = time.perf_counter()
        out_step = trainer.train_step(step)
        times.append(time.perf_counter() - t0)
        tokens.append(out_step.metrics["length/policy_tokens_total"])
        rollout.append(out_step.metrics["time/rollout_s"])
    t, n = times[1:], tokens[1:]
    return {
        "s_per_step": statistics.median(t),
        "rollout_s": statistics.median(rollout[1:]),
        "decode_path": trainer.engine.decode_path,  # type: ignore[attr-defined]
        "tokens_per_s": sum(n) / sum(t),
        "peak_rss_mb": peak_rss_mb(),
        "mean_completion_tokens": sum(n) / len(n) / (PROMPTS * GROUP),
    }


def run_trl(model_dir: str, steps: int, lr: float) -> dict:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from environments.calculator import Calculator

    model, tokenizer = load_policy(model_dir)
    tokenizer.padding_side = "left"
    tasks = Calculator.load_tasks("train", n=64)
    data = Dataset.from_dict({"prompt": [[{"role": "user", "content": t.prompt}] for t in tasks]})

    def reward(completions, **kw):
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        return [len(set(x)) / 10.0 for x in texts]

    class Timer(TrainerCallback):
        def __init__(self):
            self.times, self.t0 = [], None

        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.times.append(time.perf_counter() - self.t0)

    out = tempfile.mkdtemp(prefix="bench-trl-")
    args = GRPOConfig(
        output_dir=out,
        per_device_train_batch_size=PROMPTS * GROUP,
        num_generations=GROUP,
        max_completion_length=MAX_NEW,
        beta=0.0,
        learning_rate=lr,
        max_steps=steps,
        use_cpu=True,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        temperature=1.0,
        bf16=False,
        gradient_accumulation_steps=1,
        num_iterations=1,
        disable_dropout=True,
        seed=0,
        gradient_checkpointing=False,  # TRL turns it on by default; off is faster at this size
    )
    timer = Timer()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[timer],
    )
    trainer.train()
    lengths = [
        h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h
    ]
    t = timer.times[1:]
    mean_len = statistics.mean(lengths[1:]) if len(lengths) > 1 else float("nan")
    return {
        "s_per_step": statistics.median(t),
        "tokens_per_s": mean_len * PROMPTS * GROUP / statistics.median(t),
        "peak_rss_mb": peak_rss_mb(),
        "mean_completion_tokens": mean_len,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--preset", default="h128-L8")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--only", choices=["agentrl", "agentrl-baseline", "trl"])
    p.add_argument("--rounds", type=int, default=1, help="repeat all sides, rotating their order")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    torch.manual_seed(0)
    model_dir = str(ensure_tiny_base(args.preset))
    results = {}
    # each side in its own process so peak memory is measured separately
    if args.only:
        if args.only == "trl":
            results[args.only] = run_trl(model_dir, args.steps, args.lr)
        else:
            results[args.only] = run_agentrl(model_dir, args.steps, args.lr, baseline=args.only != "agentrl")
        print(json.dumps(results[args.only]))
        return
    import subprocess
    import sys

    # Rounds: the sides run one after another, in a rotated order each round, and each side's
    # figures are the medians over rounds, so drift in machine speed does not favour one side.
    sides = ["agentrl", "agentrl-baseline", "trl"]
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    for rnd in range(args.rounds):
        for side in sides[rnd % 3 :] + sides[: rnd % 3]:
            proc = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--only",
                    side,
                    "--steps",
                    str(args.steps),
                    "--preset",
                    args.preset,
                    "--lr",
                    str(args.lr),
                ],
                capture_output=True,
                text=True,
                env=os.environ,
            )
            if proc.returncode != 0:
                raise SystemExit(f"{side} failed:\n{proc.stderr[-3000:]}")
            runs[side].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    for side in sides:
        results[side] = {
            k: (statistics.median(r[k] for r in runs[side]) if isinstance(v, float) else v)
            for k, v in runs[side][0].items()
        }
    per_round = [a["s_per_step"] / t["s_per_step"] for a, t in zip(runs["agentrl"], runs["trl"])]
    print(f"agentrl / TRL per round: {', '.join(f'{x:.2f}' for x in per_round)}")
    ratio = results["agentrl"]["s_per_step"] / results["trl"]["s_per_step"]
    print(
        f"model {args.preset}, {PROMPTS}x{GROUP} sequences, <= {MAX_NEW} new tokens, {args.steps - 1} timed steps"
    )
    print(f"{'':17s} {'s/step':>8s} {'rollout s':>9s} {'tok/s':>8s} {'tokens/seq':>10s} {'peak RSS MB':>12s}")
    for side, r in results.items():
        roll = f"{r['rollout_s']:9.2f}" if "rollout_s" in r else f"{'-':>9s}"
        print(
            f"{side:17s} {r['s_per_step']:8.2f} {roll} {r['tokens_per_s']:8.0f} {r['mean_completion_tokens']:10.1f} {r['peak_rss_mb']:12.0f}"
        )
    print(f"agentrl / TRL wall time per step: {ratio:.2f}x")
    base = results["agentrl-baseline"]["s_per_step"] / results["trl"]["s_per_step"]
    print(
        f"agentrl-baseline (transformers decode, no prefix sharing, separate old-logprob pass) / TRL: {base:.2f}x"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"results": results, "ratio": ratio, "runs": runs, "per_round": per_round}, indent=2)
        )


if __name__ == "__main__":
    main()
