"""After each update, the learner's weights go to the engine in buckets and, as ``rollout.sync.verify``
says, the engine proves it serves them (``sync/weight_sync.py``; every rank, in step). With
``rollout.colocate.sleep`` the engine sleeps through the update, wakes its weights for the push, then
its KV cache, and the proof runs last (its probe generates): ``sync/colocate.py``. After a level-2
sleep the engine holds no weights at all, so a LoRA run then sends every weight, not only the
adapted layers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from agentrl.config.schema import ColocateConfig
from agentrl.engines.base import Engine
from agentrl.sync import weight_sync


@dataclass(frozen=True)
class PushSettings:
    """What the weight push reads of the config (``assembly/records.py`` builds it)."""

    sync: weight_sync.SyncSettings
    """from ``rollout.sync`` and ``timeouts.weight_sync_s``"""
    colocate: ColocateConfig
    """from ``rollout.colocate``"""
    sleep_wake_s: float
    """from ``timeouts.sleep_wake_s``"""
    bf16: bool
    """from ``trainer.bf16``"""
    engine_dtype: torch.dtype
    """the dtype the engine holds its weights in (``components.engine_dtype``)"""


class WeightPush:
    def __init__(self, settings: PushSettings, learner: Any, engine: Engine) -> None:
        self.push_settings, self.learner, self.engine = settings, learner, engine

    def around(self, update: Callable[[], dict[str, float]]) -> dict[str, float]:
        """Run ``update`` (the learner's optimizer steps), then push its weights; the metrics of both."""
        if self.push_settings.colocate.sleep:
            from agentrl.sync import colocate

            reports: list[weight_sync.SyncReport] = []

            def push() -> dict[str, float]:  # verified once the KV cache is awake (the probe generates)
                reports.append(self.sync(defer_verify=True))
                return {}

            metrics = colocate.cycle_for(
                self.engine, self.push_settings.colocate.sleep_level, self.push_settings.sleep_wake_s
            ).around_update(update, push)
            report = weight_sync.verify_synced(self.engine, reports[0], *self.settings())
            metrics.update(report.metrics())
            return metrics
        metrics = update()
        if metrics.get("update/steps", 1.0) == 0:  # no optimizer step: the engine's weights are current
            return metrics
        metrics.update(self.push())
        return metrics

    def push(self) -> dict[str, float]:
        """Send the learner's current weights and check the engine serves them; the sync's metrics.
        Raises ``WeightSyncError`` when the engine serves other weights."""
        return self.sync().metrics()

    def settings(self) -> tuple[weight_sync.SyncSettings, weight_sync.PolicyProbe]:
        learner = self.learner
        fsdp_bf16 = (
            self.push_settings.bf16 and learner.strategy.equal_forwards
        )  # FSDP2's mixed precision computes in bf16
        dtype = (
            "bfloat16" if fsdp_bf16 else str(next(learner.model.parameters()).dtype).removeprefix("torch.")
        )
        probe = weight_sync.PolicyProbe(learner.model, learner.device, dtype, learner.strategy.release)
        return self.push_settings.sync, probe

    def sync(self, defer_verify: bool = False) -> weight_sync.SyncReport:
        """One sync: the learner's buckets (under FSDP2 each gathered by one collective in the
        engine's dtype, ``parallel/buckets.py``) into the engine, then its proof."""
        settings, probe = self.settings()
        dtype = self.push_settings.engine_dtype
        c = self.push_settings.colocate
        full = c.sleep and c.sleep_level == 2  # the engine woke with no weights at all
        buckets = self.learner.engine_buckets(settings.bucket_mb * weight_sync.MiB, dtype, full=full)
        return weight_sync.sync_weights(
            self.engine, weight_sync.Bucketed(buckets), settings, probe, defer_verify=defer_verify
        )
