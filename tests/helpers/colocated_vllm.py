"""Colocated vLLM engines over two trainer ranks, with the real vLLM (its CPU build,
external_launcher), for tests/engines/test_vllm_tensor_parallel.py (the vLLM tier).

    python -m torch.distributed.run --nproc_per_node 2 tests/helpers/colocated_vllm.py OUT.json key=value ...

Each rank builds its ``Trainer`` and runs one training step. With tensor parallelism 2 one engine
spans both ranks (each holds half of every layer): the leader runs the episodes, the follower
follows, the update's weights go to both halves, and after the push the leader generates greedily
while the follower follows. With tensor parallelism 1 each rank has an engine of its own (the 7 B
configs' layout): each runs its share of the episodes, takes the update, proves it (``rollout.sync``)
and generates greedily after it. Rank 0 writes what both saw, with the greedy tokens of an HF
engine given the trainer's weights.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: tests.helpers

from agentrl.assembly import make_trainer
from agentrl.config import load_config
from agentrl.engines.base import SamplingParams
from agentrl.engines.hf import HFEngine
from agentrl.models import load_policy
from agentrl.parallel import ranks
from agentrl.parallel.engine_group import FollowerEngine, LeaderEngine
from tests.helpers.configs import exit_driver

PROMPTS = [[5, 17, 40, 9, 33], [11, 3, 250, 7, 60, 2]]


def reference_model(path: str, full: dict) -> object:
    """The trainer's weights (``full``: gathered) in a plain model, for an HF engine to generate with."""
    model, _ = load_policy(path)
    model.load_state_dict(full, strict=False)  # a tied head and the rotary buffers are not parameters
    return model


def main() -> None:
    out, overrides = sys.argv[1], sys.argv[2:]
    cfg = load_config(None, overrides)
    trainer = make_trainer(cfg, log=lambda *_: None)
    step = trainer.train_step(0)
    greedy = SamplingParams(max_tokens=12, temperature=0.0)
    engine = trainer.engine
    if isinstance(engine, LeaderEngine):
        got = [c.token_ids for c in engine.generate(PROMPTS, greedy)]
        engine.release()
    elif isinstance(engine, FollowerEngine):
        engine.follow()
        got = []
    else:  # an engine of this rank's own
        got = [c.token_ids for c in engine.generate(PROMPTS, greedy)]
    full = dict(trainer.learner.strategy.full_parameters(trainer.model))  # gathered under FSDP2
    reference = HFEngine(reference_model(cfg.model.path, full).eval())
    want = [c.token_ids for c in reference.generate(PROMPTS, greedy)]
    mine = {
        "rank": trainer.rank,
        "engine": type(engine).__name__,
        "episodes": len(step.episodes),
        "trained": "update/skipped" not in step.metrics,
        "version": engine.version,
        "verified": step.metrics.get("sync/verified"),
        "probe": step.metrics.get("sync/probe_max_abs_diff"),
        "greedy": got,
        "hf_greedy": want,
    }
    everyone = ranks.gather_to_rank0(mine)
    if trainer.rank == 0:
        Path(out).write_text(json.dumps(everyone))
    dist.barrier()
    exit_driver()  # with main's objects still alive (configs.exit_driver)


if __name__ == "__main__":
    main()
