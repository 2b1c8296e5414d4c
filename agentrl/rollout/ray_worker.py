"""One Ray rollout actor's state, built from a ``WorkerSpec``: its engine, tokenizer and runner, and its
end of each weight transport (``sync/transports/``). ``ray_workers.py`` holds the pool of them."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from agentrl.engines.base import Fingerprint, SamplingParams
from agentrl.engines.factory import make_engine
from agentrl.engines.hf import HFEngine
from agentrl.engines.vllm import safetensors_blob
from agentrl.models import resolve_model_path
from agentrl.models.tokenizer import load_tokenizer
from agentrl.rollout.ray_placement import report, scrub_launcher_env
from agentrl.rollout.runner import EpisodeRequest, SamplingOverride
from agentrl.rollout.worker_spec import WorkerSpec, make_runner
from agentrl.sync.registry import make_transport
from agentrl.sync.transports.base import Transport


class RolloutWorker:
    """One Ray actor's state: policy weights in an engine, an environment factory, a tokenizer, all
    built from a ``WorkerSpec`` (no config: this module imports none). Plain class so it can also be
    used (and tested) without Ray."""

    def __init__(self, spec: WorkerSpec) -> None:
        # started from the environment of the process that started Ray (torchrun's rank 0): not a rank
        self.scrubbed = scrub_launcher_env()
        self.spec = spec
        self.tokenizer = load_tokenizer(resolve_model_path(spec.tokenizer_path))
        # the engine reads the checkpoint itself: vLLM from the path, the HF engine straight into its
        # dtype on its device (no copy of the policy in model.dtype, which vLLM would never use)
        self.engine = make_engine(spec.engine, self.tokenizer)
        self._transports: dict[str, Transport] = {}
        """This worker's end of each weight transport the trainer has used (``sync/transports/``)."""

    def pid(self) -> int:
        return os.getpid()

    def gpu_uuid(self) -> str | None:
        """The UUID of the GPU this worker's ``cuda:0`` is (None without one)."""
        return str(torch.cuda.get_device_properties(0).uuid) if torch.cuda.is_available() else None

    def placement(self) -> dict[str, Any]:
        """The GPUs Ray gave this worker and the device its engine runs on (``ray_placement.report``)."""
        device = getattr(self.engine, "device", "cpu")
        return {**report(str(device)), "scrubbed": self.scrubbed}

    def version(self) -> int:
        return int(self.engine.version)

    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> int:
        """Copy the weights in place and take the trainer's version number, so every worker stamps
        its tokens with the same version."""
        self.engine.load_weights(state_dict)
        while self.engine.version < version:  # engines count their own loads; align with the pool
            self.engine.load_weights({})
        return int(self.engine.version)

    def begin_weight_update(self) -> None:
        self.engine.begin_weight_update()  # type: ignore[attr-defined]

    def receive_weights(self, transport: str, payload: Any) -> int:
        """One bucket sent by ``rollout.sync.transport=transport`` copied into the engine by that
        transport's worker end (``sync/transports/``); returns how many tensors."""
        return self._transport(transport).receive(self.engine, payload)  # type: ignore[arg-type]

    def join_weight_group(self, transport: str, *args: Any) -> Any:
        """Join the group the transport's trainer end set up (``Transport.join``)."""
        return self._transport(transport).join(*args)

    def _transport(self, name: str) -> Transport:
        if name not in self._transports:
            self._transports[name] = make_transport(name)
        return self._transports[name]

    def finish_weight_update(self, version: int) -> int:
        """The update is complete: take the pool's version (as ``load_weights`` does)."""
        self.engine.finish_weight_update()  # type: ignore[attr-defined]
        while self.engine.version < version:
            self.engine.load_weights({})
        return int(self.engine.version)

    def weight_sizes(self) -> list[tuple[str, int]]:
        """(name, bytes) of the engine's weights, for a replacement worker to copy them in buckets.
        Only an HF engine can hand its weights out (a vLLM engine keeps kernel layouts)."""
        return [(n, t.numel() * t.element_size()) for n, t in self._own_weights().items()]

    def weight_bucket(self, names: Sequence[str]) -> bytes:
        own = self._own_weights()
        return safetensors_blob({n: own[n] for n in names})

    def _own_weights(self) -> dict[str, torch.Tensor]:
        if not isinstance(self.engine, HFEngine):
            raise NotImplementedError(
                f"a {type(self.engine).__name__} cannot hand its weights to a replacement worker "
                "(only the HF engine can): with rollout.engine=vllm a replaced worker cannot be brought "
                "up to date before the next weight sync"
            )
        return self.engine.model.state_dict()

    def fingerprint(self, names: Sequence[str], probe_ids: Sequence[int]) -> list[Fingerprint]:
        return [
            dataclasses.replace(fp, source=f"pid {os.getpid()}: {fp.source}")
            for fp in self.engine.fingerprint(names, probe_ids)  # type: ignore[attr-defined]
        ]

    def run(
        self, requests: Sequence[EpisodeRequest], seed: int | None, override: SamplingOverride | None
    ) -> list:
        runner = make_runner(self.spec, self.engine, self.tokenizer, seed, override)
        try:
            return runner.run(requests)
        finally:
            runner.close()

    def generate(self, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams]) -> list:
        return self.engine.generate(prompts, params)
