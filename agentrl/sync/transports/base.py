"""A weight transport: how a bucket of the trainer's weights reaches the engines of Ray rollout
workers (``rollout.sync.transport``). One class holds both ends, as verl's ``CheckpointEngine`` does;
the trainer makes one (``sync/ray_pool.py``: ``PoolWeights``) and so does every worker, at the first
call naming it (``rollout/ray_workers.py``: ``RolloutWorker``). One update, the two processes' calls
one under the other:

    trainer (PoolWeights)                               each worker (RolloutWorker)
    t = registry.make_transport(name)
    w.begin_weight_update() for every w                 engine.begin_weight_update()
    t.send(link, workers, bucket)   per bucket
      [a group transport, once: w.join_weight_group(name, *args)
                                                   ->   t = registry.make_transport(name); t.join(*args)]
      w.receive_weights(name, payload)             ->   t.receive(engine, payload): the bucket
                                                          copied into the engine, before answering
    w.finish_weight_update(version) for every w        engine.finish_weight_update()
    t.close()                       pool shutdown

The pool holds its lock from begin to finish, waits for the answers (``Link.answers``) within
``timeouts.weight_sync_s`` (``Link.left``), and casts floating tensors to the engines' dtype before
``send``. What a placement must give a transport (a GPU per member, the trainer's GPU) is its record's
(``sync/registry.py``); a new transport is a subclass in a file of its own plus that record.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

    from agentrl.engines.base import WeightReceiver

Answers = Callable[..., list]
"""``(calls, what, limit_s, setting) -> answers``: the pool's wait for its workers' replies."""


@dataclass(frozen=True)
class Link:
    """What a transport's trainer end may use of the pool it sends for."""

    timeout_s: float
    """``timeouts.weight_sync_s``: the whole update."""
    cluster: bool
    """The workers run on a Ray cluster (``rollout.ray_address``), not on this node's loopback."""
    answers: Answers
    left: Callable[[str], float]
    """``left(step)``: seconds left of the update's limit; raises ``WaitTimeout`` naming ``step``."""
    setting: Callable[[], str]
    """The limit, as error messages name it."""
    events: list[str]
    """The pool's log of worker deaths, kills and replacements."""


class Transport:
    """Both ends of one transport; ``name`` is its ``rollout.sync.transport`` value."""

    def __init__(self, name: str) -> None:
        self.name = name

    # -- the trainer's end --------------------------------------------------------------------------
    def send(self, link: Link, workers: list[Any], bucket: list[tuple[str, Tensor]]) -> None:
        """Bring one bucket into every worker's engine (each worker's ``receive_weights`` answered)."""
        raise NotImplementedError

    def close(self) -> None:
        """The pool shuts down: let go of what this end holds (a group)."""

    # -- a worker's end -----------------------------------------------------------------------------
    def receive(self, engine: WeightReceiver, payload: Any) -> int:
        """``payload`` (what ``send`` handed this worker) copied into ``engine``; how many tensors."""
        raise NotImplementedError

    def join(self, *args: Any) -> Any:
        """Join what the trainer's end set up (a group), leaving any this worker was in."""
        raise NotImplementedError(f"rollout.sync.transport={self.name} has no group to join")
