"""How many SFT steps a real model needs before a new tool pays: held-out accuracy and the share of
episodes that call the tool, before the warm start and part-way through it, with every weight
trained or with LoRA adapters only. docs/own-tool-task.md quotes its output.

    .venv/bin/python bench/own_tool_task.py                     # configs/examples/sql_smollm2.yaml
    .venv/bin/python bench/own_tool_task.py --weights full lora --curve 0,20,40,80 \\
        --set eval.num_tasks=32 eval.k=2

It runs the real code of a run: ``build_examples`` (the solver's demonstrations of the training
tasks), ``sft_train``, and ``evaluate`` on the held-out tasks through the run's engine, with the
config's settings (``--set`` overrides them). Each arm starts from the same base model.
"""

from __future__ import annotations

import argparse
import json
import time


def measure(
    config: str, overrides: list[str], weights: str, curve: list[int], rank: int
) -> list[dict[str, float]]:
    from agentrl.assembly import build, components, evaluate
    from agentrl.assembly.sft import build_examples
    from agentrl.config import load_config
    from agentrl.models import resolve_model_path
    from agentrl.training import lora
    from agentrl.training.prompt_fit import loaded_context
    from agentrl.training.sft import sft_seed, sft_train

    arm = [f"sft.weights={weights}"] + ([f"model.lora.rank={rank}"] if weights == "lora" else [])
    cfg = load_config(config, [*overrides, *arm])
    base = resolve_model_path(cfg.model.path)
    model, tokenizer = components.load_model(cfg, base)
    engine = build.build_engine(cfg, model, tokenizer, base)
    examples = build_examples(cfg, tokenizer, print, loaded_context(model))
    if weights == "lora":
        model = lora.apply(model, cfg.model.lora, seed=sft_seed(cfg.sft, cfg.run.seed))
    tasks = components.load_tasks(cfg, "test")[: cfg.eval.num_tasks]
    rows: list[dict[str, float]] = []
    t0, trained = time.perf_counter(), [0.0]

    def point(step: int) -> None:
        engine.load_weights(dict(lora.merged_weights(model)) if weights == "lora" else model.state_dict())
        t = time.perf_counter()
        m, episodes = evaluate(cfg, engine, tokenizer, tasks)
        called = sum(e.metrics.get("tool_calls", 0) > 0 for e in episodes) / max(len(episodes), 1)
        row = {
            "weights": weights,
            "sft_steps": step,
            "mean@k": m["eval/mean@k"],
            "pass@k": m["eval/pass@k"],
            "called_tool": called,
            "sft_s": trained[0],
            "eval_s": time.perf_counter() - t,
        }
        print(json.dumps(row), flush=True)
        rows.append(row)

    if 0 in curve:
        point(0)
    last = max(curve)

    def on_step(i: int, loss: float) -> None:
        if i + 1 in curve:
            trained[0] = time.perf_counter() - t0 - sum(r["eval_s"] for r in rows)
            point(i + 1)

    if last > 0:
        sft_train(
            model,
            examples,
            steps=last,
            lr=cfg.sft.lr,
            batch_size=cfg.sft.batch_size,
            seed=cfg.run.seed,
            pad_id=tokenizer.pad_token_id or 0,
            on_step=on_step,
        )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/examples/sql_smollm2.yaml")
    ap.add_argument("--weights", nargs="*", default=["full", "lora"], choices=["full", "lora"])
    ap.add_argument(
        "--curve", default="0,20,40,80", help="SFT steps at which to evaluate (0: the base model)"
    )
    ap.add_argument("--set", nargs="*", default=[], help="dotted overrides of the config")
    ap.add_argument("--lora-rank", type=int, default=16, help="the LoRA arm's model.lora.rank")
    args = ap.parse_args()
    curve = sorted(int(x) for x in args.curve.split(",") if x)
    rows = [r for w in args.weights for r in measure(args.config, args.set, w, curve, args.lora_rank)]
    print(f"{'weights':<8} {'SFT steps':>9} {'mean@k':>7} {'pass@k':>7} {'called tool':>11} {'SFT s':>6}")
    for r in rows:
        print(
            f"{r['weights']:<8} {r['sft_steps']:>9} {r['mean@k']:7.3f} {r['pass@k']:7.3f} "
            f"{r['called_tool']:11.2f} {r['sft_s']:6.0f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
