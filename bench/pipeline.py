"""The training pipeline, sync against async: episodes per second and the trainer's idle share.

A real training run (``Trainer.train``) of the tiny model on a multi-turn environment whose every
turn calls a tool with ``--tool-ms`` of latency (``Relay``, below; three turns per episode), 4 tasks
× 8 episodes per step. Two tool mixes: ``uniform`` (every call takes ``--tool-ms``) and ``slow``
(one task in eight has a tool 20× slower, as bench/rollout_throughput.py). Modes:

- ``sync``: the default loop (rollouts, then the update, then the weight push). It sets no new key,
  so the same script measures older commits' loop too.
- ``async K=1`` and ``async K=2``: ``trainer.mode=async`` with ``rollout.max_staleness`` K
  (``on_stale: wait``).

Reported per mode and mix: median episodes trained per second (steps after the first, which loads
and warms up), the trainer's idle share (sync: the rollout share of the step, since the trainer
waits for every rollout; async: ``async/trainer_wait_s`` over the step time), and the ratio to sync.
Rounds rotate the order of the modes (this machine's speed drifts), and the per-round ratios are
printed with the medians.

    .venv/bin/python bench/pipeline.py --steps 8 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

from agentrl.config import load_config
from agentrl.env import Environment, EpisodeState, Reward, StepResult, Task, register
from agentrl.models import ensure_tiny_base

PROMPTS, GROUP, TURNS = 4, 8, 3


@register
class PipeRelay(Environment):
    """Three turns; each step waits ``latency_s`` (× 20 for every eighth task when ``slow``)."""

    name = "bench_pipe_relay"
    latency_s = 0.02
    slow = False

    @classmethod
    def load_tasks(cls, split, n=None, seed=0, **options):
        return [Task(id=f"{split}-{i}", prompt=f"Look up item {i} and report it.") for i in range(n or 64)]

    def reset(self, task, seed):
        self.turn = 0
        self.factor = 20 if self.slow and int(task.id.rsplit("-", 1)[1]) % 8 == 0 else 1
        return super().reset(task, seed)

    def step(self, action: str) -> StepResult:
        time.sleep(self.latency_s * self.factor)
        self.turn += 1
        done = self.turn >= TURNS
        obs = [] if done else [{"role": "tool", "name": "lookup", "content": f"result {self.turn}: 42"}]
        return StepResult(obs, 0.0, done, False, {"answer": action} if done else {})

    def rewards(self):
        return [Reward("variety", variety)]


def variety(task: Task, state: EpisodeState) -> float:
    return len(set(state.final_text or "")) / 10.0


MODES = {"sync": (), "async K=1": (1,), "async K=2": (2,)}


def run(model_dir: str, mode: str, mix: str, steps: int, tool_ms: float, tokens: int) -> dict:
    from agentrl.assembly import make_trainer

    extra = ["trainer.mode=async", f"rollout.max_staleness={MODES[mode][0]}"] if MODES[mode] else []
    cfg = load_config(
        None,
        [
            f"model.path={model_dir}",
            "env.name=bench_pipe_relay",
            f"env.options.latency_s={tool_ms / 1000}",
            f"env.options.slow={str(mix == 'slow').lower()}",
            f"run.output_dir={tempfile.mkdtemp(prefix='bench-pipeline-')}",
            "run.device=cpu",
            f"rollout.prompts_per_step={PROMPTS}",
            f"rollout.group_size={GROUP}",
            f"rollout.max_turns={TURNS}",
            f"rollout.max_tokens_per_turn={tokens}",
            "rollout.max_episode_tokens=1024",
            "algorithm.name=grpo",
            "algorithm.dynamic_sampling=false",
            f"trainer.total_steps={steps}",
            "trainer.lr=1e-5",
            f"trainer.micro_batch_size={PROMPTS * GROUP}",
            "trainer.checkpoint_every=0",
            "logging.tensorboard=false",
            "logging.plots=false",
            "logging.transcripts=false",
            "sft.enabled=false",
            *extra,
        ],
    )
    trainer = make_trainer(cfg, log=lambda *_: None)
    t0 = time.perf_counter()
    stamps: list[float] = []
    rows: list[dict] = []
    real_log = trainer.metrics.log

    def log(step, metrics):  # when each step ends, without touching the loop
        stamps.append(time.perf_counter())
        rows.append(dict(metrics))
        real_log(step, metrics)

    trainer.metrics.log = log  # type: ignore[method-assign]
    trainer.train()
    spans = [b - a for a, b in zip([t0, *stamps], stamps)][1:]  # the first step loads and warms up
    idle = [
        r["async/trainer_wait_s"] / r["time/step_s"]
        if "async/trainer_wait_s" in r
        else r["time/rollout_s"] / r["time/step_s"]
        for r in rows[1:]
    ]
    return {
        "episodes_per_s": PROMPTS * GROUP / statistics.median(spans),
        "trainer_idle": statistics.median(idle),
        "s_per_step": statistics.median(spans),
        "lag_mean": statistics.mean(r.get("offpolicy/version_lag_mean", 0.0) for r in rows[1:]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tool-ms", type=float, default=20.0)
    ap.add_argument("--tokens", type=int, default=24, help="new tokens per turn")
    ap.add_argument("--preset", default="h128-L8")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--mixes", default="uniform,slow")
    args = ap.parse_args()
    model_dir = str(ensure_tiny_base(args.preset))
    modes, mixes = args.modes.split(","), args.mixes.split(",")
    results: dict[tuple[str, str], list[dict]] = {}
    for rnd in range(args.rounds):
        order = modes[rnd % len(modes) :] + modes[: rnd % len(modes)]
        for mix in mixes:
            for mode in order:
                r = run(model_dir, mode, mix, args.steps, args.tool_ms, args.tokens)
                results.setdefault((mode, mix), []).append(r)
                print(
                    f"round {rnd} {mix:7s} {mode:10s} {json.dumps({k: round(v, 3) for k, v in r.items()})}",
                    flush=True,
                )
    print(f"\n{args.rounds} rounds × {args.steps} steps, {PROMPTS}×{GROUP} episodes/step, {TURNS} turns, "
          f"tool {args.tool_ms:g} ms (slow mix: 1 task in 8 at 20×), {args.tokens} tokens/turn, tiny:{args.preset}")  # fmt: skip
    print(
        f"{'mix':8s} {'mode':10s} {'episodes/s':>10s} {'× sync':>7s} {'per-round × sync':>20s} {'trainer idle':>12s} {'s/step':>7s} {'lag':>5s}"
    )
    for mix in mixes:
        base = results.get(("sync", mix))
        for mode in modes:
            rs = results[(mode, mix)]
            eps = statistics.median(r["episodes_per_s"] for r in rs)
            ratios = [r["episodes_per_s"] / b["episodes_per_s"] for r, b in zip(rs, base)] if base else []
            print(
                f"{mix:8s} {mode:10s} {eps:10.1f} {statistics.median(ratios) if ratios else float('nan'):7.2f} "
                f"{' '.join(f'{x:.2f}' for x in ratios):>20s} {statistics.median(r['trainer_idle'] for r in rs):12.0%} "
                f"{statistics.median(r['s_per_step'] for r in rs):7.2f} {statistics.median(r['lag_mean'] for r in rs):5.2f}"
            )


if __name__ == "__main__":
    main()
