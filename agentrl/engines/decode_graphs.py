"""CUDA graphs of the decode step kept across batches and weight syncs: one per batch-size bucket.

A CUDA graph replays fixed device addresses, so a graph can outlive its batch only if the next batch's
tensors sit at the same addresses. Here they do: a batch's decode state (``DecodeState``) and KV
buffers (``LeanDecoder``) live in an arena (``_Arena``) made for batches of up to R rows and exactly C
key columns (the prompt width plus the new tokens, rounded up to a power of two, at least
``MIN_COLUMNS``). A batch of n rows runs in the bucket of B rows, the next power of two from n: the
first B rows of every arena tensor (views, so the same addresses in every batch), rows n..B padding
(sampled and never read; like every row they attend to the column each step writes, so their
numbers stay finite). Each bucket
keeps one graph for each pair of ``sample_next`` hints (filtered, plain), captured at its first step
(``StepGraph``) and replayed by every later batch. When enough rows finish that the live ones fit a
smaller bucket, they are moved to the front (one ``index_select`` per tensor) and the batch goes on
in that bucket's graph, captured once too.

Weights: the graphs read the engine's packed weights (``lean_weights.PackedWeights``), which the
engine refreshes in place when the model's weights change, and the model's embedding and head bias,
which ``load_weights`` writes in place: after a weight sync every graph is still valid. A change of
any parameter's address (the model moved or reassigned) or a new ``PackedWeights`` drops every arena
and graph (``GraphPool.decode`` checks at each batch).

Memory: an arena's KV buffers take R·C per-token KV bytes; ``MAX_ARENAS`` are kept (least recently
used first out), so a multi-turn run whose turns need two capacities does not capture again at each
turn; an arena replaced by a larger one of its columns is freed first, and the new one keeps at
least its rows and stop ids. ``HFEngine.batch_rows`` sizes graph batches by the bucketed rows and
columns. The intermediates of an arena's graphs (sampling's [B, V] scratch, the step's activations)
come from one memory pool of that arena's: no tensor allocated inside a step outlives it, so its
buckets' graphs may reuse each other's memory in any order. A new arena takes a new pool, never the
token of one whose graphs were all freed: PyTorch's allocator releases a pool when its last graph
goes and fails an internal assert (``use_count > 0``) at a capture into it (docs/performance.md#on-one-gpu-smollm2-135m-instruct-on-an-nvidia-h200-bf16).
``agentrl plan`` counts each arena's [R, V] float32 logits and its per-column sampling state
(draws, tokens, log-probs, attention bias) as a term of its own; ``batch_rows`` counts only the KV
buffers. Counted by neither: the pools (each the largest step's of its arena, about 10 [B, V]
float32 tensors with top-k or top-p rows, not measured) and the step workspaces (one per bucket and
one of R rows, a few thousand values a row).

Used only on CUDA, where ``HFEngine`` uses it with ``cuda_graphs`` on (the default); its GPU runs
and step times: docs/performance.md#on-one-gpu-smollm2-135m-instruct-on-an-nvidia-h200-bf16. On the CPU (tests/engines/test_decode_graphs.py)
it runs with a capture that calls the step eagerly and checks that every tensor it reads keeps its
address from capture to each replay, and a fake of the allocator's pools."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor

from agentrl.engines.decode_loop import DecodeState, StepGraph, decode_step, take
from agentrl.engines.lean_decode import LeanDecoder
from agentrl.engines.lean_weights import PackedWeights

MIN_COLUMNS = 128
"""The smallest arena's key columns: short batches share one capacity instead of a graph each."""
MAX_ARENAS = 2
"""Arenas kept at once (each with its buckets' graphs)."""
STOP_WIDTH = 4
"""Stop ids per row are kept in multiples of this (the arena's column count of ``stop_ids``)."""

Capture = Callable[[Callable[[], None], torch.device, Any], Callable[[], None]]
"""Makes a replayable step from a function of fixed tensors, its device and its arena's memory-pool
token (``StepGraph``; a test's recording fake)."""


def rows_bucket(n: int) -> int:
    """The bucket of a batch of ``n`` rows: the next power of two."""
    return 1 << max(0, n - 1).bit_length()


def columns_bucket(n: int) -> int:
    """The key columns of an arena for ``n`` needed: the next power of two, at least ``MIN_COLUMNS``."""
    return max(MIN_COLUMNS, rows_bucket(n))


@dataclass
class _Slot:
    state: DecodeState
    lean: LeanDecoder
    step: Callable[[], None]


class _Arena:
    """The tensors of every batch of up to ``rows`` rows and exactly ``columns`` key columns, and the
    graphs of its buckets (module docstring)."""

    def __init__(
        self, model: Any, packed: PackedWeights, rows: int, columns: int, stops: int, pool: Any
    ) -> None:
        self.rows, self.columns, self.stops = rows, columns, stops
        self.pool = pool  # the memory pool of this arena's graphs, its own (module docstring)
        _, n_kv, head_dim = packed.shape
        dt, dev = packed.embed.dtype, packed.embed.device
        keys = [torch.zeros(rows, n_kv, head_dim, columns, dtype=dt, device=dev) for _ in packed.layers]
        values = [torch.zeros(rows, n_kv, columns, head_dim, dtype=dt, device=dev) for _ in packed.layers]
        bias = torch.full((rows, n_kv, 1, columns), float("-inf"), dtype=dt, device=dev)
        self.lean = LeanDecoder(model, keys, values, bias, 0, columns + 1, packed=packed)
        vocab = model.lm_head.weight.shape[0]

        def zeros(*shape: int, dtype: torch.dtype) -> Tensor:
            return torch.zeros(shape, dtype=dtype, device=dev)

        self.state = DecodeState(
            logits=zeros(rows, vocab, dtype=torch.float32),
            positions=zeros(rows, dtype=torch.long),
            step=zeros(1, dtype=torch.long),
            uniforms=zeros(rows, columns, dtype=torch.float64),
            temperature=zeros(rows, dtype=torch.float32),
            top_k=zeros(rows, dtype=torch.long),
            top_p=zeros(rows, dtype=torch.float32),
            stop_ids=zeros(rows, stops, dtype=torch.long),
            limit=zeros(rows, dtype=torch.long),
            tokens=zeros(rows, columns, dtype=torch.long),
            logprobs=zeros(rows, columns, dtype=torch.float32),
            finished=zeros(rows, dtype=torch.bool),
        )
        self.slots: dict[tuple[int, bool, bool], _Slot] = {}

    def fits(self, rows: int, columns: int, stops: int) -> bool:
        return rows <= self.rows and columns == self.columns and stops <= self.stops

    def _row_tensors(self) -> list[Tensor]:
        """Every arena tensor indexed by row first (all but the step counter and the column)."""
        state = [getattr(self.state, f.name) for f in fields(self.state)]
        own = [t for t in state if isinstance(t, Tensor) and t is not self.state.step]
        return own + self.lean.keys + self.lean.values + [self.lean.bias]

    def load(self, fresh: DecodeState, cache: Any, mask: Tensor, bucket: int) -> None:
        """Write a prefilled batch (``fresh``, its rows' ``DecodeState``; the prefill's cache and mask)
        into the first ``bucket`` rows, the rows past the batch's as padding (module docstring)."""
        n, width = mask.shape
        if fresh.uniforms.shape[1] > self.columns - width:
            raise ValueError(
                f"{fresh.uniforms.shape[1]} steps after {width} columns: the arena has {self.columns}"
            )
        s, d = self.state, self.lean
        for t in self._row_tensors():
            t[:bucket].zero_()
        s.stop_ids[:bucket].fill_(-1)
        s.temperature[:bucket].fill_(1.0)  # padding samples plainly (its limit, 0, ends it at once)
        s.top_p[:bucket].fill_(1.0)
        for f in fields(fresh):
            value = getattr(fresh, f.name)
            if isinstance(value, Tensor) and f.name != "step":
                mine = getattr(s, f.name)
                (mine[:n] if value.dim() == 1 else mine[:n, : value.shape[1]]).copy_(value)
        s.finished[n:bucket].fill_(True)
        s.step.zero_()
        for kb, vb, layer in zip(d.keys, d.values, cache.layers):
            kb[:n, :, :, :width].copy_(layer.keys.transpose(-1, -2))
            vb[:n, :, :width].copy_(layer.values)
        d.bias[:bucket].fill_(float("-inf"))
        d.bias[:n, :, 0, :width].masked_fill_(mask.bool()[:, None, :], 0.0)
        d.col.fill_(width)

    def slot(self, bucket: int, filtered: bool, plain: bool, capture: Capture) -> _Slot:
        """The bucket's views and its replayable step (made at the first call)."""
        key = (bucket, filtered, plain)
        if key not in self.slots:
            view = self.state.first_rows(bucket, filtered, plain)
            lean = self.lean.first_rows(bucket)
            step = capture(functools.partial(decode_step, view, lean, None), self.lean.bias.device, self.pool)
            self.slots[key] = _Slot(view, lean, step)
        return self.slots[key]

    def compact(self, live: list[int]) -> None:
        """Move rows ``live`` (indices into the batch's current rows) to the front, in order."""
        index = torch.tensor(live, device=self.lean.bias.device)
        for t in self._row_tensors():
            t[: len(live)].copy_(t.index_select(0, index))


class GraphPool:
    """The arenas and graphs of one engine (module docstring). ``capture``: ``StepGraph`` on CUDA;
    ``new_pool``: a new memory-pool token for each arena, ``torch.cuda.graph_pool_handle`` on CUDA."""

    def __init__(self, capture: Capture | None = None, new_pool: Callable[[], Any] | None = None) -> None:
        self.capture: Capture = capture or StepGraph
        self.new_pool = new_pool or torch.cuda.graph_pool_handle
        self.arenas: list[_Arena] = []
        self._for: tuple[int, tuple[int, ...]] | None = None  # (id of the PackedWeights, addresses)

    def decode(
        self,
        model: Any,
        packed: PackedWeights,
        rows: list[Any],
        fresh: DecodeState,
        cache: Any,
        mask: Tensor,
        poll_every: int,
        check: Callable[[str], None],
    ) -> None:
        """``decode_loop.decode_batch`` for a prefilled batch, through the bucket graphs: ``fresh`` is
        the batch's own ``DecodeState`` (from the prefill), copied into the arena."""
        self._check_weights(model, packed)
        steps = fresh.uniforms.shape[1]
        bucket = rows_bucket(len(rows))
        stops = -(-fresh.stop_ids.shape[1] // STOP_WIDTH) * STOP_WIDTH
        arena = self._arena(model, packed, bucket, columns_bucket(mask.shape[1] + steps), stops)
        arena.load(fresh, cache, mask, bucket)
        slot = arena.slot(bucket, fresh.filtered, fresh.plain, self.capture)
        rows, seen = list(rows), 0
        for step in range(steps):
            check(f"at decode step {step}")
            slot.step()
            if step + 1 - seen < poll_every and step + 1 < steps:
                continue
            done = take(rows, slot.state, seen, step + 1)
            seen = step + 1
            if all(done):
                return
            live = [i for i, d in enumerate(done) if not d]
            if rows_bucket(len(live)) < bucket:  # the live rows fit a smaller bucket: its graph
                arena.compact(live)
                rows, bucket = [rows[i] for i in live], rows_bucket(len(live))
                slot = arena.slot(bucket, fresh.filtered, fresh.plain, self.capture)

    def rows_kept(self, columns: int) -> int:
        """The rows of a kept arena for ``columns`` needed columns (0 if none): a batch of up to that
        many rows takes no new memory."""
        return max((a.rows for a in self.arenas if a.columns == columns_bucket(columns)), default=0)

    def _check_weights(self, model: Any, packed: PackedWeights) -> None:
        """Drop every arena when the graphs would read stale addresses (module docstring)."""
        now = (id(packed), tuple(p.data_ptr() for p in model.parameters()))
        if now != self._for:
            self.arenas.clear()
            self._for = now

    def _arena(self, model: Any, packed: PackedWeights, rows: int, columns: int, stops: int) -> _Arena:
        found = next((a for a in self.arenas if a.fits(rows, columns, stops)), None)
        if found is not None:
            self.arenas.remove(found)
            self.arenas.append(found)  # most recently used last
            return found
        same = [a for a in self.arenas if a.columns == columns]  # superseded: too few rows or stops
        rows = max([rows] + [a.rows for a in same])
        stops = max([stops] + [a.stops for a in same])
        self.arenas = [a for a in self.arenas if a.columns != columns]
        while len(self.arenas) >= MAX_ARENAS:
            self.arenas.pop(0)
        del same  # every dropped arena is freed before the new one is made
        self.arenas.append(_Arena(model, packed, rows, columns, stops, self.new_pool()))
        return self.arenas[-1]
