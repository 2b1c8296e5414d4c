"""The embedded engine: batched sampling with a KV cache on an in-process transformers model.

A hand-written decode loop instead of ``model.generate``: it samples with per-request parameters in
one batch and returns the log-probability of each sampled token under the distribution it was drawn
from (after temperature, top-k and top-p, renormalised), which ``generate``'s scores cannot give
without recomputation.

How a batch runs: prompts are sorted by length, cut into batches of ``max_batch_size``, left-padded
(attention mask + explicit position ids, so padding never changes a row's numbers beyond float
rounding), prefilled in one forward, then decoded one token per forward with ``past_key_values``.
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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache

from agentrl.engines.base import (
    Bucket,
    Completion,
    Fingerprint,
    SamplingParams,
    Weights,
    per_prompt_params,
    weight_items,
)
from agentrl.engines.fingerprint import checksum, probe_logprobs, sampled_many
from agentrl.engines.lean_decode import LeanDecoder
from agentrl.engines.lean_decode import pays_off as lean_pays_off
from agentrl.engines.lean_decode import supports as lean_supports
from agentrl.engines.stopping import StopStringMatcher, token_decoder
from agentrl.models import torch_dtype
from agentrl.timeouts import WaitTimeout


def sample_next(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    u: torch.Tensor,
    *,
    filtered: bool | None = None,
    plain: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row and its log-probability under the sampling distribution.

    logits (B, V) float32; temperature, top_p (B,) float; top_k (B,) long (0 = off); u (B,) uniforms in
    [0, 1). Order: temperature, then top-k, then top-p on the renormalised top-k distribution (the
    order transformers' warpers and vLLM use). Top-p keeps the smallest most-likely prefix whose mass
    reaches ``top_p``. Sampling is by inverse CDF on ``u`` so each row's draw depends only on its own
    uniform, not on the batch.

    Hints a caller may pass once per batch to skip per-step checks: ``filtered`` (whether any row
    uses top-k or top-p; None = find out) and ``plain`` (every row has temperature exactly 1, no
    top-k, no top-p)."""
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


class HFEngine:
    """Engine over an in-process ``PreTrainedModel`` (see the module docstring for the guarantees).

    ``dtype``: None uses the model as given (shared with the caller, e.g. a colocated trainer);
    another dtype makes the engine keep its own converted copy. ``tokenizer`` is only needed for stop
    strings."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any = None,
        device: str | torch.device = "cpu",
        dtype: str | torch.dtype | None = None,
        max_batch_size: int = 64,
        lean_decode: bool | None = None,
    ) -> None:
        self.device = torch.device(device)
        if dtype is not None and torch_dtype(dtype) != next(model.parameters()).dtype:
            model = copy.deepcopy(model).to(torch_dtype(dtype))
        self.model = model.to(self.device)
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.pad_id = int(getattr(model.config, "pad_token_id", None) or 0)
        self._decode = token_decoder(tokenizer) if tokenizer is not None else None
        self._version = 0
        # decode steps: the lean Qwen2/Llama step (engines/lean_decode.py) for a model it reproduces,
        # by default (None) only where it is the faster one (small models), True wherever it can;
        # else the transformers forward. Recorded so benchmarks and logs can say which ran
        auto = lean_decode is None and lean_pays_off(self.model)
        lean = bool(lean_decode or auto) and lean_supports(self.model)
        self.decode_path = "lean" if lean else "transformers"
        self._seeds = random.Random()  # OS-seeded: requests without a seed get a fresh one
        self._deadline = threading.local()  # ``bounded``: this thread's generate deadline

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
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._deadline = threading.local()

    @contextlib.contextmanager
    def bounded(self, timeout_s: float, what: str, setting: str | None = None) -> Iterator[None]:
        """``generate`` calls in this block, from this thread, raise ``WaitTimeout`` once ``timeout_s``
        has passed, checked before the prefill and at every decode step. The runners use this instead
        of waiting on another thread: the engine's compute stays in the caller's thread (on this
        2-core machine a second thread doing torch work made the sync loop's rollouts 0.35 s per step
        slower, bench/pipeline.py: two OpenMP thread teams compete for the cores)."""
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
            with torch.inference_mode():
                for start in range(0, len(todo), self.max_batch_size):
                    self._run_batch(todo[start : start + self.max_batch_size])
        finally:
            self.model.train(was_training)
        return [self._completion(r, version) for r in requests]

    # -- internals -------------------------------------------------------------------------
    def _request(self, index: int, prompt: Sequence[int], sp: SamplingParams) -> _Request:
        if len(prompt) == 0:
            raise ValueError(f"prompt {index} is empty: the engine needs at least one token to condition on")
        if sp.stop and self._decode is None:
            raise ValueError("stop strings need a tokenizer: HFEngine(model, tokenizer=...)")
        matcher = StopStringMatcher(sp.stop, self._decode) if sp.stop and self._decode else None
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
            past_key_values=cache,
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
        steps = max(r.params.max_tokens for r in batch)
        uniforms = torch.stack(
            [
                torch.rand(steps, generator=torch.Generator().manual_seed(r.seed), dtype=torch.float64)
                for r in batch
            ]
        ).to(self.device)  # (B, steps): row i's draws depend only on its own seed
        temperature = torch.tensor([float(r.params.temperature) for r in batch], device=self.device)
        top_k = torch.tensor([int(r.params.top_k) for r in batch], device=self.device)
        top_p = torch.tensor([float(r.params.top_p) for r in batch], device=self.device)
        filtered = any(r.params.top_k > 0 or r.params.top_p < 1 for r in batch)
        plain = not filtered and all(float(r.params.temperature) == 1.0 for r in batch)
        logits, mask, positions, cache = self._prefill(batch)
        lean = LeanDecoder.from_cache(self.model, cache, mask, steps) if self.decode_path == "lean" else None
        rows = list(batch)  # requests still in the batch, aligned with tensor rows
        for step in range(steps):
            self._check_deadline(f"at decode step {step}")
            tokens, lps = sample_next(
                logits, temperature, top_k, top_p, uniforms[:, step], filtered=filtered, plain=plain
            )
            done = [
                r.finish is not None or r.add(t, lp) for r, t, lp in zip(rows, tokens.tolist(), lps.tolist())
            ]
            if all(done):
                return
            if 4 * sum(done) >= len(rows):  # compact: drop finished rows everywhere
                keep = torch.tensor([i for i, d in enumerate(done) if not d], device=self.device)
                if lean is not None:
                    lean.keep(keep)
                else:
                    cache.reorder_cache(keep)  # type: ignore[arg-type]
                rows = [rows[i] for i in keep.tolist()]
                tokens, mask, positions = tokens[keep], mask[keep], positions[keep]
                uniforms, temperature, top_k, top_p = (
                    uniforms[keep],
                    temperature[keep],
                    top_k[keep],
                    top_p[keep],
                )
            if lean is not None:
                logits = lean.step(tokens, positions)
            else:
                mask = torch.cat([mask, mask.new_ones((len(rows), 1))], dim=1)
                out = self.model(
                    input_ids=tokens[:, None],
                    attention_mask=mask,
                    position_ids=positions[:, None],
                    past_key_values=cache,
                    use_cache=True,
                )
                logits = out.logits[:, -1].float()
            positions = positions + 1
