"""How long one rank waits for another, under torchrun, for tests/parallel/test_rank_waits.py.

    python -m torch.distributed.run --nproc_per_node 2 tests/helpers/rank_waits.py OUT.json

The process group's timeout (``timeouts.collective_s``) is ``COLLECTIVE_S``; each case waits past it
where a longer wait is right, or fails where it is not, and records per rank what it returned or
raised and how long it took. Rank 0 writes every rank's records to OUT.json.

- ``episodes``: every rank runs episodes; rank 1's share takes longer than ``collective_s``. The
  gather waits for it with ``timeouts.data_wait_s``.
- ``pool``: rank 0 builds something (its Ray pool) for longer than ``collective_s``; rank 1 waits at
  ``builders_first`` and both go on.
- ``pool_fails``: rank 0's build raises; rank 1 raises at once, naming rank 0 and its error.
- ``pool_hangs``: rank 0's build outlasts the barrier's own limit; rank 1 raises naming the setting.
- ``sync_fails``: a weight sync whose bucket stream is a collective per bucket (as FSDP2's gather
  is); rank 0's engine fails at the second bucket. Both ranks raise at once: rank 1 names rank 0
  rather than waiting ``collective_s`` in the third bucket's collective.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: tests.helpers

from agentrl.parallel import ranks
from agentrl.sync.weight_sync import Bucketed, PolicyProbe, SyncSettings, sync_weights
from tests.helpers.configs import exit_driver

COLLECTIVE_S = 3.0
SLOW_S = 4.5  # longer than COLLECTIVE_S


def timed(fn):
    t0 = time.monotonic()
    try:
        return {"ok": fn(), "s": time.monotonic() - t0}
    except Exception as e:
        return {"error": type(e).__name__, "message": str(e)[:600], "s": time.monotonic() - t0}


class FailingEngine:
    """A weight receiver that fails at bucket ``fail_at`` (1-based), or never (0)."""

    version = 0

    def __init__(self, fail_at: int) -> None:
        self.fail_at, self.buckets = fail_at, 0

    def begin_weight_update(self) -> None:
        pass

    def load_weight_bucket(self, bucket) -> None:
        self.buckets += 1
        if self.buckets == self.fail_at:
            raise RuntimeError("the engine's worker died")

    def finish_weight_update(self) -> int:
        return 1

    def fingerprint(self, names, probe_ids):
        return []


def collective_buckets(n: int):
    for i in range(n):
        t = torch.full((4,), float(i))
        dist.all_reduce(t)  # every bucket is gathered by a collective, like FSDP2's
        yield [(f"w{i}", t)]


def main() -> None:
    out = Path(sys.argv[1])
    rank, _ = ranks.init_from_env(timeout_s=COLLECTIVE_S)
    record: dict[str, dict] = {}

    ranks.configure_rollouts([0, 1], wait_s=60.0)  # every rank runs episodes
    record["episodes"] = timed(
        lambda: ranks.gather_episodes(lambda share: time.sleep(SLOW_S * rank) or share, list(range(4)))
    )

    def build():
        time.sleep(SLOW_S)
        return "pool"

    record["pool"] = timed(
        lambda: ranks.builders_first(rank == 0, build, 60.0, "the pool", "the pool's limit")
    )

    def fail():
        raise ValueError("no GPU left for rollout worker 3")

    record["pool_fails"] = timed(lambda: ranks.builders_first(rank == 0, fail, 60.0, "the pool", "its limit"))
    record["pool_hangs"] = timed(
        lambda: ranks.builders_first(rank == 0, lambda: time.sleep(2.0), 0.5, "the pool", "timeouts.x=0.5s")
    )
    dist.barrier()  # rank 0 left its hung build behind
    probe = PolicyProbe(torch.nn.Linear(1, 1), torch.device("cpu"), "float32", lambda m: None)
    settings = SyncSettings(bucket_mb=1.0, verify="off")
    engine = FailingEngine(fail_at=2 if rank == 0 else 0)
    record["sync_fails"] = timed(
        lambda: sync_weights(engine, Bucketed(collective_buckets(4)), settings, probe).buckets
    )
    parts = ranks.gather_to_rank0(record)
    if rank == 0:
        out.write_text(json.dumps(parts))
    ranks.leave()
    exit_driver()


if __name__ == "__main__":
    main()
