"""HFEngine vs. raw ``model.generate``: sampling throughput on CPU.

The engine runs twice: with its lean decode step (``lean_decode=True``, Qwen2 and Llama models) and
with the ``transformers`` forward in its own loop (``lean_decode=False``); the header says which of
the two a run picks by default (``lean_decode=None``: the lean step only where it is the faster).

Both sample ``--new-tokens`` tokens for ``--batch`` left-padded chat prompts of different lengths with
temperature 1 and no stop tokens (so every row runs to the end). ``generate`` is measured plain (no
scores: its fastest path, which gives no logprobs) and with ``output_logits=True`` (what a logprob-
returning wrapper around it would need at least). Best of ``--repeats`` interleaved runs.

    .venv/bin/python bench/engine.py --preset h128-L8 --batch 128 --new-tokens 128
    .venv/bin/python bench/engine.py --model pypi:smollm2-135m-instruct --batch 16 64 --new-tokens 64
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from functools import partial

import torch
from transformers import GenerationConfig

from agentrl.engines.base import SamplingParams
from agentrl.engines.hf import HFEngine
from agentrl.models import ensure_tiny_base, load_policy, resolve_model_path
from agentrl.models.corpus import word_problem


def chat_prompts(tokenizer, n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        question, _ = word_problem(rng)
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
        )
        out.append(tokenizer.encode(text, add_special_tokens=False))
    return out


def interleaved_best(repeats: int, fns: dict[str, Callable[[], object]]) -> dict[str, float]:
    """Best wall time of each function, running them in turn (A B C A B C ...) so that load from
    other processes on a shared machine hits all of them alike."""
    best = {name: float("inf") for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def run_generate(model, prompts: list[list[int]], new_tokens: int, pad_id: int, with_logits: bool) -> None:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    cfg = GenerationConfig(
        do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
        eos_token_id=None, pad_token_id=pad_id, output_logits=with_logits, return_dict_in_generate=with_logits,
    )  # fmt: skip
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=cfg)
    seqs = out.sequences if with_logits else out
    assert seqs.shape[1] == width + new_tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="h128-L8")
    ap.add_argument(
        "--model", default=None, help="a model.path (directory, .gguf, pypi:NAME) instead of a tiny preset"
    )
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch", type=int, nargs="+", default=[32, 128])
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    path = resolve_model_path(args.model) if args.model else ensure_tiny_base(args.preset)
    model, tok = load_policy(path, dtype=args.dtype)
    model.eval()
    auto = HFEngine(model, tok, max_batch_size=max(args.batch)).decode_path  # what a run would use
    engine = HFEngine(model, tok, max_batch_size=max(args.batch), lean_decode=True)
    loop = HFEngine(model, tok, max_batch_size=max(args.batch), lean_decode=False)
    name = args.model or args.preset
    print(
        f"{name} ({model.config.model_type}, lean step: {engine.decode_path == 'lean'}, a run uses: {auto}) "
        f"{args.dtype}, "
        f"{args.new_tokens} new tokens, torch threads {torch.get_num_threads()}"
    )
    print(
        f"{'batch':>5} {'engine, lean':>15} {'engine, no lean':>16} {'generate tok/s':>15} "
        f"{'gen+logits tok/s':>17} {'run/generate':>16}"
    )
    for b in args.batch:
        prompts = chat_prompts(tok, b)
        sp = SamplingParams(max_tokens=args.new_tokens, temperature=1.0, seed=0)
        run_generate(model, prompts[:2], 2, tok.pad_token_id, False)  # warm-up
        engine.generate(prompts[:2], SamplingParams(max_tokens=2))
        loop.generate(prompts[:2], SamplingParams(max_tokens=2))
        n = b * args.new_tokens
        fns = {
            "engine": partial(engine.generate, prompts, sp),
            "loop": partial(loop.generate, prompts, sp),
            "generate": partial(run_generate, model, prompts, args.new_tokens, tok.pad_token_id, False),
            "logits": partial(run_generate, model, prompts, args.new_tokens, tok.pad_token_id, True),
        }
        t = interleaved_best(args.repeats, fns)
        t_engine, t_gen, t_logits = t["engine"], t["generate"], t["logits"]
        t_run = t_engine if auto == "lean" else t["loop"]  # the path a run uses
        print(
            f"{b:>5} {n / t_engine:>15,.0f} {n / t['loop']:>16,.0f} {n / t_gen:>15,.0f} "
            f"{n / t_logits:>17,.0f} {t_gen / t_run:>16.2f}"
        )


if __name__ == "__main__":
    main()
