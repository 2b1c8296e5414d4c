"""Which decode step is faster on this machine for a model above the lean step's small-model bound:
the lean step (``lean_decode.py``, products through MKL) or the transformers forward, timed on the
model itself at ``ROWS`` rows (the HF engine's ``lean_decode=None`` on the CPU in float32).

The lean step packs its weights once per weight version (``lean_weights.PackedWeights``; with MKL
the packing does not depend on the row count), so once per RL step, whose turns decode together
hundreds of steps (``rollout.max_tokens_per_turn`` is 256 by default). The lean step is taken when
it is at least ``FASTER_BY`` times faster a step; its packing is measured and printed but does not
decide, as it varies several-fold between processes while the lean step, packing included, still
made the RL step's decode faster where it measured faster (docs/performance.md).
Measured once per CPU model, torch version, thread count and model shape, and kept
(``probe_cache``): a few seconds for SmolLM2-135M the first time.

Why: on one CPU the lean step is the slower for SmolLM2, on another the faster (docs/performance.md):
a fixed rule is wrong on one of them."""

from __future__ import annotations

import time
from typing import Any

import torch

from agentrl.engines import probe_cache
from agentrl.engines.cpu_gemm import layer_shapes
from agentrl.models.cache_api import cache_kwargs

ROWS, PREFILL, STEPS, REPEATS = 32, 48, 4, 2
FASTER_BY = 1.1


def step_times(model: torch.nn.Module, rows: int = ROWS, steps: int = STEPS) -> dict[str, float]:
    """Seconds per decode step after a ``PREFILL``-token prefill: the lean step through MKL
    (``lean_s``), its packing (``pack_s``), and the transformers forward (``transformers_s``); the
    best of ``REPEATS`` rounds, each path in turn."""
    from transformers import DynamicCache

    from agentrl.engines.lean_decode import LeanDecoder

    config: Any = model.config
    vocab = int(config.vocab_size)
    ids = torch.randint(5, max(vocab - 1, 6), (rows, PREFILL), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    best = {"lean_s": float("inf"), "pack_s": float("inf"), "transformers_s": float("inf")}
    with torch.inference_mode():
        for _ in range(REPEATS):
            for path in ("lean", "transformers"):
                cache = DynamicCache(config=config)
                kwargs: Any = cache_kwargs(model, cache)
                model(input_ids=ids, attention_mask=mask, **kwargs, use_cache=True, logits_to_keep=1)
                tokens, pos = ids[:, -1].clone(), torch.full((rows,), PREFILL)
                t0 = time.perf_counter()
                if path == "lean":
                    dec = LeanDecoder.from_cache(model, cache, mask, steps, "mkl")
                    best["pack_s"] = min(best["pack_s"], time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    for s in range(steps):
                        dec.step(tokens, pos + s, PREFILL + 1 + s)
                else:
                    m = mask
                    for s in range(steps):
                        m = torch.cat([m, m.new_ones((rows, 1))], dim=1)
                        model(
                            input_ids=tokens[:, None],
                            attention_mask=m,
                            position_ids=(pos + s)[:, None],
                            **kwargs,
                            use_cache=True,
                        )
                key = f"{path}_s"
                best[key] = min(best[key], (time.perf_counter() - t0) / steps)
    return best


def lean_is_faster(model: torch.nn.Module) -> tuple[bool, str]:
    """Whether the lean step (MKL) should decode ``model`` here (module docstring), and why."""
    cfg: Any = model.config
    key = f"decode rows {ROWS} layers {cfg.num_hidden_layers} vocab {cfg.vocab_size} shapes {list(layer_shapes(model) or ())}"
    times, path = probe_cache.measured("decode_path", key, lambda: step_times(model))
    lean, tr, pack = times["lean_s"], times["transformers_s"], times["pack_s"]
    faster = tr >= FASTER_BY * lean
    where = f"measured {times['measured']}, kept in {path}" if path else "measured now"
    why = (
        f"auto: a decode step at {ROWS} rows takes {lean * 1e3:.1f} ms lean and {tr * 1e3:.1f} ms through "
        f"transformers (lean from {FASTER_BY}x), its packing once per weight version {pack * 1e3:.0f} ms, {where}"
    )
    return faster, why
