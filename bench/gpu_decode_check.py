"""The HF engine's decode on one GPU, per step, against ``model.generate``: where the time goes.

A model shaped like SmolLM2-135M (Llama, 30 layers, hidden 576, 9 heads over 3 KV heads, vocab
49,152, tied embeddings) with random bfloat16 weights (the GPU machine reaches no hub; timing does
not depend on the weights), left-padded prompts of four lengths, temperature 1, no stop tokens: every
row decodes ``--new-tokens`` steps. Each variant runs twice on the same shapes (cold, then warm:
cuDNN caches an attention graph per shape). Times use ``torch.cuda.synchronize``; the engine's are
per decode step with the prefill taken out, ``generate``'s per new token.

Rows, at each ``--batch``:
- ``transformers``: the engine's transformers decode path (``lean_decode=False``), as it runs (the
  engine keeps cuDNN out of its own attention calls) and with cuDNN allowed, as before that change;
- ``lean_eager``: the static lean loop without CUDA graphs; ``lean_graph``: replayed as a CUDA graph
  (the engine's default on CUDA), reading tokens back every 1 and 8 steps. Since the graphs are kept
  per batch bucket (engines/decode_graphs.py) the cold run includes their capture and the warm run
  replays them (the first H200 run of 2026-11-30 captured a graph per batch in both; the second,
  at c468220, kept them);
- ``generate``: ``model.generate`` with a dynamic cache, cuDNN allowed and not; with ``--static``
  also a static cache (transformers compiles its forward: the first run includes the compile).
Also: which attention kernel sdpa picks at decode shapes, and a new key length against a repeated
one; where each path reads the device back (``torch.cuda.set_sync_debug_mode``); the lean graph's
paths' tokens against the eager lean loop's at the same seeds, in bfloat16 and in a float32 copy
(``--agreement-only``: that alone); a short profile of the transformers path.

    python3 bench/gpu_decode_check.py [--batch 32 128] [--new-tokens 128] [--static] [--agreement-only]

Writes ``$OUT/gpu_decode_check.json`` and ``$OUT/profile_transformers.txt`` (``$OUT`` defaults to
the current directory). Ran on an H200 on 2026-11-30 in 109 s and, with the kept graphs, 135 s
(``--agreement-only`` 26 s; results in docs/performance.md); ``--static`` has not run.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from copy import deepcopy
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrl.engines.base import SamplingParams
from agentrl.engines.hf import HFEngine

KERNELS = {0: "MATH", 1: "FLASH", 2: "EFFICIENT", 3: "CUDNN", 4: "OVERRIDEABLE"}
LENGTHS = (40, 44, 47, 51)


def no_cudnn() -> contextlib.AbstractContextManager:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def any_kernel() -> contextlib.AbstractContextManager:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    order = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
    return sdpa_kernel([*order, SDPBackend.MATH], set_priority=True)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    sync()
    t0 = time.perf_counter()
    out = fn()
    sync()
    return time.perf_counter() - t0, out


def smollm2_shaped(device: str, layers: int = 30) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
        num_attention_heads=9, num_key_value_heads=3, rms_norm_eps=1e-5, rope_theta=1e5,
        max_position_embeddings=8192, tie_word_embeddings=True, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(device, torch.bfloat16 if device == "cuda" else torch.float32).eval()
    model.generation_config.eos_token_id = None  # every row runs all its steps
    return model


def prompts(rows: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    base = [torch.randint(5, 49000, (n,), generator=g).tolist() for n in LENGTHS]
    return [base[i % len(base)] for i in range(rows)]


def attention_probe(device: str) -> dict[str, object]:
    """The kernel sdpa picks at the transformers decode path's shapes, and ms per call at 16 new key
    lengths against 16 calls at one length, with cuDNN allowed and not."""
    out: dict[str, object] = {}
    B, D = 64, 64
    q = torch.randn(B, 9, 1, D, device=device, dtype=torch.bfloat16)
    keys = torch.randn(B, 9, 700, D, device=device, dtype=torch.bfloat16)
    mask = torch.ones(B, 1, 1, 700, dtype=torch.bool, device=device)
    mask[::4, ..., :7] = False

    def kv(n: int) -> tuple:
        return keys[:, :, :n].contiguous(), keys[:, :, :n].contiguous(), mask[..., :n]

    with any_kernel():
        out["choice"] = KERNELS.get(int(torch._fused_sdp_choice(q, *kv(200))), "?")  # type: ignore[attr-defined]
    for label, scope, offset in (("cudnn_allowed", any_kernel, 0), ("no_cudnn", no_cudnn, 300)):
        fresh = [kv(300 + offset + i) for i in range(16)]
        repeated = [fresh[-1]] * 16
        with scope():
            t_new, _ = timed(functools.partial(attend, q, fresh))
            t_same, _ = timed(functools.partial(attend, q, repeated))
        out[f"{label}/new_length_ms"] = round(1e3 * t_new / 16, 3)
        out[f"{label}/same_length_ms"] = round(1e3 * t_same / 16, 3)
    return out


def attend(q: torch.Tensor, calls: list[tuple]) -> list[torch.Tensor]:
    return [F.scaled_dot_product_attention(q, k, v, attn_mask=m) for k, v, m in calls]


def engine_ms(engine: HFEngine, rows: int, new: int, reps: int = 2) -> list[float]:
    """ms per decode step of ``engine.generate``, the prefill taken out; one value per rep."""
    spent: list[float] = []
    real = engine._prefill

    def prefill(batch):  # type: ignore[no-untyped-def]
        took, result = timed(lambda: real(batch))
        spent.append(took)
        return result

    engine._prefill = prefill  # type: ignore[method-assign]
    params = [SamplingParams(max_tokens=new, temperature=1.0, seed=7 + i) for i in range(rows)]
    out = []
    try:
        for _ in range(reps):
            spent.clear()
            took, _ = timed(lambda: engine.generate(prompts(rows), params))
            out.append(round(1e3 * (took - sum(spent)) / new, 3))
    finally:
        engine._prefill = real  # type: ignore[method-assign]
    return out


def generate_ms(model: torch.nn.Module, rows: int, new: int, reps: int = 2, **kw: object) -> list[float]:
    ps = prompts(rows)
    width = max(map(len, ps))
    ids = torch.zeros(rows, width, dtype=torch.long)
    mask = torch.zeros(rows, width, dtype=torch.long)
    for i, p in enumerate(ps):
        ids[i, width - len(p) :], mask[i, width - len(p) :] = torch.tensor(p), 1
    device = next(model.parameters()).device
    ids, mask = ids.to(device), mask.to(device)
    out = []
    with torch.inference_mode():
        for _ in range(reps):
            took, seq = timed(
                lambda: model.generate(  # type: ignore[operator]
                    input_ids=ids, attention_mask=mask, max_new_tokens=new, do_sample=True, temperature=1.0,
                    top_k=0, top_p=1.0, pad_token_id=0, **kw,
                )
            )  # fmt: skip
            out.append(round(1e3 * took / (seq.shape[1] - width), 3))  # type: ignore[attr-defined]
    return out


def reads_back(engine: HFEngine, rows: int) -> dict[str, int]:
    """Where a generate call reads the device back: the deepest agentrl or transformers frame of each
    synchronising call, counted."""
    sites: Counter[str] = Counter()
    show = warnings.showwarning

    def record(message, *args, **kwargs):  # type: ignore[no-untyped-def]
        if "synchroniz" in str(message):
            frames = [
                f
                for f in traceback.extract_stack()[:-1]
                if "agentrl" in f.filename or "transformers" in f.filename
            ]
            sites[f"{frames[-1].filename.rsplit('/', 2)[-1]}:{frames[-1].lineno}" if frames else "?"] += 1

    warnings.showwarning = record
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            engine.generate(prompts(rows), [SamplingParams(max_tokens=16, seed=i) for i in range(rows)])
    finally:
        torch.cuda.set_sync_debug_mode(0)
        warnings.showwarning = show
    return dict(sites.most_common(12))


def float32_engines(model: torch.nn.Module, device: str) -> dict[str, HFEngine]:
    """The three decode paths over a float32 copy of ``model`` (TF32 off)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    copy = deepcopy(model).float()
    return {
        "transformers": HFEngine(copy, device=device, lean_decode=False),
        "lean_eager": HFEngine(copy, device=device, lean_decode=True, cuda_graphs=False),
        "lean_graph_poll8": HFEngine(copy, device=device, lean_decode=True, poll_every=8),
    }


def agreement(engines: dict[str, HFEngine], rows: int = 32, new: int = 32) -> dict[str, object]:
    """Each path's sampled tokens against the eager lean loop's at the same seeds, and the graph's
    against its own second run: rows with the same tokens, the earliest step where a row's tokens
    part (every later token follows the difference, so one flipped token changes the rest of its
    row), and the largest log-prob difference before the row parts."""
    params = [SamplingParams(max_tokens=new, temperature=1.0, seed=i) for i in range(rows)]
    outs = {name: engine.generate(prompts(rows), params) for name, engine in engines.items()}
    pairs = {name: (outs["lean_eager"], outs[name]) for name in outs if name != "lean_eager"}
    again = engines["lean_graph_poll8"].generate(prompts(rows), params)
    pairs["lean_graph_poll8 run twice"] = (outs["lean_graph_poll8"], again)
    report: dict[str, object] = {}
    for name, (ref, other) in pairs.items():
        parts, worst = [], 0.0
        for a, b in zip(ref, other):
            same = next((i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y), new)
            parts.append(same)
            worst = max([worst] + [abs(x - y) for x, y in zip(a.logprobs[:same], b.logprobs[:same])])
        report[name] = {
            "rows_equal": f"{sum(p == new for p in parts)}/{rows}",
            "first_difference_min": min(parts),
            "logprob_max_diff_before_it": worst,
        }
    return report


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[32, 128])
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--static", action="store_true", help="also model.generate with a static cache")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="on the CPU, 2 layers, tiny sizes: checks the script runs, measures nothing",
    )
    ap.add_argument(
        "--agreement-only",
        action="store_true",
        help="only the paths' agreement in bfloat16 and float32: no timing, probe or profile",
    )
    args = ap.parse_args()
    out_dir = Path(os.environ.get("OUT", "."))
    if not torch.cuda.is_available() and not args.smoke:
        print("gpu_decode_check: no CUDA device; nothing to measure (--smoke runs the script on the CPU)")
        return
    device = "cpu" if args.smoke else "cuda"
    import transformers

    res: dict[str, object] = {
        "gpu": torch.cuda.get_device_name() if device == "cuda" else "none (--smoke)",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "transformers": transformers.__version__,
        "date": time.strftime("%Y-%m-%d"),
    }
    print(res, flush=True)
    if args.agreement_only:
        args.batch = []
    elif device == "cuda":
        res["attention"] = attention_probe(device)
        print(res["attention"], flush=True)
    if device == "cpu":
        args.batch, args.new_tokens = [] if args.agreement_only else [4], 6
    model = smollm2_shaped(device, layers=2 if args.smoke else 30)
    make = {
        "transformers": lambda: HFEngine(model, device=device, lean_decode=False),
        "lean_eager": lambda: HFEngine(model, device=device, lean_decode=True, cuda_graphs=False),
        "lean_graph_poll1": lambda: HFEngine(model, device=device, lean_decode=True, poll_every=1),
        "lean_graph_poll8": lambda: HFEngine(model, device=device, lean_decode=True, poll_every=8),
    }
    engines = {name: build() for name, build in make.items()}
    engines["transformers"].generate(prompts(4), SamplingParams(max_tokens=4))  # CUDA context, cuBLAS
    for rows in args.batch:
        row: dict[str, object] = {name: engine_ms(e, rows, args.new_tokens) for name, e in engines.items()}
        with any_kernel():  # the engine scopes its own calls; this lets cuDNN back in
            real = engines["transformers"]._attention_kernels
            engines["transformers"]._attention_kernels = contextlib.nullcontext  # type: ignore[method-assign]
            row["transformers_cudnn_allowed"] = engine_ms(engines["transformers"], rows, args.new_tokens)
            engines["transformers"]._attention_kernels = real  # type: ignore[method-assign]
            row["generate_cudnn_allowed"] = generate_ms(model, rows, args.new_tokens)
        with no_cudnn():
            row["generate_no_cudnn"] = generate_ms(model, rows, args.new_tokens)
        res[f"B{rows}"] = row
        print(rows, row, flush=True)
    res["agreement"] = {
        "bfloat16" if device == "cuda" else "float32": agreement(engines),
        "float32": agreement(float32_engines(model, device)),
    }
    print(res["agreement"], flush=True)
    if args.agreement_only:
        (out_dir / "gpu_decode_check.json").write_text(json.dumps(res, indent=1))
        return
    if device == "cuda":
        res["reads_back"] = {name: reads_back(e, 16) for name, e in engines.items() if name != "lean_eager"}
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as p:
        engines["transformers"].generate(
            prompts(40), [SamplingParams(max_tokens=6, seed=i) for i in range(40)]
        )
    table = p.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)
    (out_dir / "profile_transformers.txt").write_text(table)
    if args.static and device == "cuda":
        t0 = time.perf_counter()
        try:
            res["generate_static_B128"] = generate_ms(
                model, 128, args.new_tokens, reps=3, cache_implementation="static"
            )
        except Exception as e:  # a compile failure is a finding, not the end of the check
            res["generate_static_B128"] = repr(e)[:300]
        res["static_wall_s"] = round(time.perf_counter() - t0, 1)
    (out_dir / "gpu_decode_check.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
