"""Where every process of a run lives: one decision, made before anything starts.

``place(launch, rollouts)`` takes the launch (nodes, GPUs per node, torchrun's ranks per node) and
the rollout settings (engine, tensor parallelism, Ray workers and their GPUs, the weight transport)
and returns a ``Placement``: every trainer rank and rollout worker with the node and GPUs it sees,
every engine with the process that hosts it and the trainer ranks it spans, the process groups,
the GPUs a local Ray is given, the ranks that run episodes, and the problems that make the map
unworkable, each naming the setting to change. ``agentrl plan`` prints it beside the memory terms;
the trainer builds it from the real launch and refuses a map with problems before any work; the
Ray pool reserves what it says.

The rules, each a consequence of how the pieces run:

- **Trainer ranks.** torchrun starts ``ranks_per_node`` ranks on every node; on CUDA rank r of node n
  uses GPU ``LOCAL_RANK`` (``ranks.init_from_env``), so a node needs at least as many GPUs as ranks.
- **Colocated engines** (``rollout.workers: 0``): every rank has an engine on its own GPU. A vLLM
  engine with tensor parallelism tp spans tp consecutive ranks of one node (vLLM's
  ``external_launcher``: its tensor-parallel groups are consecutive ranks of torch's world), so tp
  must divide the ranks per node; the group's first rank (its leader) runs the group's episodes and
  the others follow its generation calls. The HF engine has no tensor parallelism.
- **Ray workers** (``rollout.workers: N``): one placement group of N bundles, ``{CPU: 1, GPU:
  worker_gpus}`` each (``rollout.worker_placement``: Ray's PACK or SPREAD). A local Ray (no
  ``rollout.ray_address``) runs on the first node and is given that node's GPUs no trainer rank uses,
  or, when the trainer uses them all, the trainer's own GPUs (then only a fraction of a GPU per worker
  fits beside the trainer). On a cluster, Ray places the workers on its own GPUs. Trainer rank 0 owns
  the pool and runs every episode; the other ranks receive them.
- **Weights to the workers** (``rollout.sync.transport``): what a transport needs is its record's
  (``sync/registry.py``): ``own_gpu_each`` (``broadcast`` over NCCL: every member of its group on a
  GPU of its own, as NCCL refuses two ranks on one device), ``trainer_gpu`` (``cuda_ipc``: every
  worker on trainer rank 0's GPU); ``object_store`` needs neither and works for any map.

A CPU run (``gpus_per_node`` 0) has no GPU rules; its broadcast group uses gloo.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from agentrl.engines.registry import EngineRecord, engine_record
from agentrl.sync.registry import OBJECT_STORE, TRANSPORTS, TransportRecord, transport_record


@dataclass(frozen=True)
class Launch:
    """How the trainer is launched: ``nodes`` × ``ranks_per_node`` ranks (torchrun's
    ``--nnodes``/``--nproc_per_node``) on nodes of ``gpus_per_node`` GPUs (0: a CPU run)."""

    nodes: int = 1
    gpus_per_node: int = 0
    ranks_per_node: int = 1

    @property
    def world(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def cuda(self) -> bool:
        return self.gpus_per_node > 0


def launch_from_env(cuda: bool) -> Launch:
    """This process's launch: torchrun's ``WORLD_SIZE`` and ``LOCAL_WORLD_SIZE`` (one process
    without them) and, on CUDA, the GPUs torch sees on this node."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    gpus = 0
    if cuda:
        import torch

        gpus = torch.cuda.device_count()
    return Launch(nodes=max(world // max(per_node, 1), 1), gpus_per_node=gpus, ranks_per_node=per_node)


@dataclass(frozen=True)
class Rollouts:
    """The rollout settings placement reads (``rollout.*``, resolved)."""

    engine: str = "hf"
    """``rollout.engine``: a name in ``engines/registry.py``."""
    tensor_parallel: int = 1
    """``rollout.vllm.tensor_parallel_size`` (an engine whose record splits it, ``tp``)."""
    workers: int = 0
    worker_gpus: float = 0.0
    """GPUs per Ray worker, resolved (``rollout.worker_gpus``)."""
    worker_placement: Literal["pack", "spread"] = "pack"
    transport: str = OBJECT_STORE
    """``rollout.sync.transport``: a name in ``sync/registry.py``'s ``TRANSPORTS``."""
    cluster: bool = False
    """``rollout.ray_address`` is set: the workers run on a Ray cluster's GPUs."""

    @property
    def tp(self) -> int:
        return self.tensor_parallel if self.record.tensor_parallel else 1

    @property
    def record(self) -> EngineRecord:
        return engine_record(self.engine)


@dataclass(frozen=True)
class Slot:
    """One process: where it runs and the GPUs it sees (node-local ids; empty on the CPU or where a
    Ray cluster decides). ``share``: the fraction of each of those GPUs it asks for."""

    name: str
    node: int | None
    gpus: tuple[int, ...]
    share: float = 1.0


@dataclass(frozen=True)
class EngineSite:
    """One engine: the process hosting it, the trainer ranks it spans (a colocated engine) and its
    GPUs."""

    name: str
    kind: str
    host: str
    node: int | None
    gpus: tuple[int, ...]
    ranks: tuple[int, ...] = ()
    """The trainer ranks whose processes hold a part of it (colocated); the first one leads."""


@dataclass(frozen=True)
class Group:
    """A process group (or a transport standing for one) and its members."""

    name: str
    members: tuple[str, ...]
    backend: str


@dataclass(frozen=True)
class Problem:
    """Why the map cannot work, and the setting that changes it."""

    key: str
    message: str


@dataclass
class Placement:
    launch: Launch
    rollouts: Rollouts
    trainers: list[Slot] = field(default_factory=list)
    workers: list[Slot] = field(default_factory=list)
    engines: list[EngineSite] = field(default_factory=list)
    groups: list[Group] = field(default_factory=list)
    ray_gpus: tuple[int, ...] = ()
    """GPUs of the first node a local Ray is given (``CUDA_VISIBLE_DEVICES`` when it starts)."""
    episode_ranks: tuple[int, ...] = (0,)
    """Trainer ranks that run episodes (on their engine or the pool); the others receive them."""
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def on_gpu(self, node: int, gpu: int) -> list[Slot]:
        """The processes that use GPU ``gpu`` of ``node``."""
        return [s for s in self.trainers + self.workers if s.node == node and gpu in s.gpus]

    def engine_of(self, rank: int) -> EngineSite | None:
        """The colocated engine trainer ``rank`` holds a part of (None with Ray workers)."""
        return next((e for e in self.engines if rank in e.ranks), None)


def place(launch: Launch, ro: Rollouts) -> Placement:
    """The process map of ``launch`` with rollouts ``ro`` (module docstring: the rules)."""
    p = Placement(launch, ro)
    T, G = launch.ranks_per_node, launch.gpus_per_node
    if launch.cuda and T > G:
        p.problems.append(
            Problem(
                "--gpus / torchrun --nproc_per_node",
                f"{T} trainer ranks per node but {G} GPU(s) per node: each rank takes the GPU of its "
                f"LOCAL_RANK, so ranks {G}..{T - 1} of every node would have none; start at most {G} ranks "
                "per node",
            )
        )
    for r in range(launch.world):
        node, local = divmod(r, T)
        p.trainers.append(Slot(f"trainer rank {r}", node, (local,) if launch.cuda else ()))
    backend = "NCCL" if launch.cuda else "gloo"
    p.groups.append(Group("trainer (DDP / FSDP2 collectives)", tuple(s.name for s in p.trainers), backend))
    if ro.workers == 0:
        _colocated(p)
    else:
        _workers(p)
    return p


def _colocated(p: Placement) -> None:
    """Every rank's engine on its own GPU; a vLLM engine with tp > 1 over tp consecutive ranks."""
    ro, T, tp = p.rollouts, p.launch.ranks_per_node, p.rollouts.tp
    if T % tp:
        valid = [d for d in range(1, T + 1) if T % d == 0]
        p.problems.append(
            Problem(
                "rollout.vllm.tensor_parallel_size",
                f"rollout.vllm.tensor_parallel_size={tp} does not divide the {T} trainer ranks per node: a "
                "colocated vLLM engine spans tp consecutive ranks of one node (vLLM's external_launcher). "
                f"Valid for {T} ranks per node: {valid}; or rollout.workers > 0 to put the engines on GPUs "
                "of their own",
            )
        )
        tp = 1
    kind = ro.record.label
    leaders = []
    for k in range(p.launch.world // tp):
        ranks = tuple(range(k * tp, (k + 1) * tp))
        first = p.trainers[ranks[0]]
        gpus = tuple(g for r in ranks for g in p.trainers[r].gpus)
        p.engines.append(EngineSite(f"{kind} engine {k}", kind, first.name, first.node, gpus, ranks))
        leaders.append(ranks[0])
        if tp > 1:
            names = tuple(p.trainers[r].name for r in ranks)
            p.groups.append(Group(f"{kind} tensor parallel {k}", names, "NCCL" if p.launch.cuda else "gloo"))
    p.episode_ranks = tuple(leaders)
    p.groups.append(Group("weight sync: each rank into its own engine", (), "in process"))


def _workers(p: Placement) -> None:
    """N Ray workers in one placement group; trainer rank 0 owns them."""
    ro, launch = p.rollouts, p.launch
    w, n = ro.worker_gpus, ro.workers
    kind = ro.record.label
    p.problems += _worker_gpu_problems(launch, ro)
    p.episode_ranks = (0,)
    if ro.cluster or not launch.cuda or w == 0:  # the cluster places them; or no GPUs to place
        for i in range(n):
            p.workers.append(Slot(f"rollout worker {i}", None if ro.cluster else 0, (), w))
    else:
        T, G = launch.ranks_per_node, launch.gpus_per_node
        free = tuple(range(T, G))
        if not free and w < 1:  # a fraction of a GPU fits beside a trainer rank
            free = tuple(range(G))
        p.ray_gpus = free
        slots = _assign(n, w, free, ro.worker_placement)
        if slots is None:
            per_gpu = f"{math.floor(1 / w)} per GPU" if w < 1 else f"{int(w)} GPU(s) each"
            if free and free[0] >= T:
                where = f"the {len(free)} GPU(s) of node 0 no trainer rank uses ({list(free)})"
            elif free:
                where = f"node 0's {G} GPU(s), shared with the trainer (every GPU has a trainer rank)"
            else:
                where = (
                    f"no GPU: all {G} of node 0 hold a trainer rank, and a whole-GPU worker cannot share one"
                )
            p.problems.append(
                Problem(
                    "rollout.workers",
                    f"rollout.workers={n} at rollout.worker_gpus={w:g} ({per_gpu}) need more GPUs than a local "
                    f"Ray has: it gets {where}. Fewer rollout.workers, a smaller rollout.worker_gpus, fewer "
                    "trainer ranks per node, or rollout.ray_address to use a cluster's GPUs",
                )
            )
            slots = [()] * n
        for i, gpus in enumerate(slots):
            p.workers.append(Slot(f"rollout worker {i}", 0, gpus, w / max(len(gpus), 1)))
    for s in p.workers:
        p.engines.append(EngineSite(f"{kind} engine of {s.name}", kind, s.name, s.node, s.gpus))
    p.problems += _transport_problems(p)
    members = ("trainer rank 0", *(s.name for s in p.workers))
    backend = transport_record(ro.transport).route_for(launch.cuda)
    p.groups.append(Group("weight sync: trainer rank 0 to the workers", members, backend))


def start_waves(p: Placement) -> list[list[int]]:
    """The Ray workers in the order they start: waves in which no two workers share a GPU, each
    wave started once the one before has loaded. Two vLLM engines that profile one GPU's memory at
    the same moment each count the other's allocations as their own, and one ends with a smaller
    KV cache or none. Workers on GPUs of their own (or none) start together; a cluster's workers
    with a fraction of a GPU each (which may share one; the cluster decides) one at a time."""
    waves: list[list[int]] = []
    gpus: list[set[int] | None] = []  # each wave's GPUs; None: a wave that must stay alone
    for i, slot in enumerate(p.workers):
        unknown = slot.node is None and p.launch.cuda and 0 < p.rollouts.worker_gpus < 1
        fits = [k for k, g in enumerate(gpus) if g is not None and not g & set(slot.gpus)]
        if unknown or not fits:
            waves.append([i])
            gpus.append(None if unknown else set(slot.gpus))
        else:
            waves[fits[0]].append(i)
            gpus[fits[0]] |= set(slot.gpus)  # type: ignore[operator]
    return waves


def _worker_gpu_problems(launch: Launch, ro: Rollouts) -> list[Problem]:
    w, out = ro.worker_gpus, []
    if launch.cuda and w == 0:
        out.append(
            Problem(
                "rollout.worker_gpus",
                "rollout.worker_gpus=0 on a CUDA run: Ray would give the workers no GPU (an empty "
                "CUDA_VISIBLE_DEVICES), so their engines could not run on one; set rollout.worker_gpus "
                "(1, or a fraction such as 0.5 to share a GPU)",
            )
        )
    if w > 1 and w != int(w):
        out.append(
            Problem(
                "rollout.worker_gpus",
                f"rollout.worker_gpus={w:g}: a worker takes a fraction of one GPU or a whole number of GPUs",
            )
        )
    if ro.tp > 1 and w != ro.tensor_parallel:
        out.append(
            Problem(
                "rollout.worker_gpus",
                f"rollout.vllm.tensor_parallel_size={ro.tensor_parallel} in a Ray worker needs that many GPUs "
                f"of its own: set rollout.worker_gpus={ro.tensor_parallel} (it is {w:g})",
            )
        )
    return out


def _assign(n: int, w: float, gpus: tuple[int, ...], how: str) -> list[tuple[int, ...]] | None:
    """The GPUs of each of ``n`` workers asking for ``w`` GPUs each among ``gpus``: whole GPUs in
    order, or fractions packed ``floor(1/w)`` to a GPU (``pack``: fill one GPU, then the next;
    ``spread``: one per GPU in turn). None when they do not fit."""
    if w >= 1:
        k = int(w)
        if n * k > len(gpus):
            return None
        return [gpus[i * k : (i + 1) * k] for i in range(n)]
    per = math.floor(1 / w + 1e-9)
    if n > per * len(gpus):
        return None
    if how == "spread":
        return [(gpus[i % len(gpus)],) for i in range(n)]
    return [(gpus[i // per],) for i in range(n)]


def _transport_problems(p: Placement) -> list[Problem]:
    """What the transport's record asks of the GPUs (``own_gpu_each``, ``trainer_gpu``) that this map
    does not give; the other transports that would do are named."""
    ro, launch = p.rollouts, p.launch
    if not launch.cuda or ro.cluster:
        return []
    record, rank0 = transport_record(ro.transport), set(p.trainers[0].gpus)
    key, out = "rollout.sync.transport", []
    if record.own_gpu_each:
        seen: dict[int, str] = {g: "trainer rank 0" for g in rank0}
        for s in p.workers:
            for g in s.gpus:
                if g in seen:
                    out.append(
                        Problem(
                            key,
                            f"{key}={ro.transport} ({record.route_for(True)}) needs every member on a GPU of its "
                            f"own, but {s.name} shares GPU {g} with {seen[g]}: use {key}="
                            f"{_others(lambda r: not r.own_gpu_each)}, or rollout.worker_gpus=1",
                        )
                    )
                    break
                seen[g] = s.name
    if record.trainer_gpu:
        away = [s.name for s in p.workers if not set(s.gpus) <= rank0 or not s.gpus]
        if away:
            out.append(
                Problem(
                    key,
                    f"{key}={ro.transport} ({record.route_for(True)}) needs every worker on trainer rank 0's "
                    f"GPU; {', '.join(away)} run(s) elsewhere: use {key}={_others(lambda r: not r.trainer_gpu)}",
                )
            )
    return out


def _others(fits: Callable[[TransportRecord], bool]) -> str:
    """The registered transports that ``fits``, as a message names them."""
    return " or ".join(name for name, r in TRANSPORTS.items() if fits(r))


def _span(values: list[int]) -> str:
    """``0-7`` for a run of consecutive integers, else the list."""
    if values and values == list(range(values[0], values[-1] + 1)) and len(values) > 2:
        return f"{values[0]}-{values[-1]}"
    return ",".join(map(str, values))


def render(p: Placement, command: str | None = None) -> list[str]:
    """The map as lines: the launch, the trainer ranks, the engines, the workers, the groups."""
    L, ro = p.launch, p.rollouts
    where = f"{L.nodes} node(s) × {L.gpus_per_node} GPU(s)" if L.cuda else f"{L.nodes} node(s), CPU"
    lines = [f"placement: {where}; {L.world} trainer rank(s), {L.ranks_per_node} per node"]
    if command:
        lines.append(f"  launch: {command}")
    gpu = f"GPU = LOCAL_RANK (0..{L.ranks_per_node - 1})" if L.cuda else "CPU"
    lines.append(f"  trainer ranks 0-{L.world - 1}: node = rank // {L.ranks_per_node}, {gpu}")
    if ro.workers == 0:
        tp = ro.tp if L.ranks_per_node % ro.tp == 0 else 1
        how = (
            f"vLLM engines of tensor parallelism {tp}, one per {tp} consecutive ranks (external_launcher); "
            f"leaders {_span(list(p.episode_ranks))} run the episodes, the others follow their generation calls"
            if tp > 1
            else f"one {p.engines[0].kind if p.engines else ''} engine per rank, on the rank's GPU"
            + (f" ({ro.record.rank_launcher})" if ro.record.rank_launcher and L.world > 1 else "")
            + "; each rank runs its share of the episodes"
        )
        lines.append(f"  engines: {len(p.engines)}: {how}")
    else:
        lines.append(
            f"  rollout workers 0-{ro.workers - 1}: Ray placement group of {ro.workers} bundle(s) "
            f"{{CPU: 1, GPU: {ro.worker_gpus:g}}}, {ro.worker_placement.upper()}"
            + (f"; a local Ray on node 0 is given GPUs {_span(list(p.ray_gpus))}" if p.ray_gpus else "")
            + ("; on the cluster at rollout.ray_address" if ro.cluster else "")
        )
        for s in p.workers:
            at = (
                f"node {s.node} GPU {_span(list(s.gpus))}"
                if s.gpus
                else "no GPU"
                if not ro.cluster
                else "cluster"
            )
            share = f" ({s.share:g} of it)" if s.gpus and s.share < 1 else ""
            if L.cuda and not ro.cluster and ro.worker_gpus > 0 and not s.gpus:
                at = "not placed"
            lines.append(f"    {s.name}: {at}{share}, {p.engines[p.workers.index(s)].kind} engine")
        lines.append("  episodes: trainer rank 0 runs them all on the pool; the other ranks receive them")
        if L.nodes > 1 and not ro.cluster and L.cuda and L.ranks_per_node < L.gpus_per_node:
            idle = _span(list(range(L.ranks_per_node, L.gpus_per_node)))
            lines.append(
                f"  note: a local Ray runs on node 0 only, so GPUs {idle} of nodes 1-{L.nodes - 1} stay idle "
                "(rollout.ray_address puts the workers on a Ray cluster's nodes)"
            )
    if L.cuda:
        shared = sorted({g for s in p.workers if s.node == 0 for g in s.gpus} & set(range(L.ranks_per_node)))
        if shared:
            lines.append(
                f"  shared GPUs: node 0 GPU(s) {_span(shared)} hold a trainer rank and rollout worker(s)"
            )
    for g in p.groups:
        members = f": {_span_names(g.members)}" if g.members else ""
        lines.append(f"  group {g.name} [{g.backend}]{members}")
    for prob in p.problems:
        lines.append(f"  REFUSED ({prob.key}): {prob.message}")
    return lines


def _span_names(names: tuple[str, ...]) -> str:
    """``trainer rank 0-7, rollout worker 0-3`` for names ending in a number."""
    out: list[str] = []
    kinds: dict[str, list[int]] = {}
    for n in names:
        stem, _, num = n.rpartition(" ")
        if num.isdigit():
            kinds.setdefault(stem, []).append(int(num))
        else:
            out.append(n)
    return ", ".join([f"{stem} {_span(nums)}" for stem, nums in kinds.items()] + out)
