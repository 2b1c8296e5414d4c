"""Task difficulty after the SFT warm start: is each built-in family in reach of a tiny model?

RL needs signal: after a few minutes of SFT on the solver's demonstrations, held-out accuracy
should sit between "never" and "always" (we aim for roughly 30-60% mean@k). For each environment
this warm-starts the CPU quickstart's tiny model on the environment's demonstrations (the real
``agentrl.training.sft`` code) and runs ``agentrl.training.evaluation.evaluate`` on the test split, printing mean@k and
pass@k per family, with the SFT time.

Usage: .venv/bin/python bench/task_difficulty.py [--envs countdown shop] [--set sft.steps=300 ...]
       .venv/bin/python bench/task_difficulty.py --config configs/examples/lookup_cpu.yaml \
           --envs population_lookup --set sft.steps=1200 eval.k=4 --curve 600,1200   # any environment
"""

from __future__ import annotations

import argparse
import json
import time

# Budgets per family: single-turn families need one turn; shop needs up to three (lookups or cart,
# then total, then answer); long_cot needs room for its ~200-token trace.
FAMILIES = {
    "calculator": [],
    "short_cot": ["rollout.max_turns=1", "rollout.max_tokens_per_turn=96"],
    "countdown": ["rollout.max_turns=1", "rollout.max_tokens_per_turn=64"],
    "shop": ["rollout.max_turns=4", "rollout.max_tokens_per_turn=96"],
    "long_cot": ["rollout.max_turns=1", "rollout.max_tokens_per_turn=384", "rollout.max_episode_tokens=640"],
}


def measure(
    name: str, config: str, overrides: list[str], out_dir: str, curve: tuple[int, ...] = ()
) -> dict[str, float]:
    from pathlib import Path

    from agentrl.assembly import build, components, evaluate
    from agentrl.assembly.sft import build_examples
    from agentrl.config import load_config
    from agentrl.models import resolve_model_path
    from agentrl.training.sft import sft_train

    cfg = load_config(config, [f"env.name={name}", *FAMILIES.get(name, []), *overrides])
    base = resolve_model_path(cfg.model.path)
    model, tokenizer = components.load_model(cfg, base)
    examples = build_examples(cfg, tokenizer)
    t0 = time.perf_counter()

    tasks = components.load_tasks(cfg, "test")
    engine = build.build_engine(cfg, model, tokenizer, base)  # a copy, synced before each evaluation

    def on_step(i: int, loss: float) -> None:
        if (i + 1) % 50 == 0:
            print(f"  {name} sft step {i + 1}: loss {loss:.3f} ({time.perf_counter() - t0:.0f}s)", flush=True)
        if i + 1 in curve:  # a learning curve: held-out accuracy part-way through SFT
            engine.load_weights(model.state_dict())
            m, _ = evaluate(cfg, engine, tokenizer, tasks)
            print(
                f"  {name} sft step {i + 1}: mean@k {m['eval/mean@k']:.3f} pass@k {m['eval/pass@k']:.3f}",
                flush=True,
            )

    steps = cfg.sft.steps or max(1, cfg.sft.epochs * len(examples) // cfg.sft.batch_size)
    sft_train(model, examples, steps=steps, lr=cfg.sft.lr, batch_size=cfg.sft.batch_size, seed=cfg.run.seed,
              pad_id=tokenizer.pad_token_id or 0, on_step=on_step)  # fmt: skip
    sft_s = time.perf_counter() - t0
    path = Path(out_dir) / name
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    engine.load_weights(model.state_dict())
    metrics, _ = evaluate(cfg, engine, tokenizer, tasks)
    return {**metrics, "sft_s": sft_s, "sft_steps": float(steps), "eval_s": time.perf_counter() - t0 - sft_s}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--envs", nargs="*", default=list(FAMILIES))
    ap.add_argument("--config", default="configs/quickstart.yaml")
    ap.add_argument("--set", nargs="*", default=[], help="extra dotted overrides for every run")
    ap.add_argument("--out", default="runs/task_difficulty")
    ap.add_argument("--curve", default="", help="comma-separated SFT steps at which to evaluate too")
    args = ap.parse_args()
    rows = []
    for name in args.envs:
        curve = tuple(int(x) for x in args.curve.split(",") if x)
        m = measure(name, args.config, args.set, args.out, curve)
        print(name, json.dumps(m), flush=True)
        rows.append((name, m))
    print(f"{'env':<10} {'mean@k':>7} {'pass@k':>7} {'sft s':>6} {'eval s':>6}")
    for name, m in rows:
        print(
            f"{name:<10} {m['eval/mean@k']:7.3f} {m['eval/pass@k']:7.3f} {m['sft_s']:6.0f} {m['eval_s']:6.0f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
