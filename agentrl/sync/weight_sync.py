"""Weight sync: the learner's new weights into the engine in buckets, then proof of what it serves.

After every update the trainer streams ``learner.engine_weights()`` (name, full tensor) pairs (under
FSDP2 each is all-gathered when reached; with LoRA only the merged weights W + s·B·A of the adapted
layers) into the engine (``engines/base.py``: ``WeightReceiver``)::

    begin_weight_update -> load_weight_bucket × B -> finish_weight_update (the new version)
    then, when verifying: fingerprint(names sent, probe ids) -> compared with the trainer's own

- **Buckets** (``rollout.sync.bucket_mb``, ``parallel/buckets.py``): tensors are packed in stream
  order until the next one would pass the bucket size; a tensor bigger than a bucket travels alone.
  The sender keeps one bucket's tensors referenced at a time (plus the next tensor, gathered before
  the bucket goes), so a gathered or merged tensor lives only until its bucket is sent. Under FSDP2
  the learner hands over ``Bucketed`` buckets instead: each gathered by one collective, in the
  engine's dtype, with nothing of the next gathered before the bucket goes.
- **Proof** (``rollout.sync.verify``): for every tensor sent, the engine returns a checksum of a
  deterministic sample of its *live* tensor (``sample_indices``: ``SAMPLE`` flat indices from
  SplitMix64 seeded by the name and numel, all of them for a smaller tensor; ``checksum`` hashes the
  values' bytes in the engine's dtype with the shape; the sampled values of a bucket are taken on its
  device and read back in one transfer) and the log-probs of a fixed probe sequence
  (``probe_ids``, ``rollout.sync.probe_tokens`` long) under its own forward. The trainer samples the
  same indices as the stream passes (no second gather), casts them to the engine's dtype, and runs
  the probe through its own policy (``PolicyProbe``: the peft model with LoRA; under FSDP2 a
  collective every rank takes). A differing checksum names the tensor; a probe off by more than
  ``rollout.sync.probe_atol`` says by how much. ``every`` checks every sync; ``first`` only an
  engine's first (version 0 before the sync: the first sync of a process, also after a resume);
  ``off`` never. Under torchrun every rank checks its own engine and all ranks raise together.
- **Time limit** (``timeouts.weight_sync_s``): the whole sync. The engine calls run in one daemon
  thread per sync (``_Clock``), each waited for at most the time left; past it the
  trainer gets a ``WaitTimeout`` naming the engine, the step and the wait. The stuck call cannot be
  stopped: it is abandoned, and the engine's weights are then undefined. What runs in the trainer's
  own thread (gathering a bucket, the probe forward) is checked against the limit when it returns.
- **Ranks stop together.** Under torchrun the ranks agree before each bucket (``_agree``: one small
  all-gather), because gathering a bucket is a collective: a rank that failed (its engine call, a dead
  Ray worker, the clock) would otherwise leave the others blocked in the next bucket's gather until
  ``timeouts.collective_s`` aborts them. Every rank then raises at once, the others naming the rank
  that failed and its error.

What a sample catches: a tensor not synced, replaced, corrupted as a whole, cast or laid out wrongly.
A change to a fraction f of a big tensor's elements is caught with probability about 1 - (1 - f)^512;
the probe catches whatever moves the policy.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import queue
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import Tensor, nn

from agentrl.engines.base import Engine, Fingerprint, WeightReceiver
from agentrl.engines.fingerprint import checksum, probe_ids, probe_logprobs, sampled_many
from agentrl.parallel import ranks
from agentrl.parallel.buckets import bucket_size, pack_buckets
from agentrl.timeouts import WaitTimeout, start_thread, wait_for

MiB = 1 << 20


class WeightSyncError(RuntimeError):
    """A weight sync failed, or the engine does not serve the trainer's weights after it."""


class PolicyNotFinite(RuntimeError):
    """The trainer's own weights hold NaN or infinite values (its update diverged): no engine can
    serve them, and the sync is not what failed."""


@dataclass(frozen=True)
class Bucketed:
    """An update already cut into buckets by the sender (``Learner.engine_buckets``: FSDP2's shards
    gathered one bucket per collective, in the engine's dtype); ``sync_weights`` sends them as they
    come instead of packing a stream of tensors."""

    buckets: Iterable[list[tuple[str, Tensor]]]


ATOL_16BIT = 0.5
"""The probe's default tolerance when one side computes in bfloat16. Measured on SmolLM2-135M-Instruct
(30 layers; bench/bf16_numerics.py, 2,535 sampled tokens): a bfloat16 engine against the float32
trainer differs by 0.032 on average, 0.15 at the 99th percentile and 0.36 at most, and the 32-token
probe read 0.199, so the former 5e-2 refused every sync of a correct engine. Wrong weights are what
the checksums catch; the probe's job is a forward that computes something else, which moves log-probs
by nats."""


@dataclass(frozen=True)
class SyncSettings:
    """``rollout.sync`` and ``timeouts.weight_sync_s`` (see their docstrings in agentrl/config/)."""

    bucket_mb: float = 256.0
    verify: Literal["every", "first", "off"] = "every"
    probe_tokens: int = 32
    probe_atol: float | None = None
    timeout_s: float = 600.0

    def atol(self, *dtypes: str) -> float:
        """The probe's tolerance: ``probe_atol``, else 1e-3 when every side computes in float32 (or
        float64), ``ATOL_16BIT`` when one computes in a 16-bit dtype."""
        if self.probe_atol is not None:
            return self.probe_atol
        return 1e-3 if all(d in ("float32", "float64") for d in dtypes) else ATOL_16BIT


@dataclass(frozen=True)
class PolicyProbe:
    """The trainer's side of the probe: the policy being trained and how its forward runs."""

    model: nn.Module
    device: torch.device
    dtype: str
    """What the forward computes in: ``bfloat16`` under FSDP2's mixed precision, else the weights'."""
    release: Callable[[nn.Module], None]
    """Frees what a no-grad forward left gathered (FSDP2)."""

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)  # type: ignore[union-attr, arg-type]

    def logprobs(self, ids: Sequence[int]) -> list[float]:
        """The probe's log-probs (under FSDP2 a collective: every rank calls it)."""
        out = probe_logprobs(self.model, ids, self.device)
        self.release(self.model)
        return out


@dataclass
class SyncReport:
    """What one sync did; ``metrics`` is what the trainer logs."""

    seconds: float
    bytes: int
    buckets: int
    largest_bucket_bytes: int
    tensors: int
    version: int
    verified: bool
    probe_max_abs_diff: float | None = None
    pending: dict[str, tuple[tuple[int, ...], Tensor]] | None = None
    """A deferred verification's samples (``sync_weights(..., defer_verify=True)``), until
    ``verify_synced`` compares them."""

    def metrics(self) -> dict[str, float]:
        """``time/sync_s`` (wall time is logged under ``time/``, which run-to-run comparisons skip)
        and ``sync/*``; the probe's difference only when the sync was verified."""
        out = {
            "time/sync_s": self.seconds,
            "sync/bytes": float(self.bytes),
            "sync/buckets": float(self.buckets),
            "sync/largest_bucket_bytes": float(self.largest_bucket_bytes),
            "sync/verified": float(self.verified),
        }
        if self.probe_max_abs_diff is not None:
            out["sync/probe_max_abs_diff"] = self.probe_max_abs_diff
        return out


class _Clock:
    """The sync's one time limit, shared by its steps, and the one daemon thread its engine calls
    run in. One thread for the whole sync, not one per call: each new thread may get its own malloc
    arena, and arenas keep what was freed in them (docs/performance.md#weight-sync-bucket-size-time-and-memory-benchweight_syncpy)."""

    def __init__(self, engine: str, limit_s: float) -> None:
        self.engine, self.limit_s = engine, limit_s
        self.start = time.monotonic()
        self.setting = f"timeouts.weight_sync_s={limit_s:g}s for the whole sync"
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        start_thread(self._serve, "agentrl-weight-sync")  # on this process's CUDA device

    def _serve(self) -> None:
        while (item := self._calls.get()) is not None:
            fn, future = item
            try:
                future.set_result(fn())
            except BaseException as e:  # handed to the waiting trainer
                future.set_exception(e)
            del item, fn, future  # the call's arguments (a bucket) are not kept until the next call

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def call(self, step: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in the sync's thread, waited for at most the time left."""
        self.check(step)
        what = f"weight sync into {self.engine}: {step} (started {self.elapsed():.1f}s into the sync)"
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._calls.put((lambda: fn(*args), future))
        note = "; the call is abandoned (its thread keeps running)"
        try:
            return wait_for(future, self.limit_s - self.elapsed(), what, self.setting, note)
        except (WaitTimeout, WeightSyncError):
            raise
        except Exception as e:
            raise WeightSyncError(
                f"weight sync into {self.engine} failed while {step}: {type(e).__name__}: {e}"
            ) from e

    def check(self, step: str) -> None:
        """Raise once the limit has passed (after work done in this thread)."""
        if self.elapsed() > self.limit_s:
            raise WaitTimeout(f"weight sync into {self.engine}: {step}", self.elapsed(), self.setting)

    def close(self) -> None:
        """Let the thread end (a stuck call keeps it, abandoned)."""
        self._calls.put(None)


def sync_weights(
    engine: Engine,
    stream: Iterable[tuple[str, Tensor]] | Bucketed,
    settings: SyncSettings,
    probe: PolicyProbe,
    defer_verify: bool = False,
) -> SyncReport:
    """Stream ``stream`` into ``engine`` in buckets and, as ``settings.verify`` says, check that the
    engine serves it (module docstring). Consumes the stream to its end (under FSDP2 every rank must).
    Raises ``WeightSyncError`` naming the tensors that differ and the probe's difference, and
    ``WaitTimeout`` past ``settings.timeout_s``. ``defer_verify``: keep the samples in the report's
    ``pending`` and check later with ``verify_synced`` (the colocated engine can run the probe only
    once its KV cache is awake again)."""
    name = type(engine).__name__
    if not isinstance(engine, WeightReceiver):
        raise TypeError(
            f"{name} cannot take a bucketed, verified weight sync: it lacks the WeightReceiver methods "
            "(begin_weight_update, load_weight_bucket, finish_weight_update, fingerprint; engines/base.py)"
        )
    verify = settings.verify == "every" or (settings.verify == "first" and engine.version == 0)
    clock = _Clock(name, settings.timeout_s)
    try:
        return _sync(engine, stream, settings, probe, verify, clock, defer_verify)
    finally:
        clock.close()


def verify_synced(
    engine: Engine, report: SyncReport, settings: SyncSettings, probe: PolicyProbe
) -> SyncReport:
    """The verification ``sync_weights(..., defer_verify=True)`` left pending, under its own
    ``settings.timeout_s``; a report with nothing pending is returned as it is."""
    if report.pending is None:
        return report
    clock = _Clock(type(engine).__name__, settings.timeout_s)
    try:
        report.probe_max_abs_diff = _verify(engine, report.pending, settings, probe, clock)
    finally:
        clock.close()
    report.pending, report.verified = None, True
    report.seconds += clock.elapsed()
    return report


def _sync(
    engine: Any,
    stream: Iterable[tuple[str, Tensor]] | Bucketed,
    settings: SyncSettings,
    probe: PolicyProbe,
    verify: bool,
    clock: _Clock,
    defer_verify: bool = False,
) -> SyncReport:
    samples: dict[str, tuple[tuple[int, ...], Tensor]] = {}
    sizes: list[int] = []
    failed: Exception | None = None  # this rank's, agreed with the others before the next gather
    # an engine shared with running rollouts (the async trainer's EngineGate) is held for the whole sync
    hold = engine.hold() if hasattr(engine, "hold") else contextlib.nullcontext()
    with hold:
        try:
            clock.call("starting the update", engine.begin_weight_update)
        except Exception as e:
            failed = e
        # not enumerate(): it keeps the last item it yielded, so the previous bucket would stay alive
        buckets = iter(
            stream.buckets if isinstance(stream, Bucketed) else pack_buckets(stream, settings.bucket_mb * MiB)
        )
        while _agree(failed, "a weight bucket") and (bucket := next(buckets, None)) is not None:
            try:
                _load_bucket(engine, bucket, sizes, samples if verify else None, clock)
            except Exception as e:
                failed = e
            del bucket  # the next bucket is gathered without this one alive
        try:
            version = clock.call("finishing the update", engine.finish_weight_update)
        except Exception as e:
            failed = e
        _agree(failed, "finishing the update")
    report = SyncReport(
        seconds=0.0,
        bytes=sum(sizes),
        buckets=len(sizes),
        largest_bucket_bytes=max(sizes, default=0),
        tensors=len(samples),
        version=int(version),
        verified=verify,
    )
    if verify and defer_verify:
        report.verified, report.pending = False, samples
    elif verify:
        report.probe_max_abs_diff = _verify(engine, samples, settings, probe, clock)
    report.seconds = clock.elapsed()
    return report


def _load_bucket(
    engine: Any,
    bucket: list[tuple[str, Tensor]],
    sizes: list[int],
    samples: dict[str, tuple[tuple[int, ...], Tensor]] | None,
    clock: _Clock,
) -> None:
    """One bucket into the engine; its size into ``sizes`` and, when verifying, its samples into
    ``samples`` (taken on the tensors' device, read back once per bucket)."""
    i = len(sizes) + 1
    clock.check(f"gathering bucket {i}")
    if samples is not None:
        values = sampled_many(bucket)
        samples.update((n, (tuple(t.shape), v)) for (n, t), v in zip(bucket, values))
        del values
    sizes.append(bucket_size(bucket))
    names = bucket[0][0] if len(bucket) == 1 else f"{len(bucket)} tensors, {bucket[0][0]} .. {bucket[-1][0]}"
    clock.call(f"loading bucket {i} ({sizes[-1] / MiB:.1f} MiB: {names})", engine.load_weight_bucket, bucket)


def _agree(failed: Exception | None, before: str) -> bool:
    """True when no rank has failed; else raise on every rank (collective under torchrun): this
    rank's own error, or one naming the ranks that failed and their errors."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        said = ranks.gather_parts([None if failed is None else f"{type(failed).__name__}: {failed}"])
        if failed is None and any(said):
            others = "; ".join(f"rank {r}: {m}" for r, m in enumerate(said) if m)
            raise WeightSyncError(f"weight sync stopped before {before}: another rank failed ({others})")
    if failed is not None:
        raise failed
    return True


def _verify(
    engine: Any,
    samples: dict[str, tuple[tuple[int, ...], Tensor]],
    settings: SyncSettings,
    probe: PolicyProbe,
    clock: _Clock,
) -> float:
    """Compare the engine's fingerprints with the trainer's; the probe's largest difference."""
    ids = probe_ids(probe.vocab_size, settings.probe_tokens)
    want = torch.tensor(probe.logprobs(ids), dtype=torch.float64)
    clock.check("the trainer's probe forward")
    broken = [n for n, (_, values) in samples.items() if not bool(torch.isfinite(values.float()).all())]
    if broken or not bool(torch.isfinite(want).all()):
        shown = ", ".join(broken[:8]) + (f" and {len(broken) - 8} more" if len(broken) > 8 else "")
        raise PolicyNotFinite(
            f"the policy's own weights are not finite after its update ({len(broken)} of {len(samples)} tensors "
            f"hold NaN or infinite values{': ' + shown if broken else ''}; its probe log-probs are "
            f"{'not finite' if not bool(torch.isfinite(want).all()) else 'finite'}): the optimizer step "
            "diverged, which no weight sync can fix. Lower trainer.lr, keep trainer.grad_clip on, or check the "
            "method's settings (algorithm.*)"
        )
    prints = clock.call(
        f"fingerprinting {len(samples)} tensors and the probe", engine.fingerprint, list(samples), ids
    )
    problems, worst = [], 0.0
    for fp in prints:
        problem, diff = _compare(fp, samples, want, settings.atol(fp.dtype, probe.dtype))
        worst = max(worst, diff)
        if problem:
            problems.append(problem)
    if dist.is_initialized() and dist.get_world_size() > 1:  # every rank raises, naming the ranks
        problems = ranks.gather_parts([f"rank {dist.get_rank()}: {p}" for p in problems])
    if problems:
        raise WeightSyncError("; ".join(problems))
    return worst


def _compare(
    fp: Fingerprint, samples: dict[str, tuple[tuple[int, ...], Tensor]], want: Tensor, atol: float
) -> tuple[str | None, float]:
    """One replica's fingerprint against the trainer's samples and probe: (problem or None, probe
    max |diff|)."""
    differ = []
    for n, (shape, values) in samples.items():
        got = fp.checksums.get(n, "")
        if not got or checksum(shape, values.to(getattr(torch, got.split(":")[0]))) != got:
            differ.append(n if got else f"{n} (not in the engine)")
    got_lp = torch.tensor(fp.probe_logprobs, dtype=torch.float64)
    diff = float((got_lp - want).abs().max()) if got_lp.shape == want.shape else float("inf")
    probe_ok = diff <= atol  # False for NaN too
    if not differ and probe_ok:
        return None, diff
    shown = ", ".join(differ[:12]) + (f" and {len(differ) - 12} more" if len(differ) > 12 else "")
    what = (
        f"{len(differ)} of {len(samples)} tensors differ from the trainer's ({shown}); "
        if differ
        else f"all {len(samples)} tensors' sampled checksums match, but "
    )
    return (
        f"{fp.source} does not serve the trainer's weights: {what}the probe's log-probs differ by up "
        f"to {diff:.3g} (limit {atol:g}, rollout.sync.probe_atol)",
        diff,
    )
