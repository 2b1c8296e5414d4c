"""The trainer's side of the weight-sync group with Ray rollout workers (``rollout.sync.transport:
broadcast``): this process is rank 0 and hosts the group's store; worker i joins as rank i + 1 through
a Ray call. Each bucket's layout goes to every worker with the call that starts its receive, then
rank 0 broadcasts the tensors (``weight_group.send_bucket``). The group is built at the first
bucket, and again once the worker set changed (a replaced worker), the tensors' device changed, or a
broadcast failed. ``RolloutPool`` (``rollout/ray_workers.py``) drives it inside a weight update."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from typing import Any

import torch

from agentrl.sync import weight_group
from agentrl.timeouts import WaitTimeout, start_thread, wait_for

LOOPBACK = "127.0.0.1"

Answers = Callable[..., list]
"""``(calls, what, limit_s, setting) -> answers``: the pool's wait for its workers' replies."""


class BroadcastGroup:
    def __init__(self, timeout_s: float, cluster: bool) -> None:
        self.timeout_s = timeout_s
        """``timeouts.weight_sync_s``: the whole sync; the join may take half."""
        self.cluster = cluster  # a pool in a Ray cluster: the store listens on this node's IP
        self.group: Any = None
        """This process's member (rank 0), once built."""
        self.members: list[Any] = []  # the workers it was built with: ranks 1..N
        self.device = torch.device("cpu")

    def send(
        self,
        workers: list[Any],
        bucket: list[tuple[str, torch.Tensor]],
        left: Callable[[str], float],
        answers: Answers,
        setting: str,
        events: list[str],
    ) -> None:
        """Broadcast one bucket to ``workers``, all within ``left(step)`` seconds. The workers are idle
        when the calls arrive (the pool's weight update waited for everything submitted before it,
        and nothing is submitted under its lock), so each is in the collective while this sends."""
        if not bucket:
            return
        device = bucket[0][1].device
        same = len(self.members) == len(workers) and all(a is b for a, b in zip(self.members, workers))
        if self.group is None or not same or device != self.device:
            self.join(workers, device, events)
        calls = [w.receive_weight_bucket.remote(weight_group.layout(bucket)) for w in workers]
        try:
            weight_group.send_bucket(self.group, bucket, device, left("broadcasting a bucket"))
        except Exception as e:
            self.leave()  # in an unknown state: built anew at the next bucket
            raise RuntimeError(
                f"broadcasting a weight bucket to the rollout workers failed: {type(e).__name__}: "
                f"{str(e).splitlines()[0][:300] if str(e) else ''}; the weight-sync group is rebuilt at the "
                "next sync"
            ) from e
        answers(calls, "receive_weight_bucket", left("receiving a bucket"), setting)

    def join(self, workers: list[Any], device: torch.device, events: list[str]) -> None:
        """Build the group: this process in a thread, the workers by Ray calls. The join may take half
        of ``timeout_s`` (the buckets have the rest), so a worker that does not join is named before
        the sync's own limit passes; it is killed (the pool replaces it before the next run) and the
        sync raises ``WaitTimeout``."""
        import ray

        self.leave()
        size, limit = len(workers) + 1, self.timeout_s / 2
        host = ray.util.get_node_ip_address() if self.cluster else LOOPBACK
        t0 = time.monotonic()
        store = weight_group.host_store(host, size, self.timeout_s)
        calls = [
            w.join_weight_group.remote(host, store.port, i + 1, size, device.type, self.timeout_s)
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
            events.append(f"killed rollout workers {stuck}: did not join the weight-sync group")
            raise WaitTimeout(
                f"rollout workers {stuck} joining the weight-sync group (rollout.sync.transport=broadcast)",
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

    def leave(self) -> None:
        if self.group is not None:
            weight_group.leave(self.group)
        self.group, self.members = None, []
