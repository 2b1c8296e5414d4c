"""vLLM's CPU build under torchrun (run by scripts/test_vllm.sh in .venv-vllm): one engine of
tensor_parallel_size 2 over two ranks through vLLM's external_launcher (tests/helpers/colocated_vllm.py).
Its own module, in the xdist group of test_vllm_real_model.py: scripts/test_vllm.sh's second worker
runs it while the first builds and uses test_vllm_engine.py's engine."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.xdist_group("vllm_beside_the_tiny_engine")]
vllm = pytest.importorskip("vllm", reason="vLLM is not installed here: run scripts/test_vllm.sh")


def test_a_tensor_parallel_engine_over_two_torchrun_ranks(tmp_path, tiny_model_dir):
    """vLLM's CPU build under torchrun: two ranks, one engine of tensor_parallel_size 2 through vLLM's
    external_launcher (each rank holds half of every layer). A training step runs its episodes on it
    (the leader drives, the follower makes the same calls), the update reaches both halves, and the
    engine's greedy tokens after the push are an HF engine's with the trainer's weights."""
    from tests.helpers.configs import colocated_tp_overrides, torchrun_record

    out = tmp_path / "record.json"
    overrides = colocated_tp_overrides(
        tmp_path, tiny_model_dir, "rollout.max_tokens_per_turn=8", "rollout.max_episode_tokens=128",
        "trainer.lr=1e-2",
    )  # fmt: skip
    leader, follower = torchrun_record("colocated_vllm.py", out, overrides, VLLM_CPU_KVCACHE_SPACE="1")
    assert (leader["engine"], follower["engine"]) == ("LeaderEngine", "FollowerEngine")
    assert leader["episodes"] == follower["episodes"] == 4 and leader["trained"] and follower["trained"]
    assert leader["version"] == follower["version"] == 1
    assert leader["greedy"] == leader["hf_greedy"], (leader["greedy"], leader["hf_greedy"])


def test_an_engine_on_every_rank_under_fsdp2(tmp_path, tiny_model_dir):
    """The 7 B configs' layout on vLLM's CPU build: two torchrun ranks under FSDP2, each with a vLLM
    engine of its own through external_launcher (tensor_parallel_size 1). Each rank runs its share
    of the episodes, the update's bucketed FSDP2 gather reaches both engines, both prove it (the
    sync's checksums and probe, rollout.sync.verify=every), and each engine's greedy tokens after the
    push are an HF engine's with the trainer's gathered weights."""
    from tests.helpers.configs import ENVS, torchrun_record

    overrides = [
        f"model.path={tiny_model_dir}",
        "env.name=test_crashy",
        f"env.module={ENVS}",
        f"run.output_dir={tmp_path / 'run'}",
        "run.device=cpu",
        "rollout.engine=vllm",
        "rollout.sync.verify=every",
        "rollout.prompts_per_step=2",
        "rollout.group_size=2",
        "rollout.max_tokens_per_turn=8",
        "rollout.max_episode_tokens=128",
        "trainer.strategy=fsdp2",
        "trainer.micro_batch_size=2",
        "trainer.lr=1e-2",
        "logging.tensorboard=false",
        "logging.plots=false",
    ]
    ranks = torchrun_record(
        "colocated_vllm.py", tmp_path / "record.json", overrides, VLLM_CPU_KVCACHE_SPACE="1"
    )
    assert [r["engine"] for r in ranks] == ["VLLMEngine", "VLLMEngine"]
    for r in ranks:
        assert r["episodes"] == 4 and r["trained"] and r["version"] == 1
        assert r["verified"] == 1.0 and r["probe"] < 1e-4, r
        assert r["greedy"] == r["hf_greedy"], (r["rank"], r["greedy"], r["hf_greedy"])
