"""Nothing non-finite reaches the update unnoticed: a reward that is NaN (or not a number at all)
fails its episode at the ``reward`` boundary naming the reward, and the step trains on the others
with its transcripts written; non-finite advantages, token weights or gradients skip the update,
say where they came from, and leave the weights as they were."""

from __future__ import annotations

import json

import torch

from agentrl.assembly import make_trainer
from tests.helpers.configs import small_config
from tests.helpers.jsonl import lines


def test_a_nan_reward_fails_its_episode_and_the_step_goes_on(tmp_path, tiny_model_dir):
    """Before: the NaN went into the advantages and the update, and the weight sync's probe stopped
    the run (``WeightSyncError ... differ by up to nan``) with nothing of the step written."""
    cfg = small_config(tmp_path, tiny_model_dir, "env.name=test_odd_rewards", "trainer.total_steps=1")
    trainer = make_trainer(cfg, log=lambda *_: None)
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
    trainer = make_trainer(cfg, log=logged.append)
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


def test_a_run_whose_every_update_was_skipped_fails_and_names_why(tmp_path, tiny_model_dir, monkeypatch):
    """Issue 66, item 3: with every update skipped for non-finite values (algorithm.stare.W=.inf did
    it, before such a setting was refused) the run exited 0 as a success while weights/version
    counted up on unchanged weights. It now fails (exit 3 from the command), naming why, and pushes
    no weights for a step that took no optimizer step."""
    import pytest

    from agentrl.training.learner import Learner
    from agentrl.training.trainer import TrainingFailed

    real = Learner.advantages

    def nan_advantages(self, *a, **k):
        adv, out = real(self, *a, **k)
        return adv * float("nan"), out

    monkeypatch.setattr(Learner, "advantages", nan_advantages)
    trainer = make_trainer(
        small_config(tmp_path, tiny_model_dir, "trainer.total_steps=2"), log=lambda *_: None
    )
    with pytest.raises(
        TrainingFailed, match="every update was skipped because its advantages, token weights"
    ):
        trainer.train()
    rows = [json.loads(x) for x in lines(tmp_path / "run" / "metrics.jsonl")]
    assert [r["update/steps"] for r in rows] == [0.0, 0.0]
    assert [r["weights/version"] for r in rows] == [0.0, 0.0]  # nothing pushed: nothing changed


def test_weights_that_diverged_are_named_as_such_not_as_a_weight_sync_failure(
    tmp_path, tiny_model_dir, monkeypatch
):
    """An optimizer step that leaves the policy's weights NaN: the run stops naming the diverged
    weights (before: a WeightSyncError, the probe's log-probs "differ by up to nan")."""
    import pytest

    from agentrl.training.trainer import TrainingFailed

    trainer = make_trainer(
        small_config(tmp_path, tiny_model_dir, "trainer.total_steps=1"), log=lambda *_: None
    )
    learner = trainer.learner
    real = learner.apply_gradients

    def diverge():
        norm = real()
        with torch.no_grad():
            next(learner.model.parameters()).fill_(float("nan"))
        return norm

    monkeypatch.setattr(learner, "apply_gradients", diverge)
    with pytest.raises(TrainingFailed) as e:
        trainer.train()
    msg = str(e.value)
    assert "step 0: the policy's own weights are not finite after its update" in msg
    assert "model.embed_tokens.weight" in msg and "Lower trainer.lr" in msg
    assert "WeightSyncError" not in msg and "does not serve" not in msg
