"""What an engine serves, in a form two processes (or two libraries) compute the same way: a checksum
of a deterministic sample of each tensor, and the log-probs of a fixed probe sequence.

The engines compute these of their live weights (``Engine.fingerprint``); ``agentrl.sync.weight_sync``
computes the same of the trainer's and compares. Sampling: ``SAMPLE`` flat indices from SplitMix64
seeded by the tensor's name and numel (all of them for a smaller tensor); the checksum hashes the
sampled values' bytes in the tensor's dtype, with its shape.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor, nn

SAMPLE = 512
"""Elements sampled per tensor for its checksum."""
PROBE_SEED = 0x5EED_A6E7_2020
"""Seeds the probe's token ids (fixed: every sync of every run probes the same sequence)."""

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def splitmix64(seed: int, n: int) -> np.ndarray:
    """``n`` pseudo-random uint64 from SplitMix64 (Steele et al. 2014) seeded with ``seed``: defined
    here bit for bit, so the trainer and an engine in another process or library draw the same."""
    z = np.uint64(seed % 2**64) + (np.arange(1, n + 1, dtype=np.uint64) * _GOLDEN)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))  # type: ignore[no-any-return]


def sample_indices(name: str, numel: int) -> Tensor:
    """The flat indices sampled from a tensor called ``name`` with ``numel`` elements: all of them up
    to ``SAMPLE``, else ``SAMPLE`` drawn from a seed of the name and numel (with replacement)."""
    if numel <= SAMPLE:
        return torch.arange(numel)
    seed = int.from_bytes(hashlib.sha256(f"{name}|{numel}".encode()).digest()[:8], "little")
    return torch.from_numpy((splitmix64(seed, SAMPLE) % np.uint64(numel)).astype(np.int64))


def sampled(name: str, t: Tensor) -> Tensor:
    """The sampled elements of ``t`` (1-D, on the CPU, in ``t``'s dtype), read without copying ``t``."""
    t = t.detach()
    idx = sample_indices(name, t.numel()).to(t.device)
    if t.is_contiguous():
        return t.reshape(-1)[idx].cpu()
    return t[torch.unravel_index(idx, t.shape)].cpu()


def sampled_many(named: Sequence[tuple[str, Tensor]]) -> list[Tensor]:
    """``sampled`` of each (name, tensor), with one copy of the indices to each device and one read
    back from it: the samples are taken on the tensors' device and their bytes concatenated there,
    so a bucket on a GPU costs two transfers instead of two per tensor."""
    out: list[Tensor | None] = [None] * len(named)
    by_device: dict[torch.device, list[int]] = {}
    for i, (_, t) in enumerate(named):
        by_device.setdefault(t.device, []).append(i)
    for device, which in by_device.items():
        idx = [sample_indices(named[i][0], named[i][1].numel()) for i in which]
        on_device = torch.cat(idx).to(device).split([len(x) for x in idx])  # [sum of samples]: one copy
        values = []
        for i, ix in zip(which, on_device):
            t = named[i][1].detach()
            v = t.reshape(-1)[ix] if t.is_contiguous() else t[torch.unravel_index(ix, t.shape)]
            values.append(v.contiguous().view(torch.uint8))  # [samples · element size] bytes
        raw = torch.cat(values).cpu().split([len(v) for v in values])  # one read back
        for i, b in zip(which, raw):
            out[i] = b.clone().view(named[i][1].dtype)  # its own storage: aligned for the dtype
    return out  # type: ignore[return-value]


def checksum(shape: Sequence[int], values: Tensor) -> str:
    """``dtype:shape:digest`` of sampled ``values`` (the digest hashes their bytes)."""
    raw = values.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    dtype = str(values.dtype).removeprefix("torch.")
    return f"{dtype}:{'x'.join(map(str, shape))}:{hashlib.blake2b(raw, digest_size=8).hexdigest()}"


def tensor_checksum(name: str, t: Tensor) -> str:
    """An engine's checksum of its live tensor ``name``."""
    return checksum(tuple(t.shape), sampled(name, t))


def probe_ids(vocab_size: int, n: int) -> list[int]:
    """The probe sequence: ``n`` token ids in [0, vocab_size), the same for every sync and run."""
    return [int(x) for x in splitmix64(PROBE_SEED, n) % np.uint64(vocab_size)]


def probe_logprobs(model: nn.Module, ids: Sequence[int], device: torch.device | str) -> list[float]:
    """log p(ids[t] | ids[:t]) for t = 1 .. n-1 under ``model`` (a causal LM) at temperature 1, from
    one forward in eval mode (no dropout) with no gradient."""
    x = torch.tensor([list(ids)], device=device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits = model(input_ids=x).logits[0, :-1].float()  # [n-1, V]
    finally:
        model.train(was_training)
    return logits.log_softmax(-1).gather(1, x[0, 1:, None]).squeeze(1).tolist()  # type: ignore[no-any-return]
