"""Engines that span trainer ranks, and ranks that hold none.

**A colocated vLLM engine with tensor parallelism tp > 1** spans tp consecutive trainer ranks
(vLLM's ``external_launcher``: each rank's ``vllm.LLM`` holds one slice of the weights, and every
generation is a collective that all ranks of the group must call with the same requests, in the same
order, with the same seeds). The group's first rank, its leader (``LeaderEngine``), runs the group's
share of the episodes; each generation call it makes is first sent to the other ranks of the group,
its followers (``FollowerEngine``), which make the same call on their slice and drop the result. A
follower waits in ``follow`` until the leader releases it at the end of the batch (``release``).
Every request carries a resolved seed, so each rank samples the same tokens.

The requests travel over a gloo group of the engine's ranks whose timeout is the wait for a step's
episodes (``timeouts.data_wait_s``): between two calls a follower waits through the leader's
environment steps. Weight updates and fingerprints go to each rank's own engine, as without
tensor parallelism: every rank loads its slice from the full tensors the trainer streams.

**A rank without an engine** (``AbsentEngine``): with Ray rollout workers, trainer rank 0 owns the
pool and runs every episode. The other ranks take each weight update (under FSDP2 the stream is a
collective every rank must consume in step with rank 0) and drop it, and count versions like the pool.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch.distributed as dist

from agentrl.engines.base import (
    Bucket,
    Completion,
    Engine,
    Fingerprint,
    SamplingParams,
    Weights,
    per_prompt_params,
    weight_items,
)

GENERATE, DONE = "generate", "done"


class _Member:
    """What leader and follower share: the engine they wrap, their group and its leader's rank."""

    def __init__(self, engine: Engine, group: Any, leader: int) -> None:
        self.engine, self.group, self.leader = engine, group, leader

    @property
    def version(self) -> int:
        return self.engine.version

    def load_weights(self, weights: Weights) -> int:
        return self.engine.load_weights(weights)

    def __getattr__(self, name: str) -> Any:
        if name == "submit":  # vLLM's own scheduler would step the engine outside the group's calls
            raise AttributeError(name)
        return getattr(self.engine, name)


class LeaderEngine(_Member):
    """The group's first rank: generates, and first sends every call to the followers."""

    def __init__(self, engine: Engine, group: Any, leader: int, seed: int = 0) -> None:
        super().__init__(engine, group, leader)
        self._seeds = random.Random(seed)

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[Completion]:
        plist = [
            sp if sp.seed is not None else replace(sp, seed=self._seeds.getrandbits(62))
            for sp in per_prompt_params(prompts, params)
        ]
        prompts = [list(p) for p in prompts]
        self._send((GENERATE, prompts, plist))
        return self.engine.generate(prompts, plist)

    def release(self) -> None:
        """The batch is done: the followers return from ``follow``."""
        self._send((DONE,))

    def _send(self, message: tuple) -> None:
        dist.broadcast_object_list([message], src=self.leader, group=self.group)


class FollowerEngine(_Member):
    """Another rank of the group: generates only what the leader sends (``follow``)."""

    def generate(self, prompts: Any, params: Any) -> list[Completion]:
        raise RuntimeError(
            "this rank follows the leader of its tensor-parallel vLLM group: it generates only the calls "
            "the leader sends (FollowerEngine.follow), never its own"
        )

    def follow(self) -> int:
        """Make the leader's generation calls until it releases this rank; how many were made."""
        calls = 0
        while True:
            box: list[Any] = [None]
            dist.broadcast_object_list(box, src=self.leader, group=self.group)
            message = box[0]
            if message[0] == DONE:
                return calls
            _, prompts, plist = message
            self.engine.generate(prompts, plist)
            calls += 1


class AbsentEngine:
    """No engine on this rank: its episodes run on rank 0's Ray pool (module docstring)."""

    def __init__(self) -> None:
        self._version = 0

    @property
    def version(self) -> int:
        return self._version

    def generate(self, prompts: Any, params: Any) -> list[Completion]:
        raise RuntimeError(
            "this trainer rank holds no engine: with rollout.workers > 0, trainer rank 0 runs every episode "
            "on the Ray pool"
        )

    def load_weights(self, weights: Weights) -> int:
        for _ in weight_items(weights):  # consumed in step with rank 0 (a collective under FSDP2)
            pass
        self._version += 1
        return self._version

    def begin_weight_update(self) -> None:
        pass

    def load_weight_bucket(self, bucket: Bucket) -> None:
        pass

    def finish_weight_update(self) -> int:
        self._version += 1
        return self._version

    def fingerprint(self, names: Sequence[str], probe_ids: Sequence[int]) -> list[Fingerprint]:
        return []  # rank 0 checks the pool's workers
