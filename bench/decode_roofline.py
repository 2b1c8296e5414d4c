"""The HF engine's decode step on the CPU against its roofline, measured the same day.

The roofline of one decode step of B rows is the larger of two times: reading every weight once
(the model's bytes over the machine's measured copy bandwidth) and the step's FLOPs (2 per
parameter per row, plus the attention's) at the machine's measured fp32 matrix-product peak (the
best of square products up to 4096). The step is timed as the engine runs it: the lean static step
(``lean_decode.py``, ``decode_loop.py``) and the transformers forward, each over ``--steps`` decode
steps after a prefill of left-padded chat prompts, best of ``--repeats`` interleaved rounds. Also
printed: what the matrix products of one layer reach at B rows, the ceiling the step cannot pass.

    .venv/bin/python bench/decode_roofline.py --model pypi:smollm2-135m-instruct --batch 16 64 128
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
from transformers import DynamicCache

from agentrl.engines.lean_decode import LeanDecoder
from agentrl.models import load_policy, resolve_model_path
from agentrl.models.cache_api import cache_kwargs


def best(fn, repeats: int = 5) -> float:
    fn()
    out = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out = min(out, time.perf_counter() - t0)
    return out


def matmul_peak() -> tuple[float, int]:
    """The best fp32 GFLOPS of square products, and the size that reached it."""
    out = (0.0, 0)
    for n in (1024, 2048, 4096):
        a, b = torch.randn(n, n), torch.randn(n, n)
        t = best(lambda: torch.mm(a, b), 3)  # noqa: B023
        out = max(out, (2 * n**3 / t / 1e9, n))
    return out


def copy_bandwidth() -> float:
    """GB/s of reading one 512 MiB fp32 tensor and writing another (counted as read + write)."""
    src = torch.randn(128 << 20)
    dst = torch.empty_like(src)
    t = best(lambda: dst.copy_(src), 5)
    return 2 * src.numel() * 4 / t / 1e9


def layer_gflops(model, rows: int) -> float:
    """GFLOPS of one decoder layer's matrix products at ``rows`` rows (the projections and the MLP,
    with the model's own weight shapes, pre-transposed as the lean step keeps them)."""
    layer = model.model.layers[0]
    mats = [m.weight.t().contiguous() for m in (
        layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.self_attn.o_proj,
        layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj,
    )]  # fmt: skip
    xs = [torch.randn(rows, w.shape[0]) for w in mats]
    flops = sum(2 * rows * w.shape[0] * w.shape[1] for w in mats)
    t = best(lambda: [torch.mm(x, w) for x, w in zip(xs, mats)], 20)
    return flops / t / 1e9


def step_seconds(model, rows: int, steps: int, lean: bool, repeats: int) -> float:
    """Seconds per decode step of ``rows`` rows after a 60-token prefill (the step only)."""
    ids = torch.randint(
        5, model.config.vocab_size - 1, (rows, 60), generator=torch.Generator().manual_seed(0)
    )
    mask = torch.ones_like(ids)
    out = float("inf")
    with torch.inference_mode():
        for _ in range(repeats):
            cache = DynamicCache(config=model.config)
            model(
                input_ids=ids,
                attention_mask=mask,
                **cache_kwargs(model, cache),
                use_cache=True,
                logits_to_keep=1,
            )
            tokens, pos = ids[:, -1].clone(), torch.full((rows,), 60)
            if lean:
                dec = LeanDecoder.from_cache(model, cache, mask, steps)
                t0 = time.perf_counter()
                for s in range(steps):
                    dec.step(tokens, pos + s, 61 + s)
            else:
                m = mask
                t0 = time.perf_counter()
                for s in range(steps):
                    m = torch.cat([m, m.new_ones((rows, 1))], dim=1)
                    model(input_ids=tokens[:, None], attention_mask=m, position_ids=(pos + s)[:, None],
                          **cache_kwargs(model, cache), use_cache=True)  # fmt: skip
            out = min(out, (time.perf_counter() - t0) / steps)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="pypi:smollm2-135m-instruct")
    ap.add_argument("--batch", type=int, nargs="+", default=[16, 64, 128])
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    flags = Path("/proc/cpuinfo").read_text()
    isa = "avx512_bf16" if "avx512_bf16" in flags else ("avx512f" if "avx512f" in flags else "avx2")
    peak, at = matmul_peak()
    bandwidth = copy_bandwidth()
    print(
        f"{os.cpu_count()} cores ({isa}), torch threads {torch.get_num_threads()}, {time.strftime('%Y-%m-%d')}"
    )
    print(f"fp32 matmul peak {peak:.1f} GFLOPS (square {at}); copy bandwidth {bandwidth:.1f} GB/s")
    model, _ = load_policy(resolve_model_path(args.model))
    model.eval()
    params = sum(p.numel() for p in model.parameters())
    weight_s = params * 4 / (bandwidth * 1e9)
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    print(f"{args.model}: {params / 1e6:.1f} M parameters, weights read once {1e3 * weight_s:.1f} ms")
    print(
        f"{'rows':>5} {'roofline ms':>12} {'bound':>7} {'lean ms':>8} {'% roof':>7} {'tf ms':>7} {'% roof':>7} {'layer GFLOPS':>13}"
    )
    for rows in args.batch:
        ctx = 60 + args.steps // 2  # the mean key length over the steps
        flops = 2 * params * rows + 4 * c.num_hidden_layers * c.num_attention_heads * head_dim * ctx * rows
        flop_s = flops / (peak * 1e9)
        roof = max(weight_s, flop_s)
        lean = step_seconds(model, rows, args.steps, True, args.repeats)
        plain = step_seconds(model, rows, args.steps, False, args.repeats)
        print(
            f"{rows:>5} {1e3 * roof:>12.1f} {'FLOPs' if flop_s > weight_s else 'weights':>7} {1e3 * lean:>8.1f} "
            f"{100 * roof / lean:>6.0f}% {1e3 * plain:>7.1f} {100 * roof / plain:>6.0f}% {layer_gflops(model, rows):>13.1f}"
        )


if __name__ == "__main__":
    main()
