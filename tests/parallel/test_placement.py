"""Where every process lives (``agentrl/parallel/placement.py``): the map of each config in
configs/gpu on the hardware its header names, and every map that cannot work refused with the
setting to change, in ``agentrl plan`` and before a run starts."""

from __future__ import annotations

import pytest

from agentrl.assembly import components
from agentrl.cli import main
from agentrl.config import ConfigError, load_config
from agentrl.engines.factory import vllm_distributed
from agentrl.parallel.placement import Launch, Rollouts, place, render
from agentrl.plan import plan
from tests.helpers import ROOT
from tests.helpers.configs import header_plans

GPU = ROOT / "configs" / "gpu"


def gpus_of(p) -> dict[str, tuple]:
    return {s.name: (s.node, s.gpus) for s in p.trainers + p.workers}


# -- the shipped configs -----------------------------------------------------------------------------
def test_7b_tool_use_on_8_gpus_one_engine_per_rank_on_its_gpu():
    cfg = load_config(str(GPU / "tool_use_qwen2.5-7b.yaml"), [])
    p = plan(cfg, gpus=8, gpu_memory_gib=78).placement
    assert p.ok and p.launch == Launch(nodes=1, gpus_per_node=8, ranks_per_node=8)
    # rank r on GPU r, its vLLM engine on the same GPU (external_launcher), every rank runs its share
    assert [(t.node, t.gpus) for t in p.trainers] == [(0, (r,)) for r in range(8)]
    assert [(e.kind, e.ranks, e.gpus) for e in p.engines] == [("vLLM", (r,), (r,)) for r in range(8)]
    assert p.episode_ranks == tuple(range(8)) and p.workers == [] and p.ray_gpus == ()
    assert vllm_distributed(1, 8) == {"distributed_executor_backend": "external_launcher"}


def test_32b_on_4_nodes_of_8_h200s_every_rank_on_its_nodes_gpu():
    cfg = load_config(str(GPU / "short_cot_qwen2.5-32b.yaml"), [])
    p = plan(cfg, gpus=8, nodes=4, gpu_memory_gib=139).placement
    assert p.ok and len(p.trainers) == 32 and len(p.engines) == 32
    assert gpus_of(p)["trainer rank 13"] == (1, (5,))  # node 13 // 8, GPU LOCAL_RANK 13 % 8
    assert p.engine_of(31).gpus == (7,) and p.engine_of(31).node == 3


@pytest.mark.parametrize(
    "name, gpus, engines",
    [
        ("long_cot_r1-distill-qwen-1.5b.yaml", 1, 1),
        ("short_cot_qwen2.5-math-7b.yaml", 8, 8),
        ("tool_use_qwen2.5-7b_lora.yaml", 1, 1),
    ],
)
def test_the_other_configs_place_one_engine_per_gpu(name, gpus, engines):
    p = plan(load_config(str(GPU / name), []), gpus=gpus, gpu_memory_gib=78).placement
    assert p.ok and len(p.engines) == engines
    assert all(e.gpus == p.trainers[e.ranks[0]].gpus for e in p.engines)


def test_32b_with_its_engines_on_ray_workers_of_their_own():
    """The 80 GB alternative the 32 B config's header names: workers with GPUs of their own. On one
    node of 8, four trainer ranks and four workers: Ray gets GPUs 4-7, worker i GPU 4 + i; rank 0 runs
    the episodes; NCCL broadcast is fine (every member on its own GPU)."""
    (alternative,) = [c for c in header_plans(GPU / "short_cot_qwen2.5-32b.yaml") if "rollout.workers=4" in c]
    cfg = load_config(str(GPU / "short_cot_qwen2.5-32b.yaml"), [a for a in alternative if "=" in a])
    assert plan(cfg, gpus=8, gpu_memory_gib=78).fits
    p = plan(cfg, gpus=8, gpu_memory_gib=78).placement
    assert p.ok, p.problems
    assert p.launch.ranks_per_node == 4 and p.ray_gpus == (4, 5, 6, 7)
    assert [gpus_of(p)[f"rollout worker {i}"] for i in range(4)] == [(0, (4 + i,)) for i in range(4)]
    assert p.episode_ranks == (0,) and p.groups[-1].backend == "NCCL broadcast"


# -- maps that cannot work ---------------------------------------------------------------------------
def refused(launch: Launch, **rollouts) -> dict[str, str]:
    return {q.key: q.message for q in place(launch, Rollouts(**rollouts)).problems}


def test_refusals_name_the_setting_to_change():
    node = Launch(nodes=1, gpus_per_node=8, ranks_per_node=8)
    # a TP size that does not divide the ranks of a node
    assert (
        "Valid for 8 ranks per node: [1, 2, 4, 8]"
        in refused(node, engine="vllm", tensor_parallel=3)["rollout.vllm.tensor_parallel_size"]
    )
    # workers that need more GPUs than a local Ray has
    half = Launch(nodes=1, gpus_per_node=8, ranks_per_node=6)
    msg = refused(half, workers=3, worker_gpus=1.0)["rollout.workers"]
    assert "need more GPUs than a local Ray has: it gets the 2 GPU(s) of node 0 no trainer rank uses" in msg
    assert "rollout.workers" not in refused(half, workers=4, worker_gpus=0.5)  # 2 per GPU fit
    # whole-GPU workers when every GPU holds a trainer rank
    assert (
        "a whole-GPU worker cannot share one" in refused(node, workers=1, worker_gpus=1.0)["rollout.workers"]
    )
    # workers without a GPU on a CUDA run, and a fraction above one
    assert (
        "Ray would give the workers no GPU"
        in refused(node, workers=1, worker_gpus=0.0)["rollout.worker_gpus"]
    )
    assert "a whole number of GPUs" in refused(half, workers=1, worker_gpus=1.5)["rollout.worker_gpus"]
    # vLLM with tensor parallelism 2 in a worker needs 2 GPUs
    msg = refused(half, workers=1, worker_gpus=1.0, engine="vllm", tensor_parallel=2)["rollout.worker_gpus"]
    assert "set rollout.worker_gpus=2" in msg
    # more ranks per node than GPUs
    assert "two" not in refused(node)  # the fine map has no problems at all
    assert (
        "ranks 2..3 of every node would have none"
        in refused(Launch(1, 2, 4))["--gpus / torchrun --nproc_per_node"]
    )


def test_transports_the_placement_cannot_use_are_refused():
    one = Launch(nodes=1, gpus_per_node=1, ranks_per_node=1)
    # NCCL refuses two ranks on one device: a worker sharing the trainer's GPU cannot join a broadcast
    msg = refused(one, workers=1, worker_gpus=0.5, transport="broadcast")["rollout.sync.transport"]
    assert "shares GPU 0 with trainer rank 0" in msg and "cuda_ipc" in msg
    assert refused(one, workers=1, worker_gpus=0.5, transport="cuda_ipc") == {}
    assert refused(one, workers=2, worker_gpus=0.5, transport="object_store") == {}
    # two workers on one GPU cannot both be NCCL ranks either
    two = Launch(nodes=1, gpus_per_node=2, ranks_per_node=1)
    msg = refused(two, workers=2, worker_gpus=0.5, transport="broadcast")["rollout.sync.transport"]
    assert "rollout worker 1 shares GPU 1 with rollout worker 0" in msg
    # CUDA IPC reaches only workers on rank 0's GPU
    msg = refused(two, workers=1, worker_gpus=1.0, transport="cuda_ipc")["rollout.sync.transport"]
    assert "rollout worker 0 run(s) elsewhere" in msg
    # on the CPU none of this applies (gloo broadcast, no GPUs)
    assert refused(Launch(1, 0, 2), workers=2, worker_gpus=0.0, transport="broadcast") == {}


def test_fractional_workers_pack_or_spread_over_the_gpus():
    node = Launch(nodes=1, gpus_per_node=4, ranks_per_node=2)
    pack = place(node, Rollouts(workers=4, worker_gpus=0.5, worker_placement="pack"))
    spread = place(node, Rollouts(workers=4, worker_gpus=0.5, worker_placement="spread"))
    assert [w.gpus for w in pack.workers] == [(2,), (2,), (3,), (3,)]
    assert [w.gpus for w in spread.workers] == [(2,), (3,), (2,), (3,)]
    assert all(w.share == 0.5 for w in pack.workers)


def test_two_vllm_engines_beyond_a_gpus_memory_are_refused(capsys):
    """One GPU of 80 GiB, the trainer on it, two vLLM workers at 0.5 of it each with
    gpu_memory_utilization 0.5: the workers reserve 2 × 40 GiB, leaving the trainer nothing."""
    over = [
        "model.path=tiny:h128-L8",
        "rollout.engine=vllm",
        "rollout.workers=2",
        "rollout.worker_gpus=0.5",
        "rollout.vllm.gpu_memory_utilization=0.5",
    ]
    p = plan(load_config(None, over), gpus=1, gpu_memory_gib=80)
    assert p.placement.ok and not p.fits
    assert [b.capacity_gib for b in p.budgets] == [40.0, 40.0, 0.0]
    assert main(["plan", str(ROOT / "configs" / "quickstart.yaml"), *over[1:], "--gpus", "1"]) == 1
    out = capsys.readouterr().out
    assert "the trainer's budget is exceeded" in out and "rollout worker 1 budget" in out
    # a vLLM engine asking for more of the GPU than its worker's share is a config error
    with pytest.raises(ConfigError, match=r"gpu_memory_utilization=0.6 .* rollout.worker_gpus=0.5"):
        load_config(None, [*over, "rollout.vllm.gpu_memory_utilization=0.6"])


def test_the_map_is_printed_with_the_launch_command(capsys):
    cfg = str(GPU / "tool_use_qwen2.5-7b.yaml")
    assert main(["plan", cfg, "rollout.workers=2", "--gpus", "8", "--gpu-memory", "78"]) == 0
    out = capsys.readouterr().out
    assert "launch: torchrun --nproc_per_node 6 -m agentrl.cli train CONFIG" in out
    assert "rollout worker 1: node 0 GPU 7, vLLM engine" in out
    assert "a local Ray on node 0 is given GPUs 6,7" in out
    lines = render(place(Launch(2, 8, 8), Rollouts(engine="vllm", tensor_parallel=2)))
    assert any("leaders 0,2,4,6,8,10,12,14 run the episodes" in line for line in lines)
    assert sum("group vLLM tensor parallel" in line for line in lines) == 8


def test_a_run_refuses_its_placement_before_any_work(tmp_path, tiny_model_dir, monkeypatch):
    """Under torchrun's variables, with more ranks per node than the node has GPUs: the trainer stops
    with a ConfigError naming the setting, and no run directory exists."""
    from agentrl.assembly import build

    cfg = load_config(None, [f"model.path={tiny_model_dir}", f"run.output_dir={tmp_path / 'run'}"])
    monkeypatch.setattr(components, "launch_from_env", lambda cuda: Launch(1, 1, 2))
    with pytest.raises(ConfigError, match=r"--gpus / torchrun --nproc_per_node: 2 trainer ranks per node"):
        build.run_placement(cfg, 0, 2)
    assert not (tmp_path / "run").exists()
