"""``agentrl train`` under torchrun with rank 0's Ray pool slowed to start, for
tests/rollout/test_ray_workers.py:

    python -m torch.distributed.run --nproc_per_node 2 tests/helpers/slow_pool.py SECONDS OVERRIDES...

``RolloutPool`` sleeps SECONDS before it starts (a pool of large engines takes minutes), then the
command trains; the process exits with the CLI's code."""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: tests.helpers

from agentrl.cli import main
from agentrl.rollout import ray_workers
from tests.helpers.configs import exit_driver

if __name__ == "__main__":
    delay, overrides = float(sys.argv[1]), sys.argv[2:]
    start = ray_workers.RolloutPool.__init__

    def slow(self, *args, **kwargs):
        time.sleep(delay)
        start(self, *args, **kwargs)

    ray_workers.RolloutPool.__init__ = slow  # type: ignore[method-assign]
    code = main(["train", *overrides])
    if code:
        sys.exit(code)
    exit_driver()
