"""``rollout.sync.transport: broadcast``: each bucket by a collective broadcast in a weight-sync group
of the sync's own (``weight_group.py``: gloo for tensors on the CPU, NCCL on a GPU, where every member
needs a GPU of its own). The trainer is rank 0 and hosts the group's store; worker i joins as rank
i + 1 through a Ray call. Each bucket's layout goes to every worker with the call that starts its
receive, then rank 0 broadcasts the tensors (``weight_group.send_bucket``). The group is built at the
first bucket, and again once the worker set changed (a replaced worker), the tensors' device changed,
or a broadcast failed. What has run on a GPU: docs/scaling.md ("Beyond one process per GPU")."""

from __future__ import annotations

import concurrent.futures
import time
from typing import TYPE_CHECKING, Any

import torch

from agentrl.sync import weight_group
from agentrl.sync.transports.base import Link, Transport
from agentrl.timeouts import WaitTimeout, start_thread, wait_for

if TYPE_CHECKING:
    from agentrl.engines.base import WeightReceiver

LOOPBACK = "127.0.0.1"


class Broadcast(Transport):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.group: Any = None
        """This process's member: rank 0 in the trainer, the worker's own rank in a worker."""
        self.members: list[Any] = []  # the trainer's: the workers it was built with, ranks 1..N
        self.device = torch.device("cpu")
        self.timeout_s = 0.0  # the group's: timeouts.weight_sync_s

    # -- the trainer's end --------------------------------------------------------------------------
    def send(self, link: Link, workers: list[Any], bucket: list[tuple[str, torch.Tensor]]) -> None:
        """Broadcast one bucket to ``workers``, all within ``link.left(step)`` seconds. The workers are
        idle when the calls arrive (the pool's weight update waited for everything submitted before it,
        and nothing is submitted under its lock), so each is in the collective while this sends."""
        if not bucket:
            return
        device = bucket[0][1].device
        same = len(self.members) == len(workers) and all(a is b for a, b in zip(self.members, workers))
        if self.group is None or not same or device != self.device:
            self._build(link, workers, device)
        calls = [w.receive_weights.remote(self.name, weight_group.layout(bucket)) for w in workers]
        try:
            weight_group.send_bucket(self.group, bucket, device, link.left("broadcasting a bucket"))
        except Exception as e:
            self.close()  # in an unknown state: built anew at the next bucket
            raise RuntimeError(
                f"broadcasting a weight bucket to the rollout workers failed: {type(e).__name__}: "
                f"{str(e).splitlines()[0][:300] if str(e) else ''}; the weight-sync group is rebuilt at the "
                "next sync"
            ) from e
        link.answers(calls, f"receive_weights({self.name})", link.left("receiving a bucket"), link.setting())

    def _build(self, link: Link, workers: list[Any], device: torch.device) -> None:
        """Build the group: this process in a thread, the workers by Ray calls. The join may take half
        of ``link.timeout_s`` (the buckets have the rest), so a worker that does not join is named
        before the sync's own limit passes; it is killed (the pool replaces it before the next run)
        and the sync raises ``WaitTimeout``."""
        import ray

        self.close()
        self.timeout_s = link.timeout_s
        size, limit = len(workers) + 1, self.timeout_s / 2
        host = ray.util.get_node_ip_address() if link.cluster else LOOPBACK
        t0 = time.monotonic()
        store = weight_group.host_store(host, size, self.timeout_s)
        calls = [
            w.join_weight_group.remote(self.name, host, store.port, i + 1, size, device.type, self.timeout_s)
            for i, w in enumerate(workers)
        ]
        mine: concurrent.futures.Future = concurrent.futures.Future()

        def join() -> None:  # through a connection of its own: a store's client waits one call at a time
            try:
                client = weight_group.client_store(host, store.port, 0, self.timeout_s)
                mine.set_result(weight_group.make_group(client, 0, size, device, self.timeout_s))
            except BaseException as e:  # handed to the waiting sync
                mine.set_exception(e)

        start_thread(join, "agentrl-weight-group")
        setting = f"half of timeouts.weight_sync_s={self.timeout_s:g}s"
        done, _ = ray.wait(calls, num_returns=len(calls), timeout=limit)
        if len(done) < len(calls):
            late = [i for i, c in enumerate(calls) if c not in set(done)]
            # the workers that never began to join hold the others up; blame those when there are some
            started = weight_group.joined(store, [i + 1 for i in late])
            stuck = [i for i, ok in zip(late, started) if not ok] or late
            for i in stuck:
                ray.kill(workers[i], no_restart=True)
            link.events.append(f"killed rollout workers {stuck}: did not join the weight-sync group")
            raise WaitTimeout(
                f"rollout workers {stuck} joining the weight-sync group (rollout.sync.transport={self.name})",
                time.monotonic() - t0,
                setting,
                note="; killed them (replaced before the next run_episodes)",
            )
        for i, c in enumerate(calls):
            try:
                ray.get(c)
            except Exception as e:
                raise RuntimeError(
                    f"rollout worker {i} could not join the weight-sync group: {type(e).__name__}: "
                    f"{str(e).splitlines()[0][:300] if str(e) else ''}"
                ) from e
        left = limit - (time.monotonic() - t0)
        what = "the trainer joining the weight-sync group"
        self.group = wait_for(mine, left, what, setting, "; the join is abandoned")
        self.members, self.device = list(workers), device

    def close(self) -> None:
        if self.group is not None:
            weight_group.leave(self.group)
        self.group, self.members = None, []

    # -- a worker's end -----------------------------------------------------------------------------
    def join(self, host: str, port: int, rank: int, size: int, device_type: str, timeout_s: float) -> int:
        """Join the trainer's group as ``rank``, leaving the one this worker was in; the tensors
        arrive on the CPU (gloo) or this process's GPU (NCCL)."""
        self.close()
        device = (
            torch.device("cuda", torch.cuda.current_device())
            if device_type == "cuda"
            else torch.device("cpu")
        )
        store = weight_group.client_store(host, port, rank, timeout_s)
        self.group = weight_group.make_group(store, rank, size, device, timeout_s)
        self.device, self.timeout_s = device, timeout_s
        return rank

    def receive(self, engine: WeightReceiver, payload: Any) -> int:
        """``payload``: the bucket's layout; the trainer starts this call before it broadcasts."""
        if self.group is None:
            raise RuntimeError("this worker is in no weight-sync group: the trainer did not join it")
        bucket = weight_group.receive_bucket(self.group, payload, self.device, self.timeout_s)
        engine.load_weight_bucket(bucket)
        return len(bucket)
