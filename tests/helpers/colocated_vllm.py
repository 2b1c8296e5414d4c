"""A colocated vLLM engine of tensor parallelism 2 over two trainer ranks, with the real vLLM (its CPU
build, external_launcher), for tests/engines/test_vllm_tensor_parallel.py (the vLLM tier).

    python -m torch.distributed.run --nproc_per_node 2 tests/helpers/colocated_vllm.py OUT.json key=value ...

Each rank builds its ``Trainer`` (its vLLM engine holds half of every layer), runs one training step
(the leader runs the episodes, the follower follows; the update's weights go to both halves), then
the leader generates greedily after the push while the follower follows; rank 0 writes what both saw
and the greedy tokens of an HF engine given the trainer's weights.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: tests.helpers

from agentrl.config import load_config
from agentrl.engines.base import SamplingParams
from agentrl.engines.hf import HFEngine
from agentrl.parallel import ranks
from agentrl.parallel.engine_group import LeaderEngine
from agentrl.training.trainer import Trainer
from tests.helpers.configs import exit_driver

PROMPTS = [[5, 17, 40, 9, 33], [11, 3, 250, 7, 60, 2]]


def main() -> None:
    out, overrides = sys.argv[1], sys.argv[2:]
    trainer = Trainer(load_config(None, overrides), log=lambda *_: None)
    step = trainer.train_step(0)
    greedy = SamplingParams(max_tokens=12, temperature=0.0)
    engine = trainer.engine
    if isinstance(engine, LeaderEngine):
        got = [c.token_ids for c in engine.generate(PROMPTS, greedy)]
        engine.release()
    else:
        engine.follow()  # type: ignore[attr-defined]
        got = []
    reference = HFEngine(copy.deepcopy(trainer.model).eval())
    want = [c.token_ids for c in reference.generate(PROMPTS, greedy)]
    mine = {
        "rank": trainer.rank,
        "engine": type(engine).__name__,
        "episodes": len(step.episodes),
        "trained": "update/skipped" not in step.metrics,
        "version": engine.version,
        "greedy": got,
        "hf_greedy": want,
    }
    everyone = ranks.gather_to_rank0(mine)
    if trainer.rank == 0:
        Path(out).write_text(json.dumps(everyone))
    dist.barrier()


if __name__ == "__main__":
    main()
    exit_driver()  # the record is written; the exit is not under test (configs.exit_driver)
