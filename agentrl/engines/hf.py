"""The embedded engine: batched sampling with a KV cache on an in-process transformers model.

A hand-written decode loop instead of ``model.generate``: it samples with per-request parameters in
one batch and returns the log-probability of each sampled token under the distribution it was drawn
from (after temperature, top-k and top-p, renormalised), which ``generate``'s scores cannot give
without recomputation.

How a batch runs: prompts are sorted by length, cut into batches as large as the KV cache's memory
budget holds (``batch_rows``; ``max_batch_size`` caps them), left-padded (attention mask + explicit
position ids, so padding never changes a row's numbers beyond float rounding), prefilled in one
forward, then decoded one token per step: by the lean step's static loop on the device
(``decode_loop.py``; a CUDA graph on CUDA), or by the transformers forward with a growing cache.
Finished rows stop being appended to at once and are dropped from the batch (KV cache included) once
a quarter of the rows are done, so long stragglers do not pay for finished neighbours.

Reproducibility: each request draws its uniforms from its own ``torch.Generator`` seeded with
``SamplingParams.seed`` (or a fresh random seed, recorded in ``Completion.info["seed"]``), and samples
by inverse CDF. The same seed, prompt, parameters and weights give the same completion whatever else is
in the batch, up to float rounding of batched matmuls (a draw within ~1e-6 of a CDF boundary could
flip; in practice the tokens are identical).

Temperature 0 is greedy: the argmax token, reported with logprob 0.0 (the log-probability of the
point mass it was sampled from).
"""

from __future__ import annotations

import contextlib
import copy
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import DynamicCache

from agentrl.engines import decode_probe
from agentrl.engines.base import (
    Bucket,
    Completion,
    Fingerprint,
    SamplingParams,
    Weights,
    per_prompt_params,
    weight_items,
)
from agentrl.engines.cpu_gemm import CHOICES as CPU_GEMM_CHOICES
from agentrl.engines.cpu_gemm import resolve as cpu_gemm_library
from agentrl.engines.decode_graphs import GraphPool, columns_bucket
from agentrl.engines.decode_loop import DecodeState, decode_batch, sample_next
from agentrl.engines.fingerprint import checksum, probe_logprobs, sampled_many
from agentrl.engines.lean_decode import LeanDecoder
from agentrl.engines.lean_decode import pays_off as lean_pays_off
from agentrl.engines.lean_decode import supports as lean_supports
from agentrl.engines.lean_weights import PackedWeights
from agentrl.models import torch_dtype
from agentrl.models.cache_api import cache_kwargs
from agentrl.models.stopping import StopStringMatcher, token_decoder
from agentrl.timeouts import WaitTimeout


@dataclass
class _Request:
    index: int
    prompt: list[int]
    params: SamplingParams
    seed: int
    matcher: StopStringMatcher | None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: tuple[str, int | str | None] | None = None

    def add(self, token: int, logprob: float) -> bool:
        """Append one token; returns True when the request is finished."""
        self.token_ids.append(token)
        self.logprobs.append(logprob)
        if token in self.params.stop_token_ids:
            self.finish = ("stop", token)
        elif self.matcher is not None and (hit := self.matcher.match(self.token_ids)) is not None:
            self.finish = ("stop", hit)
        elif len(self.token_ids) >= self.params.max_tokens:
            self.finish = ("length", None)
        return self.finish is not None


def decode_path(
    model: torch.nn.Module, device: torch.device, lean_decode: bool | None, cpu_gemm: str
) -> tuple[str, str | None, str]:
    """The decode steps' path, for the lean step on the CPU in float32 its products' library, and why.

    The lean Qwen2/Llama step (engines/lean_decode.py) for a model it reproduces: by default
    (``lean_decode`` None) on CUDA (its static step is replayed as a CUDA graph) and on the CPU where
    it is the faster one (small models, any size whose products go through oneDNN, and otherwise as
    measured on this machine: ``decode_probe``); True wherever it can; else the transformers forward. ``cpu_gemm`` (engines/cpu_gemm.py): "mkl", "onednn", or
    "auto", measured once for models above the lean step's small-model bound (a small model's step is
    per-call overhead, not products: it keeps MKL, so the tiny models' runs do not hang on a
    measurement's outcome)."""
    if cpu_gemm not in CPU_GEMM_CHOICES:
        raise ValueError(f"cpu_gemm={cpu_gemm!r}: choose one of {', '.join(CPU_GEMM_CHOICES)}")
    can_lean = lean_supports(model) and lean_decode is not False
    if cpu_gemm == "onednn" and not can_lean:
        raise ValueError(
            "cpu_gemm='onednn' runs the lean decode step's products, and this engine does not take that step "
            "(lean_decode=False, or a model it does not reproduce: engines/lean_decode.supports)"
        )
    small = cpu_gemm == "auto" and lean_pays_off(model)
    pick = cpu_gemm_library("mkl" if small else cpu_gemm, model, device) if can_lean else None
    library = pick.library if pick else None
    auto = lean_decode is None and (device.type == "cuda" or lean_pays_off(model) or library == "onednn")
    why = "no lean decode step here: the transformers forward's own products" if pick is None else pick.why
    if small and library is not None:
        why = "auto: a small model, whose decode step is per-call overhead: MKL kept, nothing measured"
    if lean_decode is None and not auto and library == "mkl":  # which step is faster here: measured
        auto, decode_why = decode_probe.lean_is_faster(model)
        why = f"{why}; decode path {decode_why}"
    lean = bool(lean_decode or auto) and lean_supports(model)
    return ("lean" if lean else "transformers"), library, why


class HFEngine:
    """Engine over an in-process ``PreTrainedModel`` (see the module docstring for the guarantees).

    ``dtype``: None uses the model as given (shared with the caller, e.g. a colocated trainer);
    another dtype makes the engine keep its own converted copy. ``tokenizer`` is only needed for stop
    strings and stop conditions."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any = None,
        device: str | torch.device = "cpu",
        dtype: str | torch.dtype | None = None,
        max_batch_size: int | None = None,
        lean_decode: bool | None = None,
        poll_every: int | None = None,
        cuda_graphs: bool = True,
        cpu_gemm: str = "auto",
    ) -> None:
        self.device = torch.device(device)
        if dtype is not None and torch_dtype(dtype) != next(model.parameters()).dtype:
            model = copy.deepcopy(model).to(torch_dtype(dtype))
        self.model = model.to(self.device)
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        """Rows decoded together; None: as many as the KV cache's memory budget holds (``batch_rows``)."""
        cuda = self.device.type == "cuda"
        self.poll_every = poll_every or (DEFAULT_POLL_CUDA if cuda else 1)
        """The lean loop reads its new tokens back every this many steps (module docstring)."""
        self.cuda_graphs = cuda_graphs and cuda
        self.pad_id = int(getattr(model.config, "pad_token_id", None) or 0)
        self._decode = token_decoder(tokenizer) if tokenizer is not None else None
        self._version = 0
        path = decode_path(self.model, self.device, lean_decode, cpu_gemm)
        self.decode_path, self.cpu_gemm, self.cpu_gemm_why = path
        """"lean" or "transformers", the library of the lean step's products on the CPU in float32
        ("mkl" or "onednn"; None elsewhere), and why: recorded so benchmarks and logs say which ran."""
        self._seeds = random.Random()  # OS-seeded: requests without a seed get a fresh one
        self._deadline = threading.local()  # ``bounded``: this thread's generate deadline
        self._packed: PackedWeights | None = None  # the lean step's weights, kept while current
        self._lean_lock = threading.Lock()  # calls from several threads take turns at the lean decode
        self._graphs = GraphPool() if self.cuda_graphs and self.decode_path == "lean" else None
        """The decode step's CUDA graphs, kept per batch bucket across batches (decode_graphs.py)."""

    @property
    def version(self) -> int:
        return self._version

    def load_weights(self, weights: Weights) -> int:
        """Copy ``weights`` into the model in place (dtype and device converted), one tensor at a
        time as a stream yields them; partial sets are allowed, unknown names and shape mismatches
        raise. Returns the new version."""
        self.begin_weight_update()
        self.load_weight_bucket(weight_items(weights))
        return self.finish_weight_update()

    # -- the bucketed sync (engines/base.py: WeightReceiver) ------------------------------------
    def begin_weight_update(self) -> None:
        """Nothing to prepare: each bucket is copied in place as it comes."""

    def load_weight_bucket(self, bucket: Bucket) -> None:
        """Copy a bucket's tensors into the model in place, one at a time (see ``load_weights``)."""
        own = self.model.state_dict()
        with torch.no_grad():
            for name, tensor in bucket:
                if name not in own:
                    raise KeyError(f"load_weights: unknown parameter name {name!r}")
                if own[name].shape != tensor.shape:
                    raise ValueError(
                        f"load_weights: {name} has shape {tuple(tensor.shape)}, expected {tuple(own[name].shape)}"
                    )
                own[name].copy_(tensor)

    def finish_weight_update(self) -> int:
        self._version += 1
        return self._version

    def fingerprint(self, names: Sequence[str], probe_ids: Sequence[int]) -> list[Fingerprint]:
        """Checksums of the live ``state_dict()`` tensors (those it samples with) and the probe's
        log-probs from its own forward."""
        own = self.model.state_dict()
        present = [(n, own[n]) for n in names if n in own]
        values = dict(zip((n for n, _ in present), sampled_many(present)))  # one read back
        sums = {n: checksum(tuple(own[n].shape), values[n]) if n in own else "" for n in names}
        with torch.inference_mode():
            logprobs = probe_logprobs(self.model, probe_ids, self.device)
        dtype = str(next(self.model.parameters()).dtype).removeprefix("torch.")
        return [Fingerprint(type(self).__name__, sums, logprobs, dtype)]

    def __getstate__(self) -> dict[str, Any]:  # copy.deepcopy, pickle: the deadline is per thread
        state = self.__dict__.copy()
        state.pop("_deadline", None)
        state.pop("_lean_lock", None)
        state.update(_packed=None, _graphs=GraphPool() if self._graphs is not None else None)  # remade
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._deadline = threading.local()
        self._lean_lock = threading.Lock()

    @contextlib.contextmanager
    def bounded(self, timeout_s: float, what: str, setting: str | None = None) -> Iterator[None]:
        """``generate`` calls in this block, from this thread, raise ``WaitTimeout`` once ``timeout_s``
        has passed, checked before the prefill and at every decode step. The runners use this instead
        of waiting on another thread: the engine's compute stays in the caller's thread (a second
        thread doing torch work slows the rollouts: two OpenMP thread teams compete for the cores;
        docs/performance.md#the-training-pipeline-sync-vs-async-benchpipelinepy)."""
        self._deadline.value = (time.monotonic() + timeout_s, timeout_s, what, setting)
        try:
            yield
        finally:
            self._deadline.value = None

    def _check_deadline(self, where: str) -> None:
        bound = getattr(self._deadline, "value", None)
        if bound is not None and time.monotonic() > bound[0]:
            raise WaitTimeout(
                bound[2], bound[1] + time.monotonic() - bound[0], bound[3], f"; stopped {where}"
            )

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[Completion]:
        self._check_deadline("before the prefill")
        plist = per_prompt_params(prompts, params)
        requests = [self._request(i, p, sp) for i, (p, sp) in enumerate(zip(prompts, plist))]
        version = self._version
        todo = sorted((r for r in requests if r.params.max_tokens > 0), key=lambda r: -len(r.prompt))
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode(), self._attention_kernels():
                start = 0
                while start < len(todo):
                    n = self.batch_rows(todo[start:])
                    self._run_batch(todo[start : start + n])
                    start += n
        finally:
            self.model.train(was_training)
        return [self._completion(r, version) for r in requests]

    def batch_rows(self, todo: Sequence[_Request]) -> int:
        """How many of ``todo`` (sorted longest prompt first) to decode together: ``max_batch_size``
        when set; else as many as the KV cache's memory budget holds (``kv_budget_bytes``), at least
        one. Rows decoded together cost one step for all of them, so fewer, larger batches are
        faster wherever memory allows (the 128-row runs of the GPU benchmark decoded two 64-row
        batches one after the other when 64 was fixed). With CUDA graphs a batch takes its bucket's
        rows and columns (powers of two, decode_graphs.py), so at most a power of two of rows, or
        as many as a kept arena of its columns holds (its memory is already taken)."""
        if self.max_batch_size:
            return min(self.max_batch_size, len(todo))
        width = self._width(todo)
        per_column = kv_bytes_per_column(self.model)
        if self._graphs is None:
            return max(1, min(len(todo), int(kv_budget_bytes(self.device) // (per_column * width))))
        fit = int(kv_budget_bytes(self.device) // (per_column * columns_bucket(width)))
        fit = 1 << (fit.bit_length() - 1) if fit else 1  # a whole bucket
        kept = self._graphs.rows_kept(width)  # an arena of these columns holds them already
        if kept > fit and columns_bucket(self._width(todo[:kept])) == columns_bucket(width):
            fit = kept
        return max(1, min(len(todo), fit))

    @staticmethod
    def _width(todo: Sequence[_Request]) -> int:
        """The key columns a batch of ``todo`` (longest prompt first) needs."""
        return len(todo[0].prompt) + max(r.params.max_tokens for r in todo)

    def _attention_kernels(self) -> contextlib.AbstractContextManager:
        """On CUDA, scaled-dot-product attention without cuDNN for the engine's own calls (the
        prefill, and the transformers decode path): cuDNN keeps a graph per key length and builds a
        new one, on the host, whenever the length grows, which a decode does every step
        (docs/performance.md#on-one-gpu-smollm2-135m-instruct-on-an-nvidia-h200-bf16). The trainer's forward keeps it."""
        if self.device.type != "cuda":
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])

    # -- internals -------------------------------------------------------------------------
    def _request(self, index: int, prompt: Sequence[int], sp: SamplingParams) -> _Request:
        if len(prompt) == 0:
            raise ValueError(f"prompt {index} is empty: the engine needs at least one token to condition on")
        stopping = sp.stop or sp.stop_conditions
        if stopping and self._decode is None:
            raise ValueError("stop strings and conditions need a tokenizer: HFEngine(model, tokenizer=...)")
        matcher = (
            StopStringMatcher(sp.stop, self._decode, sp.stop_conditions)
            if stopping and self._decode
            else None
        )
        seed = sp.seed if sp.seed is not None else self._seeds.getrandbits(63)
        return _Request(index, list(prompt), sp, seed, matcher)

    @staticmethod
    def _completion(r: _Request, version: int) -> Completion:
        reason, stop = r.finish or ("length", None)  # max_tokens == 0 never ran
        return Completion(
            token_ids=r.token_ids,
            logprobs=r.logprobs,
            finish_reason=reason,  # type: ignore[arg-type]
            stop_reason=stop,
            weight_version=version,
            info={"seed": r.seed, "prompt_tokens": len(r.prompt)},
        )

    def _prefill(
        self, batch: list[_Request]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, DynamicCache]:
        """Left-padded forward over the prompts: (last logits, attention mask, next positions, cache).

        Identical prompts (a GRPO group's samples all start from one) are run once and their cache
        rows repeated, so a group of G costs one prompt's prefill, not G."""
        width = max(len(r.prompt) for r in batch)
        first: dict[tuple[int, ...], int] = {}
        rows = [first.setdefault(tuple(r.prompt), len(first)) for r in batch]  # row -> unique index
        unique = list(first)
        ids = torch.full((len(unique), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(unique), width), dtype=torch.long)
        for row, prompt in enumerate(unique):
            ids[row, width - len(prompt) :] = torch.tensor(prompt)
            mask[row, width - len(prompt) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)  # type: ignore[arg-type]
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            **cache_kwargs(self.model, cache),
            use_cache=True,
            logits_to_keep=1,
        )
        logits = out.logits[:, -1].float()
        if len(unique) < len(batch):
            expand = torch.tensor(rows, device=self.device)
            cache.reorder_cache(expand)  # type: ignore[arg-type]  # index_select: repeats shared rows
            logits, mask, positions = logits[expand], mask[expand], positions[expand]
        return logits, mask, positions[:, -1] + 1, cache

    def _run_batch(self, batch: list[_Request]) -> None:
        """Prefill and decode one batch. The lean path holds ``_lean_lock`` throughout: the packed
        weights and graph arenas are one per engine, and on CUDA no other thread's prefill runs
        while a graph is captured."""
        lean = self.decode_path == "lean"
        with self._lean_lock if lean else contextlib.nullcontext():
            steps = max(r.params.max_tokens for r in batch)
            uniforms = torch.stack(
                [
                    torch.rand(steps, generator=torch.Generator().manual_seed(r.seed), dtype=torch.float64)
                    for r in batch
                ]
            ).to(self.device)  # (B, steps): row i's draws depend only on its own seed
            filtered = any(r.params.top_k > 0 or r.params.top_p < 1 for r in batch)
            plain = not filtered and all(float(r.params.temperature) == 1.0 for r in batch)
            logits, mask, positions, cache = self._prefill(batch)
            state = DecodeState.start(logits, positions, uniforms, [r.params for r in batch], filtered, plain)
            if not lean:
                decode_transformers(self.model, batch, state, mask, cache, steps, self._check_deadline)
            elif self._graphs is not None:
                packed = self.packed_weights(len(batch))
                self._graphs.decode(
                    self.model, packed, batch, state, cache, mask, self.poll_every, self._check_deadline
                )
            else:
                decoder = LeanDecoder.from_cache(
                    self.model, cache, mask, steps, packed=self.packed_weights(len(batch))
                )
                decode_batch(batch, state, decoder, steps, self.poll_every, self._check_deadline)

    def packed_weights(self, rows: int) -> PackedWeights:
        """The lean step's packed weights for a batch of ``rows`` rows: the kept ones while the model's
        weights are unchanged, else packed again in place (lean_weights.py); new ones when oneDNN
        packs for another row count."""
        hint = rows if self.cpu_gemm == "onednn" else None
        if self._packed is None or self._packed.rows != hint:
            self._packed = None  # the old copy goes before the new one is made
            self._packed = PackedWeights(self.model, hint)
        elif not self._packed.current(self.model):
            self._packed.refresh(self.model)
        return self._packed


def decode_transformers(
    model: torch.nn.Module,
    batch: list[_Request],
    state: DecodeState,
    mask: torch.Tensor,
    cache: DynamicCache,
    steps: int,
    check: Callable[[str], None],
) -> None:
    """A prefilled batch decoded by the transformers forward, one step at a time (models the lean step
    does not reproduce); ``check(where)`` raises past the caller's deadline."""
    rows, positions, logits = list(batch), state.positions, state.logits
    temperature, top_k, top_p, uniforms = state.temperature, state.top_k, state.top_p, state.uniforms
    for step in range(steps):
        check(f"at decode step {step}")
        tokens, lps = sample_next(
            logits,
            temperature,
            top_k,
            top_p,
            uniforms[:, step],
            filtered=state.filtered,
            plain=state.plain,
        )
        done = [r.finish is not None or r.add(t, lp) for r, t, lp in zip(rows, tokens.tolist(), lps.tolist())]
        if all(done):
            return
        if 4 * sum(done) >= len(rows):  # compact: drop finished rows everywhere
            kept = [i for i, d in enumerate(done) if not d]
            keep = torch.tensor(kept, device=state.logits.device)
            cache.reorder_cache(keep)  # type: ignore[arg-type]
            rows = [rows[i] for i in kept]
            tokens, mask, positions = tokens[keep], mask[keep], positions[keep]
            uniforms, temperature, top_k, top_p = (
                uniforms[keep],
                temperature[keep],
                top_k[keep],
                top_p[keep],
            )
        mask = torch.cat([mask, mask.new_ones((len(rows), 1))], dim=1)
        out = model(
            input_ids=tokens[:, None],
            attention_mask=mask,
            position_ids=positions[:, None],
            **cache_kwargs(model, cache),
            use_cache=True,
        )
        logits = out.logits[:, -1].float()
        positions = positions + 1


DEFAULT_POLL_CUDA = 8
"""On CUDA the lean loop reads its tokens back every 8 steps: a read waits for the GPU, and 8 steps
of graph replays keep it busy in between; finished rows run at most 7 wasted steps."""


def kv_bytes_per_column(model: torch.nn.Module) -> int:
    """The bytes one row's KV cache takes per key column (every layer's keys and values)."""
    c: Any = model.config
    layers = int(getattr(c, "num_hidden_layers", 1))
    heads = int(getattr(c, "num_key_value_heads", None) or c.num_attention_heads)
    head_dim = int(getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads)
    return 2 * layers * heads * head_dim * next(model.parameters()).element_size()


def kv_budget_bytes(device: torch.device) -> int:
    """The memory a batch's KV cache may take: on CUDA half of what is free on the device now; on the
    CPU a quarter of the memory available (``MemAvailable``), at most 4 GiB."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free // 2)
    available = 8 << 30
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    return min(available // 4, 4 << 30)
