"""Where Ray puts the rollout workers, and what each one sees (``parallel/placement.py`` decides).

- **A local Ray** (no ``rollout.ray_address``) starts on loopback and is given the GPUs the placement
  lists for it (``Placement.ray_gpus``: the node's GPUs no trainer rank uses, or the trainer's own
  when workers take a fraction of one): ``CUDA_VISIBLE_DEVICES`` names them while Ray starts, so the
  GPU ids Ray hands out are those physical GPUs, and ``num_gpus`` counts them.
- **One placement group** of one bundle per worker, ``{CPU: 1, GPU: rollout.worker_gpus}`` (no GPU
  entry at 0), with Ray's PACK or SPREAD strategy (``rollout.worker_placement``). Worker i is
  scheduled on bundle i; a replacement takes the same bundle, and so the same GPUs, again. The group
  must be ready within the pool's call limit, else ``WaitTimeout`` says what was asked and what the
  cluster has; a local Ray with fewer GPUs than the workers ask for is refused before that (a
  cluster's autoscaler may still add them).
- **A worker's process** is not a trainer rank: Ray starts it from the environment of the process
  that started Ray (torchrun's rank 0), so ``scrub_launcher_env`` removes torchrun's variables
  (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``...) before the worker builds its engine:
  its engine takes ``cuda:0``, the first GPU Ray made visible, and vLLM starts as a process of its own
  (``engines/factory.py: vllm_distributed``), not as a member of the trainer's group.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

from agentrl.sync.transports.broadcast import LOOPBACK
from agentrl.timeouts import WaitTimeout

LAUNCHER_ENV = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_ERROR_FILE",
)
"""What torchrun sets for its ranks; a rollout worker is none of them."""


def init_ray(address: str | None = None, num_cpus: int | None = None, gpus: Sequence[int] = ()) -> None:
    """Join the cluster at ``address`` (``auto``, ``ray://host:port``) or start a local Ray bound to
    loopback only, given the GPUs ``gpus`` (indices among those this process sees). A no-op when
    Ray is already initialised (e.g. by the user's driver script, or a test declaring GPUs)."""
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    if address:
        ray.init(address=address, log_to_driver=True)
        return
    kwargs: dict[str, Any] = {}
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    if gpus:
        kwargs["num_gpus"] = len(gpus)
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(physical_gpus(gpus, before))
    try:
        ray.init(
            num_cpus=num_cpus or os.cpu_count(),
            include_dashboard=False,
            _node_ip_address=LOOPBACK,
            log_to_driver=True,
            **kwargs,
        )
    finally:  # Ray has read it; this process keeps its own view of the GPUs
        if before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before


def physical_gpus(indices: Sequence[int], visible: str | None) -> list[str]:
    """The ids Ray must be given for GPU ``indices`` of this process: the same numbers, or the entries
    of this process's own ``CUDA_VISIBLE_DEVICES`` at those positions."""
    if not visible:
        return [str(i) for i in indices]
    ids = [v.strip() for v in visible.split(",") if v.strip()]
    if max(indices, default=-1) >= len(ids):
        raise ValueError(
            f"GPU indices {list(indices)} but CUDA_VISIBLE_DEVICES={visible!r} makes only {len(ids)} visible"
        )
    return [ids[i] for i in indices]


class Reservation:
    """The workers' placement group: ``bundles`` of ``{CPU: 1, GPU: worker_gpus}``, one per worker."""

    def __init__(
        self, workers: int, worker_gpus: float, strategy: str, timeout_s: float, cluster: bool = False
    ) -> None:
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group

        self.worker_gpus = worker_gpus
        need = workers * worker_gpus
        have = float(ray.cluster_resources().get("GPU", 0.0))
        if need > have + 1e-9 and not cluster:  # a cluster may scale up: its wait is bounded below
            raise ValueError(
                f"rollout.workers={workers} at rollout.worker_gpus={worker_gpus:g} ask Ray for {need:g} GPU(s), "
                f"but this Ray cluster has {have:g} (a local Ray is given the GPUs `agentrl plan` lists for it): "
                "fewer rollout.workers, a smaller rollout.worker_gpus, or rollout.worker_gpus=0 for workers "
                "without a GPU on a CPU run"
            )
        bundle = {"CPU": 1.0, **({"GPU": worker_gpus} if worker_gpus > 0 else {})}
        self.group = placement_group([dict(bundle) for _ in range(workers)], strategy=strategy.upper())
        t0 = time.monotonic()
        ready, _ = ray.wait([self.group.ready()], timeout=timeout_s)
        if not ready:
            remove_placement_group(self.group)
            raise WaitTimeout(
                f"Ray placing {workers} rollout worker bundle(s) {bundle} ({strategy.upper()}); the cluster "
                f"has {ray.available_resources()}",
                time.monotonic() - t0,
                f"timeouts.ray_call_s={timeout_s:g}s",
                note="; removed the placement group",
            )

    def options(self, bundle: int) -> dict[str, Any]:
        """The actor options that put a worker on ``bundle`` with its GPUs."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return {
            "num_cpus": 1,
            "num_gpus": self.worker_gpus,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                self.group, placement_group_bundle_index=bundle
            ),
        }

    def release(self) -> None:
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(self.group)


def scrub_launcher_env() -> list[str]:
    """Remove torchrun's variables from this (worker) process; the names removed."""
    return [name for name in LAUNCHER_ENV if os.environ.pop(name, None) is not None]


def report(engine_device: str) -> dict[str, Any]:
    """What a worker was given and what its engine binds to: the GPU ids Ray assigned, the
    ``CUDA_VISIBLE_DEVICES`` Ray set, the engine's device, and the physical GPU that ``cuda:0`` is in
    this process (the one a CUDA engine here binds to: ``device_of`` gives a worker ``cuda:0`` once
    ``LOCAL_RANK`` is gone)."""
    import ray

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return {
        "pid": os.getpid(),
        "ray_gpu_ids": [str(g) for g in ray.get_gpu_ids()],
        "cuda_visible_devices": visible,
        "engine_device": engine_device,
        "cuda_0_is_gpu": physical_gpus([0], visible)[0] if visible else None,
        "launcher_env": [n for n in LAUNCHER_ENV if n in os.environ],
    }
