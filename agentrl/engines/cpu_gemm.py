"""The lean decode step's matrix products on the CPU: through MKL (``torch.addmm``, what torch calls
for float32 on x86) or through oneDNN with each weight packed once per batch, whichever this machine
runs faster.

Why: MKL chooses its float32 kernels by the CPU's vendor, oneDNN by its instruction set, so which
one is faster depends on the machine (docs/performance.md#the-decode-step-on-the-cpu-against-its-roofline). So MKL stays the
default (``rollout.cpu_gemm: mkl``: the numbers every earlier run produced), oneDNN is the user's to
choose, and ``auto`` measures the choice on the machine (``onednn_is_faster``).

oneDNN is reached through torch's internal ops ``torch.ops.mkldnn._reorder_linear_weight`` and
``_linear_pointwise`` (what torch.compile's CPU freezing emits; there is no public API for a float32
product through oneDNN). Where they are missing, ``onednn_ops`` returns None and MKL is used, and
the engine records which ran (``HFEngine.cpu_gemm``). Results differ from MKL's by float32
rounding (about 1e-6 relative: a different summation order)."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import cache
from typing import Any, NamedTuple

import torch
from torch import Tensor

from agentrl.engines import probe_cache

CHOICES = ("auto", "mkl", "onednn")
FASTER_BY = 1.5
"""oneDNN is chosen when one layer's products and the head run at least this many times faster
through it: a margin wide enough that the noise of one short measurement does not flip the choice
between two runs on one machine (the ratios measured: docs/performance.md#the-decode-step-on-the-cpu-against-its-roofline)."""
MEASURED_ROWS, HEAD_COLUMNS = 32, 8192
"""The measurement's rows (an RL batch of 4 x 8), and the head's columns it times (a slice of the
vocabulary: the same kernel, a fraction of the time)."""


def onednn_ops() -> tuple[Callable[..., Tensor], Callable[..., Tensor]] | None:
    """torch's oneDNN ops for a packed linear layer (``_reorder_linear_weight``, ``_linear_pointwise``),
    or None where this build has none."""
    if not torch.backends.mkldnn.is_available():
        return None
    try:
        return torch.ops.mkldnn._reorder_linear_weight, torch.ops.mkldnn._linear_pointwise
    except (AttributeError, RuntimeError):
        return None


class Gemm:
    """``x @ w_t (+ bias)`` for a weight kept as [in, out] (the lean step's layout), into a given
    output or added into a given tensor. With ``rows`` set (oneDNN) the weight is packed once, for
    batches of about ``rows`` rows; else (MKL) ``torch.addmm`` reads ``w_t`` as it is."""

    def __init__(self, w_t: Tensor, bias: Tensor | None = None, rows: int | None = None) -> None:
        self.bias = bias
        ops = onednn_ops() if rows is not None else None
        if rows is not None and ops is None:
            raise RuntimeError(
                "this torch build has no oneDNN linear ops (torch.ops.mkldnn._linear_pointwise)"
            )
        self._linear = ops[1] if ops is not None else None
        self.w_t = None if ops is not None else w_t
        self.packed = ops[0](w_t.t().contiguous(), rows) if ops is not None else None

    def copy_from(self, other: Gemm) -> None:
        """Take ``other``'s values into this one's tensors, in place (the same shapes and library:
        ``lean_weights.PackedWeights.refresh``)."""
        for mine, theirs in ((self.w_t, other.w_t), (self.packed, other.packed), (self.bias, other.bias)):
            if mine is not None:
                assert theirs is not None
                mine.copy_(theirs)

    def __call__(self, x: Tensor) -> Tensor:
        if self._linear is not None:
            return self._linear(x, self.packed, self.bias, "none", [], "")
        assert self.w_t is not None
        return torch.mm(x, self.w_t) if self.bias is None else torch.addmm(self.bias, x, self.w_t)

    def into(self, x: Tensor, out: Tensor) -> Tensor:
        """``out = x @ w_t + bias``."""
        if self._linear is not None:
            return out.copy_(self(x))
        assert self.w_t is not None
        if self.bias is None:
            return torch.mm(x, self.w_t, out=out)
        return torch.addmm(self.bias, x, self.w_t, out=out)

    def add_into(self, h: Tensor, x: Tensor) -> Tensor:
        """``h += x @ w_t + bias``, in place."""
        if self._linear is not None:
            return h.add_(self(x))
        assert self.w_t is not None
        h.addmm_(x, self.w_t)
        return h if self.bias is None else h.add_(self.bias)


def best_of(fn: Callable[[], Any], repeats: int) -> float:
    """The fastest of ``repeats`` calls of ``fn``, in seconds."""
    out = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out = min(out, time.perf_counter() - t0)
    return out


class Pick(NamedTuple):
    """The library an engine's products go through (None: the device's own) and why."""

    library: str | None
    why: str


@cache
def timed(
    shapes: tuple[tuple[int, int], ...], rows: int = MEASURED_ROWS, threads: int = 0
) -> tuple[dict[str, Any], str]:
    """Seconds for ``rows`` rows through the [in, out] products ``shapes`` (one decoder layer's and a
    slice of the head's) through MKL (``mkl_s``) and through packed oneDNN weights (``onednn_s``) on
    this machine, float32, interleaved, best of 3, and where they came from. Measured once per CPU
    model, torch version, thread count (``threads``: part of the key) and shape set, then kept in
    ``probe_cache`` (its cost: docs/models-and-engines.md#engines-agentrlengines)."""

    def measure() -> dict[str, Any]:
        weights = [torch.full((i, o), 0.01) for i, o in shapes]  # the values do not change the time
        xs = [torch.full((rows, i), 0.5) for i, _ in shapes]
        blas = [Gemm(w) for w in weights]
        dnn = [Gemm(w, rows=rows) for w in weights]

        def run(gemms: list[Gemm]) -> None:
            for gemm, x in zip(gemms, xs):
                gemm(x)

        run(blas)  # warm: first calls allocate and pick kernels
        run(dnn)
        t_blas = t_dnn = float("inf")
        for _ in range(3):
            t_blas = min(t_blas, best_of(lambda: run(blas), 1))
            t_dnn = min(t_dnn, best_of(lambda: run(dnn), 1))
        return {"mkl_s": t_blas, "onednn_s": t_dnn}

    key = f"cpu_gemm rows {rows} shapes {list(shapes)}"
    value, path = probe_cache.measured("cpu_gemm", key, measure)
    where = f"measured {value['measured']}, kept in {path}" if path else "measured now"
    return value, where


def onednn_is_faster(
    shapes: tuple[tuple[int, int], ...], rows: int = MEASURED_ROWS, threads: int = 0
) -> bool:
    """Whether ``timed``'s oneDNN products run at least ``FASTER_BY`` times faster than MKL's."""
    if onednn_ops() is None:
        return False
    times, _ = timed(shapes, rows, threads)
    return bool(times["mkl_s"] >= FASTER_BY * times["onednn_s"])


def layer_shapes(model: torch.nn.Module) -> tuple[tuple[int, int], ...] | None:
    """One decoder layer's products (fused QKV, output, fused gate-up, down) and a slice of the
    head, as [in, out], from the model's config; None without one."""
    cfg: Any = getattr(model, "config", None)
    hidden = int(getattr(cfg, "hidden_size", 0) or 0)
    if not hidden:
        return None
    heads, kv = (
        int(cfg.num_attention_heads),
        int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads),
    )
    head_dim = int(getattr(cfg, "head_dim", None) or hidden // heads)
    q, k = heads * head_dim, kv * head_dim
    inter, vocab = int(cfg.intermediate_size), int(cfg.vocab_size)
    head = (hidden, min(vocab, HEAD_COLUMNS))
    return ((hidden, 2 * q + 3 * k), (q, hidden), (hidden, 2 * inter), (inter, hidden), head)


def resolve(choice: str, model: torch.nn.Module, device: torch.device) -> Pick:
    """The library the lean step's products go through: None off the CPU or outside float32 (the
    device's own), else ``choice`` ("mkl", "onednn"), with "auto" measured (``timed``) on the model's
    own shapes; with the reason the run prints."""
    if choice not in CHOICES:
        raise ValueError(f"cpu_gemm={choice!r}: choose one of {', '.join(CHOICES)}")
    dtype = next(model.parameters()).dtype
    if device.type != "cpu" or dtype != torch.float32:
        if choice == "onednn":  # asked for, and it cannot apply: said, not ignored
            raise ValueError(
                f"cpu_gemm='onednn' applies to a float32 engine on the CPU; this one is {dtype} on {device.type} "
                f"(use mkl or auto there)"
            )
        return Pick(None, f"the engine computes in {dtype} on {device.type}: its own products")
    if choice != "auto":
        if choice == "onednn" and onednn_ops() is None:
            raise RuntimeError("cpu_gemm='onednn': this torch build has no oneDNN linear ops")
        return Pick(choice, "set in rollout.cpu_gemm")
    shapes = layer_shapes(model)
    if shapes is None:
        return Pick("mkl", "auto: the model has no config to measure its products by; MKL kept")
    if onednn_ops() is None:
        return Pick("mkl", "auto: this torch build has no oneDNN linear ops; MKL kept")
    times, where = timed(shapes, threads=torch.get_num_threads())
    ratio = times["mkl_s"] / max(times["onednn_s"], 1e-12)
    pick = "onednn" if ratio >= FASTER_BY else "mkl"
    return Pick(
        pick,
        f"auto: one layer's products and a head slice at {MEASURED_ROWS} rows take "
        f"{times['mkl_s'] * 1e3:.2f} ms through MKL and {times['onednn_s'] * 1e3:.2f} ms through oneDNN "
        f"({ratio:.2f}x; oneDNN from {FASTER_BY}x), {where}",
    )
