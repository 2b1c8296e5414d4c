"""Where the update's backward goes in float32 and under ``trainer.bf16`` (CPU autocast): the
question docs/performance.md left open ("the forward fell from 12.4 to 5.8-6.7 s, the backward only
from 21.1 to 17.2-20.1 s").

The update's own path on a GRPO-shaped batch (bench/step_parts.py's shapes on a real model: 4 prompts
× 8 samples of 172 tokens, prompts of 44 tokens shared per group): the per-group prefix plan, the
last hidden states, the chunked head's log-probs and entropies with the written-out gradient
(``_HeadStats``), a loss over both, backward. Forward and backward are timed apart, fp32 and bf16
interleaved, then one backward of each is profiled (``torch.profiler``, CPU ops by self time).

    .venv/bin/python bench/bf16_backward.py --model pypi:smollm2-135m-instruct --reps 2
    .venv/bin/python bench/bf16_backward.py --products   # the three products of a linear layer only
    .venv/bin/python bench/bf16_backward.py --model pypi:smollm2-135m-instruct --attention --reps 2

``--products`` times a linear layer's three products at SmolLM2-135M's MLP shape (4,096 positions,
576 -> 1,536) in fp32 and bf16, in the layouts autograd hands them: the forward x·Wᵀ, the input's
gradient g·W and the weight's gradient gᵀ·x. On a CPU without bf16 instructions (AVX2) torch
emulates the bf16 products, and this shows by how much.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch


def attention_in_fp32(model, forward, reps: int) -> None:
    """bf16 autocast with transformers' sdpa in bf16 against the trainer's float32 attention
    (training/cpu_attention.py): forward and backward times (medians, the first round dropped), and
    each one's largest log-prob difference and gradient cosine against float32."""
    from agentrl.training import cpu_attention

    def run(impl: str, bf16: bool) -> tuple[float, float, torch.Tensor, torch.Tensor]:
        model.set_attn_implementation(impl)
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        loss, lp = forward(bf16)
        t1 = time.perf_counter()
        loss.backward()
        grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        return t1 - t0, time.perf_counter() - t1, lp.detach(), grad

    cpu_attention.apply(model, torch.device("cpu"), True, lambda _: None)  # registers it
    cases = {
        "fp32": ("sdpa", False),
        "bf16, attention bf16": ("sdpa", True),
        "bf16, attention fp32": (cpu_attention.ATTENTION, True),
    }
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in cases}
    outs = {}
    for _ in range(reps + 1):
        for name, (impl, bf16) in cases.items():
            f, b, lp, g = run(impl, bf16)
            times[name].append((f, b))
            outs[name] = (lp, g)
    ref_lp, ref_g = outs["fp32"]
    for name, xs in times.items():
        lp, g = outs[name]
        cos = float(torch.nn.functional.cosine_similarity(g, ref_g, 0))
        print(
            f"  {name:22s} forward {statistics.median(x[0] for x in xs[1:]):5.2f} s  backward "
            f"{statistics.median(x[1] for x in xs[1:]):5.2f} s  max|dlogp| {float((lp - ref_lp).abs().max()):.3f}"
            f"  grad cos {cos:.4f}"
        )


def products(n: int = 4096, d: int = 576, k: int = 1536, reps: int = 3) -> None:
    """GFLOPS of a linear layer's forward and its two gradient products, fp32 and bf16."""
    from agentrl.engines.probe_cache import cpu_flags

    bf16 = sorted(cpu_flags() & {"avx512_bf16", "amx_bf16", "bf16"}) or ["none"]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, capability "
          f"{torch.backends.cpu.get_cpu_capability()}, bf16 instructions: {', '.join(bf16)}")  # fmt: skip
    for name, fn in (
        ("forward x·Wᵀ  [N,D]x[D,K]", lambda x, w, g: x @ w.t()),
        ("grad   g·W    [N,K]x[K,D]", lambda x, w, g: g @ w),
        ("grad   gᵀ·x   [K,N]x[N,D]", lambda x, w, g: g.t() @ x),
    ):
        best = {}
        for dtype in (torch.float32, torch.bfloat16):
            x, w, g = (torch.randn(*s).to(dtype) for s in ((n, d), (k, d), (n, k)))
            fn(x, w, g)  # warm-up
            runs = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn(x, w, g)
                runs.append(time.perf_counter() - t0)
            best[dtype] = min(runs)
        gf = {dt: 2 * n * d * k / t / 1e9 for dt, t in best.items()}
        print(f"  {name}  fp32 {gf[torch.float32]:6.1f} GFLOPS  bf16 {gf[torch.bfloat16]:6.1f} GFLOPS  "
              f"bf16 time / fp32 time {best[torch.bfloat16] / best[torch.float32]:5.2f}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="pypi:smollm2-135m-instruct")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--top", type=int, default=14, help="profiled ops shown per precision")
    ap.add_argument("--products", action="store_true", help="only a linear layer's three products")
    ap.add_argument("--attention", action="store_true", help="bf16 with the attention in bf16 and in float32")
    args = ap.parse_args()
    if args.products:
        return products()

    from agentrl.algorithms.token_stats import token_logprobs_and_entropy_from_hidden
    from agentrl.models import load_policy, resolve_model_path
    from agentrl.training.forward import hidden_states_out, prefix_plan, suffix_logits

    torch.manual_seed(0)
    model, _ = load_policy(resolve_model_path(args.model))
    model.train()
    head = model.get_output_embeddings()
    B, T, P = 32, 172, 44
    gen = torch.Generator().manual_seed(0)
    V = model.config.vocab_size
    prompts = torch.randint(5, V, (4, P), generator=gen)
    rows = torch.randint(5, V, (B, T), generator=gen)
    rows[:, :P] = prompts.repeat_interleave(8, 0)
    plan = prefix_plan(rows, torch.full((B,), T), limit=P - 2)

    def forward(bf16: bool) -> tuple[torch.Tensor, torch.Tensor]:
        autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        with autocast, hidden_states_out(head):
            hidden = suffix_logits(model, rows, plan.share, plan.owners)[:, :-1]
            lp, ent = token_logprobs_and_entropy_from_hidden(hidden, head.weight, rows[:, plan.share + 1 :])
        return -lp.mean() - 0.01 * ent.mean(), lp

    if args.attention:
        return attention_in_fp32(model, forward, args.reps)

    times: dict[str, list[float]] = {}
    for _ in range(args.reps + 1):  # the first round warms up (oneDNN picks its kernels)
        for bf16 in (False, True):
            name = "bf16" if bf16 else "fp32"
            model.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            loss, _ = forward(bf16)
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            times.setdefault(f"{name} forward", []).append(t1 - t0)
            times.setdefault(f"{name} backward", []).append(t2 - t1)
    print(f"{args.model}: {B} x {T} tokens, prefix {plan.share} shared per group; medians of {args.reps} "
          f"(first round dropped), torch {torch.__version__}, {torch.get_num_threads()} threads")  # fmt: skip
    for name, xs in times.items():
        print(f"  {name:14s} {statistics.median(xs[1:]):7.2f} s")

    from torch.profiler import ProfilerActivity, profile

    for bf16 in (False, True):
        model.zero_grad(set_to_none=True)
        loss, _ = forward(bf16)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            loss.backward()
        print(f"\nbackward, {'bf16 autocast' if bf16 else 'fp32'}: ops by self CPU time")
        print(
            prof.key_averages().table(
                sort_by="self_cpu_time_total", row_limit=args.top, max_name_column_width=48
            )
        )


if __name__ == "__main__":
    main()
