"""Shared-prefix forward (agentrl/training/forward.py) against the plain forward, on the quickstart's SFT batches.

A batch of calculator demonstrations shares its first ~220 of ~290 tokens (system prompt and tool
schema). This times forward + backward of the SFT loss with the prefix run once per batch versus
once per row, alternating the two so that machine noise hits both, and checks the losses agree.

    .venv/bin/python bench/shared_prefix.py [--config configs/quickstart.yaml] [--batch 16] [--reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/quickstart.yaml")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()

    from agentrl.assembly.sft import build_examples
    from agentrl.config import load_config
    from agentrl.models import load_policy, resolve_model_path
    from agentrl.training.forward import first_loss_column, shared_prefix_len, suffix_logits
    from agentrl.training.sft import _pad

    cfg = load_config(args.config)
    model, tokenizer = load_policy(resolve_model_path(cfg.model.path))
    model.train()
    examples = build_examples(cfg, tokenizer)[: args.batch]
    ids, mask = _pad(examples, tokenizer.pad_token_id or 0)
    lengths = torch.tensor([len(x) for x, _ in examples])
    shared = shared_prefix_len(ids, lengths, limit=first_loss_column(mask[:, 1:]))

    def step(share: int) -> tuple[float, float]:
        t0 = time.perf_counter()
        logits = suffix_logits(model, ids, share)[:, :-1]
        target, tmask = ids[:, share + 1 :], mask[:, share + 1 :]
        tok = F.cross_entropy(logits.flatten(0, 1).float(), target.flatten(), reduction="none")
        loss = (tok * tmask.flatten()).sum() / tmask.sum()
        model.zero_grad(set_to_none=True)
        loss.backward()
        return time.perf_counter() - t0, float(loss)

    times: dict[int, list[float]] = {0: [], shared: []}
    losses: dict[int, float] = {}
    step(0), step(shared)  # warm-up
    for _ in range(args.reps):
        for share in (0, shared):
            t, loss = step(share)
            times[share].append(t)
            losses[share] = loss
    full, part = statistics.median(times[0]), statistics.median(times[shared])
    print(
        f"batch {ids.shape[0]} x {ids.shape[1]} tokens, shared prefix {shared} tokens, threads {torch.get_num_threads()}"
    )
    print(f"plain forward+backward:         {full * 1000:7.1f} ms (median of {args.reps})")
    print(f"shared-prefix forward+backward: {part * 1000:7.1f} ms")
    print(f"speed-up: {full / part:.2f}x   loss difference: {abs(losses[0] - losses[shared]):.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
