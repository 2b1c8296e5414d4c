"""The decode loop's device side: a batch in fixed-shape tensors, and one step that never waits on the
host.

``DecodeState`` holds everything a step reads and writes, in tensors whose shapes stay fixed for the
batch: the next token's logits, each row's rotary position, the step index (a device tensor), the
per-row uniforms, sampling parameters, stop ids and token limits, the tokens and log-probs sampled
so far (``[B, steps]``, written at the step's column) and a finished flag per row. ``decode_step``
samples a token for every row (``sample_next``, by inverse CDF on the row's own uniform), writes it
and its log-probability, marks rows that hit a stop id or their ``max_tokens``, runs the lean step
(``lean_decode.py``) on the tokens and advances positions and step: no ``.item()``, ``.tolist()``,
``bool(tensor)`` or data-dependent shape, so ``torch.compile(fullgraph=True)`` traces it whole
(tested) and on CUDA ``StepGraph`` replays it as one CUDA graph (kept across batches by
``decode_graphs.py``).

The host (``decode_batch``) reads back the new tokens every ``poll_every`` steps: it appends them
to each request up to its end (a stop id, a stop string, ``max_tokens``: tokens sampled past a row's
end are discarded there, exactly), and drops finished rows from the batch (``keep``) once a quarter
are done. Finished rows keep being sampled until then; what they sample is never returned.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import torch
from torch import Tensor


def sample_next(
    logits: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    u: Tensor,
    *,
    filtered: bool | None = None,
    plain: bool = False,
) -> tuple[Tensor, Tensor]:
    """One token per row and its log-probability under the sampling distribution.

    logits (B, V) float32; temperature, top_p (B,) float; top_k (B,) long (0 = off); u (B,) uniforms in
    [0, 1). Order: temperature, then top-k, then top-p on the renormalised top-k distribution (the
    order transformers' warpers and vLLM use). Top-p keeps the smallest most-likely prefix whose mass
    reaches ``top_p``. Sampling is by inverse CDF on ``u`` so each row's draw depends only on its own
    uniform, not on the batch.

    Hints a caller may pass once per batch to skip per-step checks: ``filtered`` (whether any row
    uses top-k or top-p; None = find out, which reads the device) and ``plain`` (every row has
    temperature exactly 1, no top-k, no top-p)."""
    vocab = logits.shape[-1]
    order, greedy = None, None
    scaled = logits  # plain: temperature 1, nothing filtered, no greedy row
    if not plain:
        greedy = temperature <= 0
        scaled = logits / torch.where(greedy, torch.ones_like(temperature), temperature)[:, None]
        if filtered is None:
            filtered = bool((top_k > 0).any()) or bool((top_p < 1).any())
    if filtered and not plain:
        scaled, order = scaled.sort(dim=-1, descending=True)  # (B, V), most likely first
        ranks = torch.arange(vocab, device=logits.device)[None, :]
        k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab))
        scaled = scaled.masked_fill(ranks >= k[:, None], float("-inf"))
        probs = scaled.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # mass of strictly more likely tokens
        drop = (mass_before >= top_p[:, None]) & (top_p < 1)[:, None]
        scaled = scaled.masked_fill(drop, float("-inf"))
    logp = scaled.log_softmax(dim=-1)  # (B, V)
    cdf = logp.exp().cumsum(dim=-1)
    total = cdf[:, -1]
    # u * total < total strictly, so the chosen index always has a positive probability increment.
    target = torch.minimum(u.to(cdf.dtype) * total, torch.nextafter(total, torch.zeros_like(total)))
    idx = torch.searchsorted(cdf, target[:, None], right=True).clamp(max=vocab - 1)  # (B, 1)
    token_lp = logp.gather(1, idx).squeeze(1)
    tokens = (order.gather(1, idx) if order is not None else idx).squeeze(1)
    if greedy is not None:
        tokens = torch.where(greedy, logits.argmax(dim=-1), tokens)
        token_lp = torch.where(greedy, torch.zeros_like(token_lp), token_lp)
    return tokens, token_lp


@dataclass
class DecodeState:
    """One batch's decode state; every tensor's first dimension is the batch's rows (module
    docstring). ``filtered`` and ``plain`` are ``sample_next``'s hints, fixed for the batch."""

    logits: Tensor  # [B, V] float32: the next token's logits
    positions: Tensor  # [B] long: the next token's rotary position
    step: Tensor  # [1] long: the step being sampled (a column of the outputs and uniforms)
    uniforms: Tensor  # [B, steps] float64
    temperature: Tensor  # [B]
    top_k: Tensor  # [B] long
    top_p: Tensor  # [B]
    stop_ids: Tensor  # [B, S] long, -1 where a row has fewer stop ids
    limit: Tensor  # [B] long: max_tokens
    tokens: Tensor  # [B, steps] long: sampled so far
    logprobs: Tensor  # [B, steps] float32
    finished: Tensor  # [B] bool: hit a stop id or max_tokens (stop strings are the host's)
    filtered: bool = False
    plain: bool = False

    @classmethod
    def start(
        cls,
        logits: Tensor,
        positions: Tensor,
        uniforms: Tensor,
        params: Sequence[Any],
        filtered: bool,
        plain: bool,
    ) -> DecodeState:
        """The state after the prefill: ``params`` are the rows' ``SamplingParams``."""
        device, (B, steps) = logits.device, uniforms.shape
        width = max([len(p.stop_token_ids) for p in params] + [1])
        stops = torch.full((B, width), -1, dtype=torch.long)
        for i, p in enumerate(params):
            stops[i, : len(p.stop_token_ids)] = torch.tensor(p.stop_token_ids, dtype=torch.long)

        def per_row(values: list, dtype: torch.dtype) -> Tensor:
            return torch.tensor(values, dtype=dtype, device=device)

        return cls(
            logits=logits.contiguous(),
            positions=positions.clone(),
            step=torch.zeros(1, dtype=torch.long, device=device),
            uniforms=uniforms,
            temperature=per_row([float(p.temperature) for p in params], torch.float32),
            top_k=per_row([int(p.top_k) for p in params], torch.long),
            top_p=per_row([float(p.top_p) for p in params], torch.float32),
            stop_ids=stops.to(device),
            limit=per_row([int(p.max_tokens) for p in params], torch.long),
            tokens=torch.zeros((B, steps), dtype=torch.long, device=device),
            logprobs=torch.zeros((B, steps), dtype=torch.float32, device=device),
            finished=torch.zeros(B, dtype=torch.bool, device=device),
            filtered=filtered,
            plain=plain,
        )

    def first_rows(self, rows: int, filtered: bool, plain: bool) -> DecodeState:
        """A state over the first ``rows`` rows of this one's tensors (the same memory, the step
        counter shared), with the given ``sample_next`` hints."""
        named = ((f.name, getattr(self, f.name)) for f in fields(self) if f.name != "step")
        views = {name: t[:rows] for name, t in named if isinstance(t, Tensor)}
        return replace(self, **views, filtered=filtered, plain=plain)

    def keep(self, rows: Tensor) -> None:
        """Keep only ``rows`` (indices into the current rows)."""
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Tensor) and f.name != "step":
                setattr(self, f.name, value.index_select(0, rows))


def decode_step(state: DecodeState, lean: Any, span: int | None = None) -> None:
    """Sample the step's token of every row, record it, mark finished rows, and run the lean step for
    the next logits: device work only (module docstring). ``span``: the attention's key columns
    (``LeanDecoder.step``; None, the whole capacity, for a CUDA graph)."""
    u = state.uniforms.index_select(1, state.step).squeeze(1)  # [B]
    tokens, lps = sample_next(
        state.logits,
        state.temperature,
        state.top_k,
        state.top_p,
        u,
        filtered=state.filtered,
        plain=state.plain,
    )
    state.tokens.index_copy_(1, state.step, tokens[:, None])
    state.logprobs.index_copy_(1, state.step, lps[:, None].float())
    hit = (tokens[:, None] == state.stop_ids).any(dim=1) | (state.step + 1 >= state.limit)
    state.finished.logical_or_(hit)
    state.logits.copy_(lean.step(tokens, state.positions, span))
    state.positions.add_(1)
    state.step.add_(1)


class StepGraph:
    """A CUDA graph of ``fn``, replayed for every step after the first.

    ``fn`` must read and write only tensors that exist before the capture and take no host decision
    (``decode_step`` on a ``DecodeState`` and its ``LeanDecoder``). The first call is the step itself,
    run eagerly on a side stream (the warm-up PyTorch asks for before a capture: cuBLAS workspaces
    and lazily built kernels); the same call then records ``fn`` once more without running it, and
    every later call replays that recording. ``pool``: a memory pool shared with other graphs
    (``torch.cuda.graph_pool_handle()``), safe when, as here, no tensor allocated inside a step
    outlives it; once every graph of a pool is freed, its token must not be used again (PyTorch's
    allocator asserts). Captures in ``thread_local`` mode, so another thread's CUDA calls during it neither
    fail nor invalidate it. ``decode_graphs.GraphPool`` keeps one per batch bucket, over tensors that
    keep their addresses from batch to batch. Its agreement with the eager loop and its step times
    on a GPU: docs/performance.md#on-one-gpu-smollm2-135m-instruct-on-an-nvidia-h200-bf16. A graph keeps
    the matmul settings of its capture (TF32, ``set_float32_matmul_precision``)."""

    def __init__(self, fn: Callable[[], None], device: torch.device, pool: Any = None) -> None:
        self.fn, self.device, self.pool = fn, device, pool
        self.graph: Any = None

    def __call__(self) -> None:
        if self.graph is not None:
            self.graph.replay()
            return
        with torch.cuda.device(self.device):  # the capture's stream is the current device's
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                self.fn()  # the warm-up is this step, for real
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                self.fn()  # recorded, not run
        self.graph = graph


def decode_batch(
    rows: list[Any],
    state: DecodeState,
    lean: Any,
    steps: int,
    poll_every: int,
    check: Callable[[str], None],
) -> None:
    """The host's loop over a prefilled batch (``HFEngine._run_batch`` without CUDA graphs; with them,
    ``decode_graphs.GraphPool.decode``): ``steps`` decode steps, each attending to the key columns in
    use, the new tokens read back every ``poll_every`` steps and appended to their requests
    (``rows``, whose ``add(token, logprob)`` says when a request is done) up to each one's end;
    finished rows dropped at a poll once a quarter are done. ``check(where)`` raises when the
    caller's deadline has passed."""
    rows, seen = list(rows), 0
    for step in range(steps):
        check(f"at decode step {step}")
        decode_step(state, lean, lean.length + step + 1)
        if step + 1 - seen < poll_every and step + 1 < steps:
            continue
        done = take(rows, state, seen, step + 1)
        seen = step + 1
        if all(done):
            return
        if 4 * sum(done) >= len(rows):  # compact: drop finished rows everywhere
            keep = [i for i, d in enumerate(done) if not d]
            index = torch.tensor(keep, device=state.logits.device)
            state.keep(index)
            lean.keep(index)
            rows = [rows[i] for i in keep]


def take(rows: list[Any], state: DecodeState, start: int, end: int) -> list[bool]:
    """Append the tokens of steps ``start..end`` to each row's request up to its end (one read
    back); whether each row is done. ``state`` may hold more rows than ``rows`` (a graph bucket's
    padding, ``decode_graphs.py``): only the first ``len(rows)`` are read."""
    tokens = state.tokens[: len(rows), start:end].tolist()
    logprobs = state.logprobs[: len(rows), start:end].tolist()
    for r, toks, lps in zip(rows, tokens, logprobs):
        for t, lp in zip(toks, lps):
            if r.finish is not None or r.add(t, lp):
                break
    return [r.finish is not None for r in rows]
