"""What one thread per episode costs: the runner's environment calls on the episode's own helper
thread (the default since issue 66) against the helper of whichever pool thread makes the call (the
earlier behaviour), with tools on the episode's thread (``tools_on_episode_thread``) as a third arm.

    .venv/bin/python bench/episode_threads.py
    .venv/bin/python bench/episode_threads.py --episodes 64 --rounds 10

Scripted episodes of the calculator environment (a tool call, then the answer: three environment
calls and one tool call each), so what is timed is the runner and its threads, not a model. The
arms are interleaved round by round; the median wall time of a round is printed per episode.
"""

from __future__ import annotations

import argparse
import statistics
import time

from agentrl.engines.scripted import ScriptedEngine
from agentrl.env import Task
from agentrl.models.tiny import train_tokenizer
from agentrl.rollout.runner import EpisodeRequest, EpisodeRunner, RunnerSettings
from agentrl.tools import format_tool_call
from environments.calculator import Calculator

TASK = Task(id="t1", prompt="What is 3 * 4 + 5?", answer=17, metadata={"expression": "3 * 4 + 5"})
REPLIES = [format_tool_call("calculate", {"expression": "3 * 4 + 5"}) + "<|im_end|>", "\\boxed{17}<|im_end|>"]


class PoolThreadRunner(EpisodeRunner):
    """The earlier behaviour: each call on the helper of the pool thread that makes it."""

    def _bounded(self, call, env, what, lv=None):  # type: ignore[no-untyped-def]
        return super()._bounded(call, env, what, None)


class InlineTools(Calculator):
    name = "bench_calculator_inline_tools"
    tools_on_episode_thread = True


def one_round(runner_cls, env_cls, tokenizer, n: int) -> float:
    def reply(prompt_ids, i):
        return REPLIES[tokenizer.decode(prompt_ids).count("<|im_start|>assistant") > 1]

    runner = runner_cls(
        ScriptedEngine(reply, tokenizer=tokenizer),
        tokenizer,
        env_cls,
        RunnerSettings(max_concurrent_episodes=n),
    )
    try:
        t0 = time.perf_counter()
        episodes = runner.run([EpisodeRequest(TASK, seed=i, group=f"g{i}") for i in range(n)])
        elapsed = time.perf_counter() - t0
    finally:
        runner.close()
    assert all(ep.failure is None and ep.reward > 0 for ep in episodes), [ep.failure for ep in episodes]
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    tokenizer = train_tokenizer()
    arms = {
        "pool thread (before)": (PoolThreadRunner, Calculator),
        "episode thread (default)": (EpisodeRunner, Calculator),
        "episode thread, tools too": (EpisodeRunner, InlineTools),
    }
    times: dict[str, list[float]] = {k: [] for k in arms}
    for _ in range(args.rounds):
        for name, (runner_cls, env_cls) in arms.items():
            times[name].append(one_round(runner_cls, env_cls, tokenizer, args.episodes))
    for name, ts in times.items():
        per = statistics.median(ts) / args.episodes * 1e6
        print(f"{name:28s} {per:8.0f} us per episode (median of {args.rounds} rounds of {args.episodes})")


if __name__ == "__main__":
    main()
