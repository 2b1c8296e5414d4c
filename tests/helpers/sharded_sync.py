"""A bucketed weight sync under FSDP2, for tests/sync/test_weight_sync.py.

    python -m torch.distributed.run --nproc_per_node 2 tests/helpers/sharded_sync.py OUT.json \
        --variants '{"name": [override, ...], ...}' key=value ...

For each variant (one after the other, in one process group): builds a ``Trainer`` from the common
overrides and the variant's (FSDP2: each rank has its own HF engine, read from the model path), moves
the policy with one learner update on seeded synthetic episodes, then sends the same weights to two
copies of the rank's engine: the old transfer, one ``full_tensor()`` per parameter in the trainer's
dtype into one ``load_weights`` call (the engine casts), and the trainer's own ``weights.push()``, in
buckets of 0.05 MiB gathered one collective per bucket in the engine's dtype (verified: the probe
forward is a collective). It counts the push's all-gathers (``buckets.all_gather_flat``). Rank 0 writes every
rank's findings per variant.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: tests.helpers

from agentrl.assembly import make_trainer
from agentrl.config import load_config
from agentrl.parallel import buckets, ranks
from tests.helpers.configs import exit_driver
from tests.helpers.sharded_update import episodes


def per_parameter(learner):
    """The transfer before buckets: each parameter gathered whole in the trainer's dtype (LoRA: each
    merged weight from its gathered W, A and B)."""
    from agentrl.parallel.sharding import full_tensor
    from agentrl.training import lora

    if learner.settings.adapters:
        return lora.merged_weights(learner.model)
    return ((n, full_tensor(p)) for n, p in learner.model.named_parameters())


def run(overrides: list[str]) -> dict:
    cfg = load_config(None, [*overrides, "rollout.sync.bucket_mb=0.05"])
    trainer = make_trainer(cfg, log=lambda *_: None)
    learner = trainer.learner
    vocab = int(learner.model.config.vocab_size)  # type: ignore[union-attr, arg-type]
    learner.update(learner.make_batch(episodes(vocab)), 0)
    whole = copy.deepcopy(trainer.engine)
    before = {n: t.clone() for n, t in whole.model.state_dict().items()}  # type: ignore[attr-defined]
    whole.load_weights(per_parameter(learner))  # collective: every rank gathers every tensor
    gathers = []
    real = buckets.all_gather_flat

    def counting(out, part, group):
        gathers.append(str(part.dtype))
        return real(out, part, group)

    buckets.all_gather_flat = counting
    try:
        metrics = trainer.weights.push()  # collective: buckets, then the probe forward
    finally:
        buckets.all_gather_flat = real
    got, want = trainer.engine.model.state_dict(), whole.model.state_dict()  # type: ignore[attr-defined]
    return {
        "rank": trainer.rank,
        "differ": [n for n in want if not torch.equal(got[n], want[n])],
        "moved": sum(not torch.equal(before[n], want[n]) for n in want),
        "tensors": len(want),
        "engine_dtype": str(next(iter(got.values())).dtype),
        "verified": metrics["sync/verified"],
        "buckets": metrics["sync/buckets"],
        "gathers": gathers,
        "probe_max_abs_diff": metrics["sync/probe_max_abs_diff"],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--variants", required=True)
    args = ap.parse_intermixed_args()
    found = {}
    for name, extra in json.loads(args.variants).items():
        own = [*args.overrides, *extra, f"run.output_dir={Path(args.out).parent / name}"]
        found[name] = ranks.gather_to_rank0(run(own))
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps(found))
    dist.barrier()
    dist.destroy_process_group()
    exit_driver()  # with main's objects still alive (configs.exit_driver)


if __name__ == "__main__":
    main()
