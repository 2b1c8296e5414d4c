"""The engine protocol: token ids in, token ids + logprobs out.

An engine is stateless from the runner's point of view: it receives prompts as token ids and returns
what it sampled. It never sees text it must re-tokenize, so the runner can keep the exact ids that
produced every logprob (token in, token out).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

import torch

from agentrl.models.stopping import StopCondition

FinishReason = Literal["stop", "length", "abort"]
"""Why a completion ended: ``stop`` = a stop token id or stop string was produced or a stop condition held, ``length`` = the
``max_tokens`` budget ran out, ``abort`` = the engine gave up (e.g. an error or a cancelled request)."""


Weights = Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]
"""What ``Engine.load_weights`` takes: a dict, or a stream of (name, tensor) pairs (consumed once, in
order: the trainer gathers a sharded parameter only when the engine asks for the next one)."""


def weight_items(weights: Weights) -> Iterator[tuple[str, torch.Tensor]]:
    """The (name, tensor) pairs of a dict or of a stream."""
    return iter(weights.items()) if isinstance(weights, Mapping) else iter(weights)


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion. Logprobs are always returned, under the sampling distribution
    (after temperature, top-k and top-p), for the sampled tokens only."""

    max_tokens: int = 256
    """Upper bound on the number of new tokens."""
    temperature: float = 1.0
    """Softmax temperature; 0 means greedy."""
    top_p: float = 1.0
    """Nucleus sampling mass; 1.0 disables it."""
    top_k: int = 0
    """Keep only the k most likely tokens; 0 disables it."""
    stop_token_ids: tuple[int, ...] = ()
    """Generation ends after any of these ids is sampled; the id is part of the completion."""
    stop: tuple[str, ...] = ()
    """Generation ends once the decoded completion contains one of these strings; the tokens up to and
    including the one that completed the string are kept (nothing is cut out of a token)."""
    stop_conditions: tuple[StopCondition, ...] = ()
    """Generation ends once one of these predicates holds on the completion's text (``agentrl/models/stopping.py``:
    the answer stop, ``BOXED_ANSWER``); the tokens up to and including the one that made it hold are
    kept, ``Completion.stop_reason`` is the condition's name."""
    seed: int | None = None
    """Per-request seed; with the same seed, prompt and weights the completion is reproducible."""


@dataclass
class Completion:
    """What the engine produced for one prompt."""

    token_ids: list[int]
    logprobs: list[float]
    """One per token in ``token_ids``: log-probability of that token under the sampling distribution."""
    finish_reason: FinishReason
    stop_reason: int | str | None = None
    """The stop token id, stop string or stop condition's name that ended generation, if any."""
    weight_version: int = 0
    """The engine's weight version when this completion was produced."""
    info: dict = field(default_factory=dict)


@runtime_checkable
class Engine(Protocol):
    """A generation backend (HF transformers in-process, vLLM, or a scripted replay for tests)."""

    @property
    def version(self) -> int:
        """Weight version; bumped by every ``load_weights``."""
        ...

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[Completion]:
        """Sample one completion per prompt (prompts may have different lengths). ``params`` is one
        SamplingParams for all prompts or one per prompt."""
        ...

    def load_weights(self, weights: Weights) -> int:
        """Replace the named weights in place (all or some; nothing only bumps the version);
        returns the new version. The trainer's sync goes through ``WeightReceiver`` instead
        (buckets, then proof of what the engine serves)."""
        ...


@dataclass
class Fingerprint:
    """What one engine (or one replica of it) serves, for ``agentrl.sync.weight_sync`` to compare with
    the trainer's weights: plain data, so it crosses a Ray call or a vLLM RPC."""

    source: str
    """Which engine or replica answered (``HFEngine``, ``rollout worker 1 (pid 4242): HFEngine``)."""
    checksums: dict[str, str]
    """Tensor name -> ``engines.fingerprint.tensor_checksum`` of the live tensor (in the engine's dtype), or
    ``""`` when the engine has no tensor of that name."""
    probe_logprobs: list[float]
    """log p(ids[t] | ids[:t]) for t = 1 .. n-1 of the probe ids, temperature 1, no sampling filters."""
    dtype: str
    """The dtype the engine computes in (``float32``, ``bfloat16``): it sets the probe's tolerance."""


Bucket = Iterable[tuple[str, torch.Tensor]]
"""Some of an update's (name, tensor) pairs, in stream order (``weight_sync.pack_buckets``)."""


@runtime_checkable
class WeightReceiver(Protocol):
    """An engine that takes an update in buckets and can show what it serves (``agentrl/sync/weight_sync.py``).

    One update is ``begin_weight_update()``, then ``load_weight_bucket`` for each bucket in stream
    order, then ``finish_weight_update()``, which returns the new version: generation sees the new
    weights only after it (an engine that applies a bucket at once must not generate in between).
    ``load_weights(weights)`` is the same with everything in one bucket. After a failed or abandoned
    update the engine's weights are undefined. ``fingerprint`` reports on the live weights."""

    def begin_weight_update(self) -> None: ...

    def load_weight_bucket(self, bucket: Bucket) -> None: ...

    def finish_weight_update(self) -> int: ...

    def fingerprint(self, names: Sequence[str], probe_ids: Sequence[int]) -> list[Fingerprint]:
        """One ``Fingerprint`` per replica (every Ray worker answers for itself) of the tensors
        ``names`` (checkpoint names, as the trainer streams them) and the probe ``probe_ids``."""
        ...


def per_prompt_params(
    prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
) -> list[SamplingParams]:
    """One SamplingParams per prompt: ``params`` repeated, or checked to have one per prompt."""
    plist = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
    if len(plist) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(plist)} SamplingParams")
    return plist
