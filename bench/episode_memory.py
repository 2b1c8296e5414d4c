"""Host memory of a step's episodes on every rank: bytes per token of ``Episode`` objects as
``ranks.gather_episode_parts`` leaves them on each rank (unpickled), and of their pickles.

    .venv/bin/python bench/episode_memory.py
    .venv/bin/python bench/episode_memory.py --episodes 64 --policy-tokens 8192 --vocab 151669

Episodes of a 512-token prompt and one policy reply of ``--policy-tokens`` tokens with a log-prob each
(random ids below ``--vocab``), pickled as ``all_gather_object`` pickles them, then unpickled under
``tracemalloc``. ``agentrl plan`` counts the unpickled figure per token (``plan/terms.py``,
``EPISODE_BYTES_PER_TOKEN``).
"""

from __future__ import annotations

import argparse
import pickle
import random
import tracemalloc

from agentrl.episode import Episode, Segment


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--policy-tokens", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=151_669)
    args = ap.parse_args()
    rng = random.Random(0)
    eps = []
    for i in range(args.episodes):
        ep = Episode(id=f"e{i}", env="bench", task_id="t", seed=i, group="g")
        ep.add(Segment("prompt", 0, [rng.randrange(5, args.vocab) for _ in range(512)], "p"))
        reply = [rng.randrange(5, args.vocab) for _ in range(args.policy_tokens)]
        ep.add(Segment("policy", 0, reply, "a", [-rng.random() for _ in reply], 0))
        eps.append(ep)
    tokens = args.episodes * (512 + args.policy_tokens)
    blob = pickle.dumps(eps)
    tracemalloc.start()
    back = pickle.loads(blob)
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(back) == len(eps)
    print(
        f"{tokens:,} tokens: pickled {len(blob) / tokens:.1f} B/token, unpickled {held / tokens:.1f} B/token"
    )


if __name__ == "__main__":
    main()
