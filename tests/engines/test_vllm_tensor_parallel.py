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
