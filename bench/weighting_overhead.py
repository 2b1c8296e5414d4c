"""Token-weighting overhead against the loss computation and a training step of the 15 M tiny model.

What is compared (all on this CPU, torch threads as set by --threads):
- weighting: each method in ``WEIGHTINGS`` called once on a whole batch of 64 sequences × 1024
  tokens (detached logp_old, entropy, advantages, a mask with random response lengths), as the
  trainer does once per step. Median of --repeats calls after one warm-up call.
- loss: for the same 64 × 1024 batch and a 32k vocabulary, ``token_logprobs_and_entropy`` on the
  model's logits plus ``policy_loss``, forward and backward (the loss computation proper, no model).
- step: one training step of a Qwen2 model shaped like the 15 M tiny preset (hidden 384, 7 layers,
  6 heads / 2 KV heads, MLP 1472) but with a 32k vocabulary (39.2 M parameters: the untied 32k
  embedding and head add 24.6 M to the 14.6 M body), bf16 autocast: forward, token statistics, loss, backward over 64 × 1024
  tokens as micro-batches of --micro sequences, then AdamW. ``--model-vocab 1024`` measures the
  15 M preset with its own vocabulary instead (15.4 M parameters; a cheaper step, so a stricter
  denominator: the weighting's cost does not depend on the vocabulary). To keep the run short, --measure
  micro-batches are timed (after one warm-up) and the step time is extrapolated as
  (64 / micro) × median micro-batch time + the optimizer step. Gradient accumulation runs
  micro-batches one after another, so the extrapolation is linear by construction.
The "loss" figure is measured the same way (per micro-batch, extrapolated to 64 sequences).

Usage: .venv/bin/python bench/weighting_overhead.py [--threads 2] [--micro 4] [--measure 2]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from agentrl.algorithms import (
    WEIGHTINGS,
    StareController,
    WeightingInputs,
    compute_weights,
    loss_normaliser,
    policy_loss,
    token_logprobs_and_entropy,
)

B, T, V = 64, 1024, 32000


def median_time(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def weighting_inputs(seed: int = 0) -> WeightingInputs:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(T // 4, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None] < lengths[:, None]
    logp_old = -torch.distributions.Exponential(2.0).sample((B, T))
    entropy = torch.distributions.Exponential(3.0).sample((B, T))
    adv = torch.randn(B, generator=g)
    return WeightingInputs.build(logp_old, entropy, adv, mask)


WEIGHTING_PARAMS = {
    "stare": {"variant": "C2", "target_entropy": 10.0},  # gate on, so the weights are written
    "stare_micro": {"variant": "C2", "target_entropy": 10.0, "scope": "micro", "micro_batch_size": 4},
    "stare_pi": {"variant": "C2", "target_entropy": 10.0, "controller": StareController(law="pi")},
}


def time_weightings(repeats: int) -> dict[str, float]:
    inputs = weighting_inputs()
    out = {}
    for name in [*WEIGHTINGS, "stare_micro", "stare_pi"]:
        method = "stare" if name.startswith("stare") else name
        params = WEIGHTING_PARAMS.get(name, {})
        out[name] = median_time(lambda m=method, p=params: compute_weights(m, inputs, **p), repeats)
    return out


def tiny_qwen2(vocab: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=vocab,
        hidden_size=384,
        intermediate_size=1472,
        num_hidden_layers=7,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        use_sliding_window=False,
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg)


def loss_micro(logits: torch.Tensor, ids: torch.Tensor, inputs: WeightingInputs, rows: slice, norm: float):
    """Token statistics + policy loss for one micro-batch (logits [b, T, V] with grad)."""
    logp, _entropy = token_logprobs_and_entropy(logits, ids)  # default chunk: 256 positions at 32k
    loss, _, _ = policy_loss(
        logp, inputs.logp_old[rows], inputs.advantages[rows], inputs.mask[rows], normaliser=norm
    )
    return loss


def time_loss_and_step(micro: int, measure: int, model_vocab: int) -> tuple[float, float, float, int]:
    inputs = weighting_inputs()
    norm = loss_normaliser(inputs.mask, "token-mean")
    rows = slice(0, micro)
    ids = torch.randint(model_vocab, (micro, T))
    g = torch.Generator().manual_seed(1)

    def loss_only():
        logits = torch.randn(micro, T, V, generator=g).requires_grad_()
        loss_micro(logits, torch.randint(V, (micro, T), generator=g), inputs, rows, norm).backward()

    loss_t = median_time(loss_only, measure)

    model = tiny_qwen2(model_vocab)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def micro_step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(input_ids=ids).logits
        loss_micro(logits, ids, inputs, rows, norm).backward()

    micro_t = median_time(micro_step, measure)
    opt_t = median_time(opt.step, 2)
    return loss_t * B / micro, micro_t * B / micro + opt_t, micro_t, n_params


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--measure", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--model-vocab", type=int, default=V, help="1024 = the 15 M preset's own vocabulary")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    w = time_weightings(args.repeats)
    loss_t, step_t, micro_t, n_params = time_loss_and_step(args.micro, args.measure, args.model_vocab)
    print(
        f"batch {B} x {T} tokens, loss vocab {V}, model vocab {args.model_vocab}, torch threads {args.threads}"
    )
    print(f"training step ({n_params / 1e6:.1f} M params, bf16 autocast, {B // args.micro} micro-batches of "
          f"{args.micro}, measured {micro_t:.2f} s each): {step_t:.1f} s")  # fmt: skip
    print(f"loss computation (token stats + policy loss, fwd+bwd, from logits): {loss_t:.2f} s")
    print("| weighting | time (ms) | % of loss computation | % of training step |\n|---|---|---|---|")
    for name, t in w.items():
        print(f"| {name} | {1e3 * t:.1f} | {100 * t / loss_t:.2f} % | {100 * t / step_t:.3f} % |")


if __name__ == "__main__":
    main()
