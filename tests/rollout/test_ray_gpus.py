"""Ray rollout workers on GPUs, simulated on a CPU machine: a local Ray given GPUs it does not have
(``num_gpus`` and ``CUDA_VISIBLE_DEVICES`` when it starts, as ``ray_placement.init_ray`` does) assigns
their ids and sets ``CUDA_VISIBLE_DEVICES`` for its actors exactly as on a GPU node. The engines here
run on the CPU; what a CUDA engine binds to is ``cuda:0`` of the worker, which is the GPU Ray gave it."""

from __future__ import annotations

import pytest

from agentrl.assembly import components
from agentrl.parallel.placement import Launch
from agentrl.rollout.ray_placement import physical_gpus
from tests.helpers.configs import ray_config

pytestmark = pytest.mark.ray


def test_physical_ids_follow_this_processs_visible_devices():
    assert physical_gpus([2, 3], None) == ["2", "3"]
    assert physical_gpus([0, 2], "4,5,6") == ["4", "6"]
    with pytest.raises(ValueError, match="makes only 2 visible"):
        physical_gpus([2], "4,5")


@pytest.mark.slow  # ~40 s: a Ray start and three worker starts
def test_workers_get_distinct_gpus_from_their_bundles_and_a_replacement_gets_its_gpu_again(
    tmp_path, tiny_model_dir, monkeypatch
):
    """8 GPUs on a node, 2 trainer ranks on GPUs 0-1: the local Ray is given GPUs 2-7 (here under
    CUDA_VISIBLE_DEVICES=10,...,17, so the ids Ray hands out are the physical 12-17), and each of two
    workers gets one of them, distinct, as its CUDA_VISIBLE_DEVICES; torchrun's variables of the
    process that started Ray are gone from the workers; a worker killed and replaced comes back on
    the same GPU (its bundle). A pool asking for more GPUs than Ray has is refused at once."""
    ray = pytest.importorskip("ray")

    if ray.is_initialized():
        ray.shutdown()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(str(10 + g) for g in range(8)))
    for name, value in (
        ("RANK", "0"),
        ("LOCAL_RANK", "0"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "1"),
    ):
        monkeypatch.setenv(name, value)  # as under torchrun: rank 0 starts Ray
    cfg = ray_config(tmp_path, tiny_model_dir, "rollout.worker_gpus=1")
    where = components.placement(cfg, Launch(nodes=1, gpus_per_node=8, ranks_per_node=2))
    assert where.ok and where.ray_gpus == (2, 3, 4, 5, 6, 7)
    # more workers than Ray has GPUs would wait forever to be placed: refused at once, naming the settings
    with pytest.raises(
        ValueError, match=r"rollout.workers=7 .* ask Ray for 7 GPU\(s\), but this Ray cluster has 6"
    ):
        components.rollout_pool(cfg, str(tiny_model_dir), where, workers=7)
    pool = components.rollout_pool(cfg, str(tiny_model_dir), where, workers=2)
    try:
        assert ray.cluster_resources()["GPU"] == 6
        given = pool.placements()
        ids = [g["ray_gpu_ids"] for g in given]
        assert all(len(i) == 1 for i in ids) and len({i[0] for i in ids}) == 2, ids
        assert {i[0] for i in ids} <= {str(10 + g) for g in where.ray_gpus}
        for g in given:  # the engine a CUDA run builds here is cuda:0, which is the GPU Ray assigned
            assert g["cuda_visible_devices"] == g["ray_gpu_ids"][0] == g["cuda_0_is_gpu"]
            assert g["launcher_env"] == [] and {"RANK", "LOCAL_RANK", "MASTER_ADDR"} <= set(g["scrubbed"])
        assert components.worker_gpus(cfg, cuda=True) == 1.0
        # worker 1 dies; the next run replaces it on its own bundle, so on its GPU again
        ray.kill(pool.workers[1], no_restart=True)
        pool._replace_dead()
        again = pool.placements()
        assert any("replaced dead worker 1" in e for e in pool.events)
        assert again[1]["ray_gpu_ids"] == given[1]["ray_gpu_ids"] and again[1]["pid"] != given[1]["pid"]
        assert again[0] == given[0]
    finally:
        pool.shutdown()
        ray.shutdown()
