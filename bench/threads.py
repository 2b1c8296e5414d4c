"""How torch's thread count changes training speed on a small CPU machine, alone and shared.

    .venv/bin/python bench/threads.py --rounds 3

One measurement: a fresh process with ``OMP_NUM_THREADS`` set times SFT steps of a tiny model
(forward + backward + AdamW on ``--batch`` sequences of ``--tokens`` tokens, the warm start's inner
loop, ``agentrl.training.sft.sft_train``), the first steps excluded as warm-up. ``--busy N`` starts N
processes that spin on a core each for the whole measurement: what a shared machine looks like
(another job, a test suite, a second run). Threads of 1, 2 and the machine's core count, alone and
with 1 and 2 busy neighbours, in rotated order for ``--rounds`` rounds; the table shows the median
seconds per step and, per setting, the speed relative to torch's default (as many threads as cores).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

WORKER = r"""
import json, random, sys, time
import torch
from agentrl.models import ensure_tiny_base, load_policy
from agentrl.training.sft import sft_train

preset, steps, warm, batch, tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
model, tok = load_policy(ensure_tiny_base(preset))
rng = random.Random(0)
examples = [([rng.randrange(5, 1000) for _ in range(tokens)], [1] * tokens) for _ in range(batch * 4)]
times = []
def on_step(i, loss):
    times.append(time.perf_counter())
t0 = time.perf_counter()
sft_train(model, examples, steps=steps, lr=1e-4, batch_size=batch, seed=0, pad_id=0, on_step=on_step)
gaps = [b - a for a, b in zip(times, times[1:])][warm:]
print(json.dumps({"threads": torch.get_num_threads(), "step_s": sorted(gaps)[len(gaps) // 2]}))
"""


def spin() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def measure(threads: int, busy: int, args: argparse.Namespace) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    neighbours = [spin() for _ in range(busy)]
    try:
        out = subprocess.run(
            [sys.executable, "-c", WORKER, args.preset, str(args.steps), "3", str(args.batch), str(args.tokens)],
            env=env, capture_output=True, text=True, check=True,
        )  # fmt: skip
    finally:
        for p in neighbours:
            p.kill()
            p.wait()
    row = json.loads(out.stdout.strip().splitlines()[-1])
    assert row["threads"] == threads, row
    return float(row["step_s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--preset", default="h128-L8")
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    thread_counts = sorted({1, 2, cores})
    settings = [(t, b) for b in (0, 1, 2) for t in thread_counts]
    results: dict[tuple[int, int], list[float]] = {s: [] for s in settings}
    t0 = time.perf_counter()
    for r in range(args.rounds):
        for s in settings[r % len(settings) :] + settings[: r % len(settings)]:  # rotated order
            results[s].append(measure(*s, args))
            print(f"round {r} threads={s[0]} busy={s[1]}: {results[s][-1]:.3f} s/step", file=sys.stderr)
    print(f"\n{cores} cores, tiny:{args.preset}, batch {args.batch} x {args.tokens} tokens, "
          f"{args.rounds} rounds ({time.perf_counter() - t0:.0f} s)")  # fmt: skip
    print(f"| busy neighbours | {' | '.join(f'{t} thread(s)' for t in thread_counts)} |")
    print("|---" * (len(thread_counts) + 1) + "|")
    for b in (0, 1, 2):
        default = statistics.median(results[(cores, b)])
        cells = []
        for t in thread_counts:
            med = statistics.median(results[(t, b)])
            cells.append(f"{med:.3f} s ({default / med:.2f}x)")
        print(f"| {b} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
