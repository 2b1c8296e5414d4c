"""``trainer.bf16: auto``: bf16 compute in the trainer only where it is measured to pay and the
numbers RL reads stay honest; else float32, and the run says why.

bf16 is taken when every one of these holds, checked in this order (the first that fails is the
reason printed):

1. the device computes bf16 natively: CUDA with bf16 support, or a CPU with bf16 instructions
   (``avx512_bf16``, ``amx_bf16``, Arm's ``bf16``); elsewhere torch emulates it many times slower;
2. ``algorithm.is_correction: tis``: bf16 moves the rollout/trainer gap from 1e-5 to about 0.03 nats
   a token (docs/performance.md), a policy lag that only the importance correction corrects;
3. the model is above hidden 256: a small model's step is per-call overhead, not products;
4. on the CPU, a linear layer's three products at the model's MLP shape (the forward and both
   gradients) run at least ``FASTER_BY`` times faster in bf16 (measured once per machine and kept,
   ``engines/probe_cache.py``); on CUDA this is not measured;
5. the gap itself, measured on the base model: the largest |log p fp32 − log p bf16| over a fixed
   probe text stays inside ``rollout.sync.probe_atol`` (or its 16-bit default), the bound the weight
   sync's probe holds the engine and the trainer to (kept per model fingerprint and machine).

The resolved value replaces ``auto`` for the run (``resolved``); the saved config keeps ``auto``, so a
resume decides again, from the kept measurements, the same way on the same machine."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from agentrl.config import Config
from agentrl.engines import probe_cache
from agentrl.sync.weight_sync import ATOL_16BIT

BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
SMALL_HIDDEN = 256
FASTER_BY = 1.3
"""bf16 is taken on the CPU when a layer's three products run at least this many times faster."""
PROBE_ROWS = 2048
PROBE_TEXT = (
    "Compute 17 * 23 step by step. First, 17 * 20 = 340. Then 17 * 3 = 51. Adding them, 340 + 51 = 391. "
    "So the answer is 391. Now check it another way: 23 * 17 = 23 * 10 + 23 * 7 = 230 + 161 = 391."
)


class Choice(NamedTuple):
    on: bool
    why: str


def resolved(cfg: Config, device: torch.device, log: Callable[[str], None]) -> Config:
    """``cfg`` with ``trainer.bf16: auto`` replaced by the choice (``choose``), which is logged; any
    other value is returned as it is."""
    if cfg.trainer.bf16 != "auto":
        return cfg
    choice = choose(cfg, device)
    log(f"trainer.bf16: auto -> {'bf16' if choice.on else 'float32'} ({choice.why})")
    return dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, bf16=choice.on))


def choose(cfg: Config, device: torch.device, flags: set[str] | None = None) -> Choice:
    """The module docstring's rules, in order."""
    if (why := static_refusal(cfg, device, flags)) is not None:
        return Choice(False, why)
    from agentrl.assembly.components import meta_model
    from agentrl.models import resolve_model_path
    from agentrl.training.lora import identity

    path = resolve_model_path(cfg.model.path)
    config: Any = meta_model(path, "float32").config
    hidden, inter = int(config.hidden_size), int(config.intermediate_size)
    if hidden <= SMALL_HIDDEN:
        return Choice(
            False, f"a small model (hidden {hidden} <= {SMALL_HIDDEN}): its step is per-call overhead"
        )
    speed = ""
    if device.type == "cpu":
        times, where = product_times(hidden, inter)
        ratio = times["fp32_s"] / max(times["bf16_s"], 1e-12)
        speed = f"a layer's products {ratio:.2f}x faster in bf16, {where}"
        if ratio < FASTER_BY:
            return Choice(False, f"{speed}: below {FASTER_BY}x")
    atol = cfg.rollout.sync.probe_atol if cfg.rollout.sync.probe_atol is not None else ATOL_16BIT
    key = f"bf16 gap {identity(path)['fingerprint']} on {device.type}"
    gap, _ = probe_cache.measured("bf16_gap", key, lambda: {"max": logprob_gap(path, device)})
    said = f"the log-prob gap to float32 on the model {gap['max']:.3f} (rollout.sync.probe_atol {atol:g})"
    if gap["max"] > atol:
        return Choice(False, f"{said}: outside it")
    return Choice(True, f"{speed + '; ' if speed else ''}{said}; algorithm.is_correction=tis")


def static_refusal(cfg: Config, device: torch.device, flags: set[str] | None = None) -> str | None:
    """Rules 1 and 2: why bf16 is refused without measuring anything, or None."""
    if device.type == "cuda":
        if not torch.cuda.is_bf16_supported():
            return "this GPU has no native bf16"
    elif device.type == "cpu":
        have = (probe_cache.cpu_flags() if flags is None else flags) & BF16_FLAGS
        if not have:
            return (
                "this CPU has no bf16 instructions (avx512_bf16, amx_bf16 or bf16): torch would emulate them"
            )
    else:
        return f"not measured on {device.type}"
    if cfg.algorithm.is_correction != "tis":
        return (
            f"algorithm.is_correction={cfg.algorithm.is_correction}: bf16 would move the rollout/trainer gap "
            "from 1e-5 to about 0.03 a token with nothing to correct it; set it to tis to allow bf16"
        )
    return None


def product_times(hidden: int, inter: int, rows: int = PROBE_ROWS) -> tuple[dict[str, Any], str]:
    """Seconds for a linear layer's forward x·Wᵀ and its two gradient products at [rows, hidden] ->
    [rows, inter] in float32 and in bf16 (best of 3, interleaved), and where they came from."""

    def measure() -> dict[str, Any]:
        out = {}
        args = {
            dt: [torch.randn(*s).to(dt) for s in ((rows, hidden), (inter, hidden), (rows, inter))]
            for dt in (torch.float32, torch.bfloat16)
        }

        def run(dt: torch.dtype) -> float:
            x, w, g = args[dt]
            t0 = time.perf_counter()
            x @ w.t(), g @ w, g.t() @ x
            return time.perf_counter() - t0

        best = {torch.float32: float("inf"), torch.bfloat16: float("inf")}
        for dt in best:
            run(dt)  # warm: kernels picked, buffers allocated
        for _ in range(3):
            for dt in best:
                best[dt] = min(best[dt], run(dt))
        out["fp32_s"], out["bf16_s"] = best[torch.float32], best[torch.bfloat16]
        return out

    value, path = probe_cache.measured("bf16_products", f"rows {rows} hidden {hidden} inter {inter}", measure)
    return value, (f"measured {value['measured']}, kept in {path}" if path else "measured now")


def logprob_gap(path: str, device: torch.device) -> float:
    """The largest |log p fp32 − log p bf16 autocast| of the next tokens of ``PROBE_TEXT`` under the
    model at ``path`` (float32 weights, as the trainer holds them)."""
    from agentrl.models import load_policy

    model, tokenizer = load_policy(path, dtype="float32", device=str(device))
    ids = torch.tensor([tokenizer(PROBE_TEXT)["input_ids"]], device=device)
    out = []
    with torch.no_grad():
        for bf16 in (False, True):
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                logits = model(ids).logits[0, :-1].float()
            out.append(torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0])
    return float((out[0] - out[1]).abs().max())
