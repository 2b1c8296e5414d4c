"""VLLMEngine vs raw vLLM offline generation, on the same ``vllm.LLM`` instance.

``--batch`` chat prompts (as token ids), ``--new-tokens`` tokens each at temperature 1, no stop (every
row runs to the end). Raw: ``llm.generate`` with vLLM's own SamplingParams, without logprobs (its
fastest path) and with ``logprobs=0`` (what the engine asks for). Engine: ``VLLMEngine.generate``
(conversion to/from the Engine protocol included) and ``VLLMEngine.submit`` (the driver thread that
AsyncEpisodeRunner uses). Best of ``--repeats``; paths interleaved so load drifts hit all of them.

Runs in .venv-vllm (scripts/test_vllm.sh --install):

    .venv-vllm/bin/python bench/vllm_engine.py --batch 128 --new-tokens 128
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="h128-L8")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    import vllm
    from engine import chat_prompts  # bench/engine.py

    from agentrl.engines.base import SamplingParams
    from agentrl.engines.vllm import VLLMEngine
    from agentrl.models import ensure_tiny_base
    from agentrl.models.tokenizer import load_tokenizer

    path = ensure_tiny_base(args.preset)
    prompts = chat_prompts(load_tokenizer(path), args.batch)
    t0 = time.perf_counter()
    engine = VLLMEngine(str(path), dtype="float32", max_model_len=1024)
    print(
        f"{args.preset} float32, batch {args.batch}, {args.new_tokens} new tokens, engine start {time.perf_counter() - t0:.1f} s"
    )
    n = args.new_tokens

    def raw(logprobs: int | None):
        sps = [
            vllm.SamplingParams(max_tokens=n, temperature=1.0, ignore_eos=True, seed=i, logprobs=logprobs)
            for i in range(args.batch)
        ]
        outs = engine.llm.generate(
            [vllm.inputs.TokensPrompt(prompt_token_ids=p) for p in prompts], sps, use_tqdm=False
        )
        assert all(len(o.outputs[0].token_ids) == n for o in outs)

    def wrapped():
        outs = engine.generate(prompts, [SamplingParams(max_tokens=n, seed=i) for i in range(args.batch)])
        assert all(len(c.token_ids) == n for c in outs)

    def submitted():
        futs = [engine.submit(p, SamplingParams(max_tokens=n, seed=i)) for i, p in enumerate(prompts)]
        assert all(len(f.result().token_ids) == n for f in futs)

    paths = {"raw vLLM (no logprobs)": lambda: raw(None), "raw vLLM (logprobs=0)": lambda: raw(0),
             "VLLMEngine.generate": wrapped, "VLLMEngine.submit": submitted}  # fmt: skip
    raw(0)  # warm-up
    best = dict.fromkeys(paths, float("inf"))
    for _ in range(args.repeats):
        for name, fn in paths.items():
            t = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t)
    base = args.batch * n / best["raw vLLM (no logprobs)"]
    print(f"{'path':<26} {'tok/s':>8} {'vs raw':>7}")
    for name, t in best.items():
        tps = args.batch * n / t
        print(f"{name:<26} {tps:>8.0f} {tps / base:>6.2f}×")


if __name__ == "__main__":
    main()
