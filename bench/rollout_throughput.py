"""Multi-turn rollout throughput: the runners against a naive per-episode ``model.generate`` loop.

Same tiny model, same environment, same budgets. The environment (``Relay``, below) answers every
turn with a short tool message after ``--tool-ms`` of latency (a stand-in for a sandbox run) and ends
the episode after ``--turns`` turns, so every episode has exactly that many policy turns whatever
the (untrained) model writes. Sampling at temperature 1 with ``<|im_end|>`` as the stop id.

- naive: for each episode, for each turn: ``model.generate`` on that one sequence (KV cache, no
  logprobs: its cheapest path), then the environment step; the next episode starts when this one ends.
- lockstep: ``EpisodeRunner`` + ``HFEngine`` (all active episodes generate one turn together).
- async: ``AsyncEpisodeRunner`` + ``HFEngine`` (continuous batching; slow tools stall only their episode).
- async, mixed latency: as async, but one episode in eight has a 20× slower tool: what the async
  runner is for. Lockstep is measured on the same mix for comparison.

    .venv/bin/python bench/rollout_throughput.py --episodes 64 --turns 3 --tokens 48 --tool-ms 20
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import GenerationConfig

from agentrl.engines.base import SamplingParams
from agentrl.engines.hf import HFEngine
from agentrl.env import Environment, Reward, StepResult, Task, register
from agentrl.models import ensure_tiny_base, load_policy
from agentrl.models.chat import ChatRenderer
from agentrl.rollout.async_runner import AsyncEpisodeRunner
from agentrl.rollout.runner import Budgets, EpisodeRequest, EpisodeRunner, RunnerSettings


class Relay(Environment):
    """Every turn gets a tool reply after ``latency_s`` (``slow_every``-th task: ×20); ``turns`` turns."""

    name = "bench_relay"
    latency_s = 0.02
    turns = 3

    def reset(self, task, seed):
        self.turn = 0
        self.slow = task.metadata.get("slow", False)
        return super().reset(task, seed)

    def step(self, action: str) -> StepResult:
        time.sleep(self.latency_s * (20 if self.slow else 1))
        self.turn += 1
        done = self.turn >= self.turns
        obs = [] if done else [{"role": "tool", "name": "lookup", "content": f"result {self.turn}: 42"}]
        return StepResult(obs, 0.0, done, False, {})

    def rewards(self):
        return [Reward("zero", lambda task, state: 0.0)]


register(Relay)


def tasks(n: int, slow_every: int = 0) -> list[EpisodeRequest]:
    return [
        EpisodeRequest(
            Task(
                f"t{i}",
                f"Look up item {i} and report it.",
                metadata={"slow": bool(slow_every and i % slow_every == 0)},
            ),
            seed=i,
        )
        for i in range(n)
    ]


def naive_loop(model, tok, requests: list[EpisodeRequest], budgets: Budgets) -> tuple[int, float]:
    """Policy tokens produced and wall seconds, one episode and one turn at a time."""
    renderer = ChatRenderer(tok, None)
    eos = renderer.eos_token_id
    gen = GenerationConfig(
        do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=budgets.max_tokens_per_turn,
        eos_token_id=eos, pad_token_id=tok.pad_token_id or 0,
    )  # fmt: skip
    n_tokens, t0 = 0, time.perf_counter()
    for req in requests:
        env = Relay()
        ids = renderer.render_prompt(env.reset(req.task, req.seed)).token_ids
        for _turn in range(budgets.max_turns):
            with torch.inference_mode():
                out = model.generate(input_ids=torch.tensor([ids]), generation_config=gen)
            new = out[0, len(ids) :].tolist()
            n_tokens += len(new)
            text = tok.decode(new, skip_special_tokens=False)
            ended = bool(new) and new[-1] == eos
            ids = ids + new + renderer.close_turn(text, ended).token_ids
            obs, _, terminated, truncated, _ = env.step(text)
            if terminated or truncated:
                break
            for piece in renderer.render_observation(obs):
                ids = ids + piece.token_ids
        env.close()
    return n_tokens, time.perf_counter() - t0


def run_runner(runner, requests) -> tuple[int, float, float]:
    t0 = time.perf_counter()
    eps = runner.run(requests)
    wall = time.perf_counter() - t0
    runner.close()
    assert not any(e.failed for e in eps), [e.failure for e in eps if e.failed][:2]
    return sum(e.num_policy_tokens for e in eps), wall, sum(e.num_turns for e in eps) / len(eps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="h128-L8")
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--naive-episodes", type=int, default=16, help="the naive loop is slow: fewer episodes")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=48, help="max new tokens per turn")
    ap.add_argument("--tool-ms", type=float, default=20.0)
    args = ap.parse_args()
    Relay.latency_s, Relay.turns = args.tool_ms / 1000, args.turns
    model, tok = load_policy(ensure_tiny_base(args.preset))
    model.eval()
    budgets = Budgets(max_turns=args.turns, max_tokens_per_turn=args.tokens, max_episode_tokens=4096)
    sampling = SamplingParams(temperature=1.0, seed=0)
    engine = HFEngine(model, tok, max_batch_size=256)
    print(f"{args.preset}, {args.turns} turns × ≤{args.tokens} tokens, tool latency {args.tool_ms:g} ms, "
          f"torch threads {torch.get_num_threads()}")  # fmt: skip
    naive_loop(model, tok, tasks(1), budgets)  # warm-up: first calls allocate and build kernels
    run_runner(
        EpisodeRunner(engine, tok, Relay, RunnerSettings(budgets=budgets, sampling=sampling)), tasks(4)
    )
    rows = []
    tok_n, wall = naive_loop(model, tok, tasks(args.naive_episodes), budgets)
    rows.append(("naive generate loop", args.naive_episodes, tok_n, wall, float(args.turns)))
    for name, slow_every, cls in [
        ("lockstep EpisodeRunner", 0, EpisodeRunner),
        ("async AsyncEpisodeRunner", 0, AsyncEpisodeRunner),
        ("lockstep, 1/8 slow tools", 8, EpisodeRunner),
        ("async, 1/8 slow tools", 8, AsyncEpisodeRunner),
    ]:
        runner = cls(engine, tok, Relay, budgets=budgets, sampling=sampling)
        tok_n, wall, turns = run_runner(runner, tasks(args.episodes, slow_every))
        rows.append((name, args.episodes, tok_n, wall, turns))
    base = rows[0][2] / rows[0][3]
    print(
        f"{'path':<28} {'episodes':>8} {'turns/ep':>8} {'policy tok/s':>12} {'episodes/s':>10} {'vs naive':>9}"
    )
    for name, n, tok_n, wall, turns in rows:
        print(
            f"{name:<28} {n:>8} {turns:>8.2f} {tok_n / wall:>12.0f} {n / wall:>10.2f} {tok_n / wall / base:>8.1f}×"
        )


if __name__ == "__main__":
    main()
