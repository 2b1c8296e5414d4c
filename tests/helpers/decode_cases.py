"""Requests that exercise every branch of the HF engine's decode loops, and how two engines' completions
are compared (tests/engines/test_decode_loop.py, test_decode_graphs.py)."""

from __future__ import annotations

from agentrl.engines.base import SamplingParams

TEXTS = [
    "1",
    "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n",
    "def f(x):\n    return",
    "Alice has 12 apples. She buys 7 more at the store and gives 3 to Bob. How many apples?",
]


def mixed_requests(tok) -> tuple[list[list[int]], list[SamplingParams]]:
    """Prompts of four lengths, each twice (the prefill shares them), with rows that finish at
    different steps (max_tokens 3..23, so the batch is compacted), a greedy row, top-k and top-p rows
    and stop ids."""
    prompts = [tok.encode(t, add_special_tokens=False) for t in TEXTS] * 2
    params = [
        SamplingParams(
            max_tokens=3 + 5 * (i % 5),
            temperature=0.0 if i == 5 else 0.8 + 0.1 * (i % 3),
            top_k=20 if i % 4 == 1 else 0,
            top_p=0.9 if i % 4 == 2 else 1.0,
            stop_token_ids=(7, 11) if i % 3 == 0 else (),
            seed=21 + i,
        )
        for i in range(len(prompts))
    ]
    return prompts, params


def same(a, b) -> None:
    """The same tokens and ends; log-probs within 1e-5, relative above 1 in size: float32 rounding
    differs between the loops (with 2 threads a log-prob of -6.5048 came out 1.05e-5 apart, 22 ulps;
    with 1, 6e-6)."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.token_ids == y.token_ids
        assert (x.finish_reason, x.stop_reason) == (y.finish_reason, y.stop_reason)
        assert all(abs(p - q) < 1e-5 * max(1.0, abs(q)) for p, q in zip(x.logprobs, y.logprobs))
