"""Ray rollout workers on a local loopback Ray: the trainer runs with ``rollout.workers=2`` and gets
the episodes an in-process engine with the same weights gives; a dead worker's episodes are retried
on the other worker or recorded as failed at the ``worker`` boundary."""

from __future__ import annotations

import os

import pytest
import torch

from agentrl.assembly import build
from agentrl.engines.hf import HFEngine
from agentrl.env import Task
from agentrl.models import load_policy
from agentrl.rollout.runner import EpisodeRequest
from tests.helpers import HELPERS, ROOT
from tests.helpers.configs import ray_config

pytestmark = pytest.mark.ray
ENVS = HELPERS / "distributed_envs.py"


def requests(n: int, **metadata) -> list[EpisodeRequest]:
    return [
        EpisodeRequest(Task(f"t{i}", f"Say something {i}.", metadata=metadata), seed=i, group="g")
        for i in range(n)
    ]


@pytest.mark.slow  # 25-56 s: in the full tier (.ci/run), not the fast one
def test_trainer_step_on_ray_workers_then_faults(ray_local, tmp_path, tiny_model_dir):
    from agentrl.assembly import make_trainer
    from agentrl.rollout.ray_workers import RolloutPool

    cfg = ray_config(tmp_path, tiny_model_dir)
    trainer = make_trainer(cfg, log=lambda *_: None)
    pool = trainer.engine
    assert isinstance(pool, RolloutPool) and len(pool.workers) == 2
    try:
        out = trainer.train_step(0)
        assert out.metrics["episodes/count"] == 4 and out.metrics["episodes/failed_frac"] == 0
        assert "update/skipped" not in out.metrics and pool.version == 1
        assert {s.weight_version for e in out.episodes for s in e.segments if s.role == "policy"} == {0}
        # both workers ran episodes (each episode records its worker's pid as a zero-weight metric)
        assert len({e.reward_components["pid"] for e in out.episodes}) == 2
        assert os.getpid() not in {e.reward_components["pid"] for e in out.episodes}

        # after the update, the workers sample what an in-process engine with the trainer's weights samples
        model, tok = load_policy(tiny_model_dir)
        model.load_state_dict(trainer.model.state_dict())
        local_cfg = ray_config(tmp_path, tiny_model_dir, "rollout.workers=0")
        local = build.build_runner(local_cfg, HFEngine(model, tok), tok, seed=11)
        remote = build.build_runner(cfg, pool, tok, seed=11)
        eps_local, eps_remote = local.run(requests(4)), remote.run(requests(4))
        local.close()
        assert [e.token_ids() for e in eps_remote] == [e.token_ids() for e in eps_local]
        for a, b in zip(eps_remote, eps_local):
            la = torch.tensor([x for x in a.engine_logprobs() if x is not None])
            lb = torch.tensor([x for x in b.engine_logprobs() if x is not None])
            assert torch.allclose(la, lb, atol=1e-4)
        assert all(s.weight_version == 1 for e in eps_remote for s in e.segments if s.role == "policy")

        # a worker dies once: its shard (episodes 2, 3) is retried on the other worker and succeeds
        flag = tmp_path / "crashed"
        reqs = requests(2) + requests(2, crash="once", flag=str(flag))[0:2]
        eps = remote.run(reqs)
        assert flag.exists() and all(not e.failed for e in eps), [e.failure for e in eps]
        assert [e.metrics["worker_retries"] for e in eps] == [0, 0, 1, 1]
        assert any("died" in ev for ev in pool.events) and any("retrying 2" in ev for ev in pool.events)

        # every worker dies: the next run replaces the dead one first; then episodes that kill every
        # worker they reach are recorded as failed at the worker boundary, and the call returns
        eps = remote.run(requests(2, crash="always", flag=str(flag)))
        assert any("replaced dead worker" in ev for ev in pool.events)
        assert all(e.failure.boundary == "worker" and "died" in e.failure.message for e in eps)
        assert all(e.stop_reason == "error" for e in eps)

        # every worker died after the last sync, so no replacement can copy the current weights: they
        # run nothing (episodes fail, the step goes on) until the next sync brings them up to date
        eps = remote.run(requests(2))
        assert all("no rollout worker has the current weights" in e.failure.message for e in eps)
        assert any("runs nothing until the next weight sync" in ev for ev in pool.events)
        pool.load_weights(trainer.model.state_dict())
        eps = remote.run(requests(2))
        assert not any(e.failed for e in eps), [e.failure for e in eps]
        assert {s.weight_version for e in eps for s in e.segments if s.role == "policy"} == {pool.version}
    finally:
        pool.shutdown()


AGENT_ENV = ROOT / "docs" / "examples" / "agent_env.py"


@pytest.mark.slow
def test_agent_environments_run_on_ray_workers(ray_local, tmp_path, tiny_model_dir):
    """An ``AgentEnvironment`` on Ray workers: each worker serves its own endpoint on 127.0.0.1, its
    agents (the guide's example, the openai package unchanged) run there, and the episodes come back
    token for token what an in-process ``AgentRunner`` with the same weights records."""
    from agentrl.assembly import make_trainer
    from agentrl.rollout.ray_workers import RolloutPool

    agent = ("env.name=arithmetic_agent", f"env.module={AGENT_ENV}", "rollout.max_episode_tokens=512")
    cfg = ray_config(tmp_path, tiny_model_dir, *agent)
    trainer = make_trainer(cfg, log=lambda *_: None)
    pool = trainer.engine
    assert isinstance(pool, RolloutPool) and len(pool.workers) == 2
    try:
        model, tok = load_policy(tiny_model_dir)
        local_cfg = ray_config(tmp_path, tiny_model_dir, *agent, "rollout.workers=0")
        local = build.build_runner(local_cfg, HFEngine(model, tok), tok, seed=11)
        remote = build.build_runner(cfg, pool, tok, seed=11)
        reqs = [
            EpisodeRequest(Task(f"t{i}", f"What is {i} + 2?", answer=i + 2), seed=i, group="g")
            for i in range(4)
        ]
        eps_local, eps_remote = local.run(reqs), remote.run(reqs)
        local.close()
        assert not any(e.failed for e in eps_remote), [e.failure for e in eps_remote]
        assert [e.token_ids() for e in eps_remote] == [e.token_ids() for e in eps_local]
        for a, b in zip(eps_remote, eps_local):
            assert a.roles() == b.roles() and a.reward == b.reward
            assert a.metrics["tools"] == b.metrics["tools"]  # the agent's tool schemas, as it sent them
            la = torch.tensor([x for x in a.engine_logprobs() if x is not None])
            lb = torch.tensor([x for x in b.engine_logprobs() if x is not None])
            assert len(la) > 0 and torch.allclose(la, lb, atol=1e-4)
        assert {e.metrics["worker_retries"] for e in eps_remote} == {0}
    finally:
        pool.shutdown()


@pytest.mark.slow  # one torchrun launch with a Ray pool: ~40 s
def test_under_torchrun_the_other_ranks_wait_for_rank_0s_slow_pool(tmp_path, tiny_model_dir):
    """Rank 0 starts the Ray pool (engines that load for minutes at 7-32 B) while rank 1 waits for it
    at a barrier bounded by the pool's own limits, not in the learner's first collective (bounded by
    timeouts.collective_s, which a slow pool outlasted: rank 1 died with a CollectiveError). Here the
    pool takes longer than collective_s to start, and the run trains."""
    import subprocess

    import ray

    from tests.helpers.configs import TORCHRUN_ENV, cli_args, torchrun_prefix

    if ray.is_initialized():  # rank 0 starts a local Ray of its own
        ray.shutdown()
    run = tmp_path / "run"
    overrides = cli_args(
        run, tiny_model_dir, "rollout.workers=1", "timeouts.collective_s=8", "trainer.total_steps=1"
    )
    proc = subprocess.run(
        [*torchrun_prefix(2), str(HELPERS / "slow_pool.py"), "12", *overrides],
        env=TORCHRUN_ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    for metrics in (run / "metrics.jsonl", run / "ranks" / "1" / "metrics.jsonl"):
        assert len(metrics.read_text().splitlines()) == 1  # both ranks trained the step
