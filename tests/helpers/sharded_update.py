"""Learner updates on a fixed synthetic batch, under torchrun or in one process, for tests/parallel/test_sharding.py.

    python -m torch.distributed.run --nproc_per_node 2 tests/helpers/sharded_update.py OUT.pt key=value ...
    python tests/helpers/sharded_update.py OUT.pt key=value ...        # the single-process reference
    ... OUT.pt key=value --variants '{"a": [...], "b": [...]}'    # several runs in one launch

Builds a ``Trainer`` from the overrides (so loading, LoRA, sharding and materialisation take the
training path), runs ``--steps`` updates of the learner on the same seeded episodes (no rollouts),
and has rank 0 save: the full parameters after the updates, every step's metrics, the token weights
and selection mask of every step, the log-probs of the policy tokens under the final policy, the weights
the engine received, and (``--checkpoint``) the checkpoint's path.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: tests.helpers

from agentrl.assembly import make_trainer
from agentrl.config import load_config
from tests.helpers.batches import synthetic_batch


def episodes(vocab: int, n: int = 8):
    """``n`` episodes in 2 groups with rewards that differ within each group."""
    eps = synthetic_batch(vocab, n=n).episodes
    for i, ep in enumerate(eps):
        ep.reward = float(i % 3) / 2
    return eps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--checkpoint", action="store_true", help="write a checkpoint after the updates")
    ap.add_argument(
        "--variants",
        help='JSON {"name": [override, ...]}: one run per variant in this process group (one launch), each '
        "with the common overrides, its own, and run.output_dir OUT_DIR/name; results in OUT.name.pt",
    )
    args = ap.parse_intermixed_args()
    if not args.variants:
        run(args.out, args.overrides, args.steps, args.checkpoint)
    else:
        out = Path(args.out)
        for name, extra in json.loads(args.variants).items():
            own = [*args.overrides, *extra, f"run.output_dir={out.parent / name}"]
            run(str(out.with_name(f"{out.stem}.{name}.pt")), own, args.steps, args.checkpoint)
            gc.collect()
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def run(out: str, overrides: list[str], steps: int, checkpoint: bool) -> None:
    cfg = load_config(None, overrides)
    trainer = make_trainer(cfg, log=lambda *_: None)
    learner = trainer.learner
    weights, metrics = [], []
    real = learner.token_weights

    def recording(*a, **k):
        tw = real(*a, **k)
        weights.append({"weights": tw.weights.cpu().clone(), "mask": tw.mask.cpu().clone()})
        return tw

    learner.token_weights = recording  # type: ignore[method-assign]
    vocab = int(learner.model.config.vocab_size)  # type: ignore[union-attr, arg-type]
    for step in range(steps):
        batch = learner.make_batch(episodes(vocab))
        metrics.append(learner.update(batch, step))
    engine = {k: v.cpu().clone() for k, v in learner.engine_weights()}  # collective
    params = {n: t.cpu().clone() for n, t in learner.strategy.full_parameters(learner.model)}  # collective
    final = learner.make_batch(episodes(vocab))
    logp = learner.passes.no_grad(learner.model, final)[0].cpu()
    logp = logp * (final.mask.cpu() > 0)  # positions past a row's end are left as the pass found them
    # after a no-grad pass nothing stays gathered (FSDP2 registers sharded parameters as DTensors)
    sharded = all(type(p).__name__ == "DTensor" for p in learner.model.parameters())
    ckpt = str(trainer.checkpoint(steps)) if checkpoint else None
    if trainer.rank == 0:
        torch.save(
            {
                "world": trainer.world,
                "params": params,
                "metrics": metrics,
                "weights": weights,
                "logp": logp,
                "engine": engine,
                "checkpoint": ckpt,
                "sharded": sharded,
            },
            out,
        )
    if torch.distributed.is_initialized():
        torch.distributed.barrier()  # rank 0 has written before any rank starts the next variant


if __name__ == "__main__":
    main()
    # The results are written and the process group is destroyed. Skip interpreter finalization: in
    # CI a rank intermittently aborted there after a correct run ("terminate called without an active
    # exception", SIGABRT, seen 5 times in 3 runs on 2026-11-24, never reproduced alone); these drivers
    # test what they wrote, not the exit. The CLI's exit under torchrun is tested by tests/parallel/test_ddp.py.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
