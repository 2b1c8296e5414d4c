"""Rollout throughput with Ray workers: 1 worker against 2, same episodes, on a local loopback Ray.

Each worker is a Ray actor with its own HF engine (1 CPU, so torch uses one thread in it) and runs
the lockstep ``EpisodeRunner`` on its shard of the step's episodes. The environment is the
``bench_relay`` environment of ``bench/rollout_throughput.py`` (tool latency, fixed turns). For
reference, the in-process runner on the same episodes is timed too (torch uses all cores there).

    .venv/bin/python bench/ray_scaling.py --episodes 64 --turns 3 --tokens 48
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from agentrl.assembly import build, components
from agentrl.config import load_config
from agentrl.env import Task
from agentrl.models import resolve_model_path
from agentrl.rollout.runner import EpisodeRequest

RELAY = Path(__file__).with_name("rollout_throughput.py")


def config(workers: int, args):
    return load_config(
        None,
        [
            f"model.path=tiny:{args.preset}",
            "env.name=bench_relay",
            f"env.module={RELAY}",
            f"env.options.latency_s={args.tool_ms / 1000}",
            f"env.options.turns={args.turns}",
            "run.device=cpu",
            f"rollout.workers={workers}",
            f"rollout.max_turns={args.turns}",
            f"rollout.max_tokens_per_turn={args.tokens}",
            "rollout.max_episode_tokens=4096",
        ],
    )


def requests(n: int) -> list[EpisodeRequest]:
    return [EpisodeRequest(Task(f"t{i}", f"Look up item {i} and report it."), seed=i) for i in range(n)]


def timed(runner, reqs) -> tuple[float, int]:
    t0 = time.perf_counter()
    eps = runner.run(reqs)
    wall = time.perf_counter() - t0
    assert not any(e.failed for e in eps), [e.failure for e in eps if e.failed][:2]
    return wall, sum(e.num_policy_tokens for e in eps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="h128-L8")
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--tool-ms", type=float, default=20.0)
    args = ap.parse_args()
    from agentrl.rollout.ray_workers import init_ray

    init_ray(num_cpus=os.cpu_count())
    reqs = requests(args.episodes)
    rows = []
    cfg = config(0, args)
    path = resolve_model_path(cfg.model.path)
    model, tok = components.load_model(cfg, path)
    engine = build.build_engine(cfg, model, tok, path)
    timed(build.build_runner(cfg, engine, tok, seed=0), reqs[:4])  # warm-up
    rows.append(("in-process", *timed(build.build_runner(cfg, engine, tok, seed=0), reqs)))
    for workers in (1, 2):
        cfg = config(workers, args)
        t0 = time.perf_counter()
        pool = build.build_engine(cfg, model, tok, path)
        start = time.perf_counter() - t0
        runner = build.build_runner(cfg, pool, tok, seed=0)
        timed(runner, reqs[: 4 * workers])  # warm-up
        rows.append((f"ray workers={workers} (start {start:.1f} s)", *timed(runner, reqs)))
        pool.shutdown()
    print(f"{args.episodes} episodes, {args.turns} turns × ≤{args.tokens} tokens, tool {args.tool_ms:g} ms")
    print(f"{'path':<32} {'wall s':>7} {'policy tok/s':>12} {'episodes/s':>10}")
    for name, wall, toks in rows:
        print(f"{name:<32} {wall:>7.2f} {toks / wall:>12.0f} {args.episodes / wall:>10.2f}")
    one, two = rows[1][2] / rows[1][1], rows[2][2] / rows[2][1]
    print(f"scaling 1 -> 2 workers: {two / one:.2f}×")


if __name__ == "__main__":
    main()
