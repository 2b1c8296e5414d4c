"""Colocated engines under torchrun (``parallel/engine_group.py``, ``build.build_engine``): each rank's
vLLM engine joins the ranks through vLLM's ``external_launcher`` on its own ``LOCAL_RANK`` GPU, and an
engine of tensor parallelism 2 spans two ranks whose calls stay in step.

Here (the default tier, where vLLM is not installed) the engine is a recording stand-in
(``tests/helpers/fake_vllm.py``): what is tested is what each rank passes to ``vllm.LLM`` and which
calls it makes, with the real trainer, runner, gather and weight push around it. The vLLM tier runs
the same path with vLLM's CPU build (``tests/engines/test_vllm_tensor_parallel.py``,
``test_a_tensor_parallel_engine_over_two_torchrun_ranks``)."""

from __future__ import annotations

import pytest
import torch

from agentrl.assembly import components
from agentrl.config import load_config
from agentrl.engines.factory import vllm_distributed
from agentrl.parallel.engine_group import AbsentEngine
from tests.helpers.configs import colocated_tp_overrides, torchrun_record


def test_each_ranks_engine_is_on_its_own_gpu(monkeypatch):
    """The HF engine and the trainer of rank r take cuda:LOCAL_RANK; a vLLM engine under torchrun
    gets vLLM's external_launcher (which binds it to LOCAL_RANK's GPU), and one in a single process
    with tensor parallelism (a Ray worker) the multiprocessing executor on its own GPUs."""
    cfg = load_config(None, ["run.device=cuda"])
    for local in ("0", "3"):
        monkeypatch.setenv("LOCAL_RANK", local)
        assert components.device_of(cfg) == torch.device("cuda", int(local))
    assert vllm_distributed(tp=1, world=8) == {"distributed_executor_backend": "external_launcher"}
    assert vllm_distributed(tp=2, world=8) == {"distributed_executor_backend": "external_launcher"}
    assert vllm_distributed(tp=2, world=1) == {"distributed_executor_backend": "mp"}
    assert vllm_distributed(tp=1, world=1) == {}


def test_a_rank_without_an_engine_takes_updates_in_step():
    engine = AbsentEngine()
    stream = iter([("a", torch.zeros(2)), ("b", torch.ones(2))])
    assert engine.load_weights(stream) == 1 and next(stream, None) is None  # consumed, like rank 0's
    engine.begin_weight_update()
    engine.load_weight_bucket([("a", torch.zeros(2))])
    assert engine.finish_weight_update() == 2 and engine.fingerprint(["a"], [1, 2]) == []
    with pytest.raises(RuntimeError, match="trainer rank 0 runs every episode"):
        engine.generate([[1]], None)


@pytest.mark.slow  # one torchrun launch of two ranks, ~40 s
def test_a_tensor_parallel_engine_over_two_ranks_leads_and_follows(tmp_path, tiny_model_dir):
    out = tmp_path / "record.json"
    overrides = colocated_tp_overrides(
        tmp_path, tiny_model_dir, "rollout.max_tokens_per_turn=4", "rollout.max_episode_tokens=64",
        "eval.k=1", "eval.num_tasks=2",
    )  # fmt: skip
    leader, follower = torchrun_record("colocated_tp.py", out, overrides)
    assert (leader["engine"], follower["engine"]) == ("LeaderEngine", "FollowerEngine")
    for r, rec in enumerate((leader, follower)):
        # every rank's engine joins torchrun's ranks through external_launcher, tp 2, the same seed
        kwargs, env = rec["llm"]["kwargs"], rec["llm"]["env"]
        assert kwargs["distributed_executor_backend"] == "external_launcher"
        assert kwargs["tensor_parallel_size"] == 2 and kwargs["seed"] == 0
        assert env == {"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2"}
    # the follower made exactly the leader's calls: same prompts, same (resolved) seeds, same order
    assert leader["generate"] and follower["generate"] == leader["generate"]
    assert all(c["seed"] is not None for call in leader["generate"] for c in call)
    # the step's 4 episodes and the evaluation's 2 ran once, on the leader (4 + 2 prompts in turn 1)
    assert sum(len(call) for call in leader["generate"]) == 6
    assert leader["episodes"] == follower["episodes"] and len(leader["episodes"]) == 4
    assert leader["eval_tasks"] == follower["eval_tasks"] == 2
    # each rank loaded the whole update into its own engine (its slice is vLLM's to cut)
    for rec in (leader, follower):
        methods = [m for m, _ in rec["rpc"]]
        assert methods[0] == "agentrl_begin_weights" and "agentrl_finish_weights" in methods
        sent = {n for m, names in rec["rpc"] if m == "agentrl_load_bucket_tensors" for n in names}
        assert "model.embed_tokens.weight" in sent and rec["version"] == 1
    assert {n for m, ns in leader["rpc"] for n in ns} == {n for m, ns in follower["rpc"] for n in ns}
