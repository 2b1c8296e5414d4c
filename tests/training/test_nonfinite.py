"""Nothing non-finite reaches the update unnoticed: a reward that is NaN (or not a number at all)
fails its episode at the ``reward`` boundary naming the reward, and the step trains on the others
with its transcripts written; non-finite advantages, token weights or gradients skip the update,
say where they came from, and leave the weights as they were."""

from __future__ import annotations

import json

import torch

from agentrl.training.trainer import Trainer
from tests.helpers.configs import small_config
from tests.helpers.jsonl import lines


def test_a_nan_reward_fails_its_episode_and_the_step_goes_on(tmp_path, tiny_model_dir):
    """Before: the NaN went into the advantages and the update, and the weight sync's probe stopped
    the run (``WeightSyncError ... differ by up to nan``) with nothing of the step written."""
    cfg = small_config(tmp_path, tiny_model_dir, "env.name=test_odd_rewards", "trainer.total_steps=1")
    trainer = Trainer(cfg, log=lambda *_: None)
    trainer.train()
    eps = [json.loads(line) for line in lines(tmp_path / "run" / "transcripts.jsonl")]
    failed = {e["task_id"]: e["failure"] for e in eps if e["failure"]}
    assert set(failed) <= {"train-0", "train-1"} and failed, [e["task_id"] for e in eps]
    for task, failure in failed.items():
        assert failure["boundary"] == "reward"
        want = (
            "returned nan, not a finite number"
            if task == "train-0"
            else "returned '1.0' (str), not a real number"
        )
        assert "reward 'variety'" in failure["message"] and want in failure["message"], failure
    row = json.loads(lines(tmp_path / "run" / "metrics.jsonl")[0])
    assert "update/nonfinite" not in row and all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_non_finite_advantages_or_gradients_skip_the_update(tmp_path, tiny_model_dir, monkeypatch):
    cfg = small_config(tmp_path, tiny_model_dir, "trainer.total_steps=1")
    logged = []
    trainer = Trainer(cfg, log=logged.append)
    learner = trainer.learner
    before = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
    real = learner.advantages

    def nan_advantages(*a, **k):
        adv, out = real(*a, **k)
        adv[0] = float("nan")
        return adv, out

    monkeypatch.setattr(learner, "advantages", nan_advantages)
    out = trainer.train_step(0)
    assert out.metrics["update/nonfinite"] == 1.0
    assert any("advantages hold non-finite values: the update is skipped" in m for m in logged)
    assert all(torch.equal(p, before[n]) for n, p in learner.model.named_parameters())

    monkeypatch.setattr(learner, "advantages", real)
    real_step = learner.micro_step

    def nan_loss(*a, **k):
        result = real_step(*a, **k)
        return result._replace(loss=result.loss * float("nan"))

    monkeypatch.setattr(learner, "micro_step", nan_loss)
    out = trainer.train_step(1)
    assert out.metrics["update/nonfinite"] == 1.0
    assert any("the gradient of 1 of 1 mini-batch(es) was not finite" in m for m in logged)
    assert all(torch.equal(p, before[n]) for n, p in learner.model.named_parameters())
    assert all(torch.isfinite(p).all() for p in trainer.engine.model.parameters())
