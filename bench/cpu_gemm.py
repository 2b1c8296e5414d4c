"""The CPU's fp32 matrix products through torch's two libraries: MKL (what ``torch.mm``, ``addmm`` and
``F.linear`` call for float32 on x86) and oneDNN with a weight packed once for the batch
(``torch.ops.mkldnn._reorder_linear_weight`` and ``_linear_pointwise``, what torch.compile's CPU
freezing calls; internal ops, no public API), measured in one process, interleaved.

Why: on some CPUs MKL's float32 GEMM runs far below the machine (MKL picks its kernels by vendor,
oneDNN by instruction set), and every fp32 product agentrl runs on a CPU (the engine's decode, the
trainer's update) goes through it. Shapes: a square product (the peak that ``bench/step_parts.py
--peak`` and ``bench/decode_roofline.py`` quote), and the products of one decode step of a model of
SmolLM2-135M's shape (30 layers of q/k/v + rotate-half images packed in one GEMM as the lean step
does, o, gate/up, down, then the 49,152-row head) at ``--rows`` rows. Also: the largest relative
difference between the two libraries' results (summation order; float32 rounding).

    .venv/bin/python bench/cpu_gemm.py                    # 2 threads, rows 16 32 128, ~1 min
    .venv/bin/python bench/cpu_gemm.py --threads 1 --rows 32
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch

from agentrl.engines.cpu_gemm import best_of, onednn_ops

# SmolLM2-135M: hidden 576, 9 query heads and 3 KV heads of 64, MLP 1536, 30 layers, vocabulary 49,152.
HIDDEN, Q, KV, INTER, LAYERS, VOCAB = 576, 576, 192, 1536, 30, 49152
DECODE = (  # (name, in, out) of one layer's products in the lean step (engines/lean_decode.py)
    ("qkv + rotated q, k", HIDDEN, Q + KV + KV + Q + KV),
    ("o", Q, HIDDEN),
    ("gate, up", HIDDEN, 2 * INTER),
    ("down", INTER, HIDDEN),
)


def best(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm: the first call allocates and picks its kernels
    return best_of(fn, repeats)


def square(n: int, repeats: int, ops: tuple[Callable, Callable]) -> tuple[float, float, float]:
    """GFLOPS of an n x n x n product through MKL and through oneDNN, and their largest relative
    difference."""
    reorder, linear = ops
    a, w = torch.randn(n, n), torch.randn(n, n) / n**0.5
    w_t = w.t().contiguous()  # [in, out], as the lean step keeps its weights
    packed = reorder(w, n)
    mkl = best(lambda: torch.mm(a, w_t), repeats)
    dnn = best(lambda: linear(a, packed, None, "none", [], ""), repeats)
    ref = torch.mm(a, w_t)
    diff = ((linear(a, packed, None, "none", [], "") - ref).abs().max() / ref.abs().max()).item()
    flop = 2.0 * n**3
    return flop / mkl / 1e9, flop / dnn / 1e9, diff


def decode_products(
    rows: int, repeats: int, ops: tuple[Callable, Callable]
) -> tuple[float, float, float, float]:
    """Milliseconds of one decode step's products at ``rows`` rows through MKL (``torch.mm`` into a
    preallocated output against a pre-transposed weight, as the lean step calls it) and through
    oneDNN (the weight packed for ``rows``), the step's GFLOP, and the largest relative difference."""
    reorder, linear = ops
    torch.manual_seed(0)
    shapes = [*DECODE] * LAYERS + [("head", HIDDEN, VOCAB)]
    weights = {(i, o): torch.randn(o, i) / i**0.5 for _, i, o in set(shapes)}
    w_t = {k: w.t().contiguous() for k, w in weights.items()}
    packed = {k: reorder(w, rows) for k, w in weights.items()}
    xs = {(i, o): torch.randn(rows, i) for _, i, o in set(shapes)}
    outs = {(i, o): torch.empty(rows, o) for _, i, o in set(shapes)}
    keys = [(i, o) for _, i, o in shapes]

    def mkl() -> None:
        for k in keys:
            torch.mm(xs[k], w_t[k], out=outs[k])

    def dnn() -> None:
        for k in keys:
            linear(xs[k], packed[k], None, "none", [], "")

    t_mkl = t_dnn = float("inf")
    for _ in range(repeats):  # interleaved: a moment of load weighs on both
        t_mkl = min(t_mkl, best(mkl, 1))
        t_dnn = min(t_dnn, best(dnn, 1))
    diff = 0.0
    for k in weights:
        ref = torch.mm(xs[k], w_t[k])
        got = linear(xs[k], packed[k], None, "none", [], "")
        diff = max(diff, ((got - ref).abs().max() / ref.abs().max()).item())
    flop = 2.0 * rows * sum(i * o for i, o in keys)
    return t_mkl * 1e3, t_dnn * 1e3, flop / 1e9, diff


def cpu_flags() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    flags = next(
        (line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []
    )
    model = next(
        (line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "?"
    )
    keep = [f for f in flags if f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")]
    return f"{model}; {' '.join(keep) or 'no AVX2'}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, nargs="+", default=[16, 32, 128])
    ap.add_argument("--square", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ops = onednn_ops()
    print(f"torch {torch.__version__}, {args.threads} threads, {cpu_flags()}")
    if ops is None:
        raise SystemExit("this torch build has no oneDNN linear ops (torch.ops.mkldnn._linear_pointwise)")
    mkl, dnn, diff = square(args.square, args.repeats, ops)
    print(
        f"square {args.square}: MKL {mkl:.1f} GFLOPS, oneDNN {dnn:.1f} GFLOPS ({dnn / mkl:.2f}x), max rel diff {diff:.1e}"
    )
    print("| rows | MKL ms | oneDNN ms | oneDNN / MKL speed | MKL GFLOPS | oneDNN GFLOPS | max rel diff |")
    print("|---|---|---|---|---|---|---|")
    for rows in args.rows:
        t_mkl, t_dnn, gflop, diff = decode_products(rows, args.repeats, ops)
        print(
            f"| {rows} | {t_mkl:.1f} | {t_dnn:.1f} | {t_mkl / t_dnn:.2f}x | {gflop / t_mkl * 1e3:.0f} | "
            f"{gflop / t_dnn * 1e3:.0f} | {diff:.1e} |"
        )


if __name__ == "__main__":
    main()
