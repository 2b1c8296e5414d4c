"""The KL penalty to a frozen reference policy: the estimators by hand, the loss and reward paths in
the trainer, and no reference model at all when ``algorithm.kl_coef`` is 0."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.algorithms import (
    compute_advantages,
    k1_kl,
    k2_kl,
    k3_kl,
    kl_penalty,
    loss_normaliser,
    policy_loss,
)
from agentrl.assembly import components, make_trainer
from agentrl.models import load_policy
from tests.helpers.configs import small_config


def test_estimators_and_the_loss_by_hand():
    logp = torch.tensor([[-1.0, -2.0, -9.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # the third token is not a policy token
    # d = ref - logp = [-.5, 1]: k1 = logp - ref = [.5, -1]; k2 = ½·d² = [.125, .5];
    # k3 = e^d - d - 1 = [e^-.5 - .5, e - 2] = [.106531, .718282]
    assert k1_kl(logp, ref)[0, :2].tolist() == [0.5, -1.0]
    assert k2_kl(logp, ref)[0, :2].tolist() == [0.125, 0.5]
    torch.testing.assert_close(k3_kl(logp, ref)[0, :2], torch.tensor([math.exp(-0.5) - 0.5, math.e - 2]))
    with pytest.raises(ValueError, match="unknown KL estimator 'k4'"):
        kl_penalty(logp, ref, "k4")
    # A = 0, so the policy term is 0 and the loss is β·token-mean(k3) = .1·(.106531 + .718282)/2
    norm = loss_normaliser(mask, "token-mean")
    loss, stats, _ = policy_loss(logp, logp.detach(), torch.tensor([0.0]), mask, normaliser=norm,
                                 logp_ref=ref, kl_coef=0.1)  # fmt: skip
    expected = 0.1 * (math.exp(-0.5) - 0.5 + math.e - 2) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert stats["kl_ref"] == pytest.approx((math.exp(-0.5) - 0.5 + math.e - 2) / 2, rel=1e-6)
    # ∂/∂logp of β·mean(e^d - d - 1) = β·(1 - e^d)/2 per token; 0 off the mask
    (g,) = torch.autograd.grad(loss, logp)
    torch.testing.assert_close(g, torch.tensor([[0.05 * (1 - math.exp(-0.5)), 0.05 * (1 - math.e), 0.0]]))


def test_no_reference_model_without_a_penalty(tmp_path, tiny_model_dir, monkeypatch):
    loads = []
    real = components.load_model
    monkeypatch.setattr(
        components, "load_model", lambda cfg, path, **kw: loads.append(path) or real(cfg, path, **kw)
    )
    trainer = make_trainer(small_config(tmp_path, tiny_model_dir, "algorithm.name=grpo"), log=lambda *_: None)
    assert trainer.learner.ref_model is None and loads == [str(tiny_model_dir)]  # the policy only
    with_kl = make_trainer(
        small_config(tmp_path / "kl", tiny_model_dir, "algorithm.kl_coef=0.1"), log=lambda *_: None
    )
    assert with_kl.learner.ref_model is not None and len(loads) == 3  # + the policy again and its reference
    assert not any(p.requires_grad for p in with_kl.learner.ref_model.parameters())


@pytest.mark.parametrize("rank", [0, 1])
def test_a_sharded_reference_loads_like_the_policy_never_whole_on_a_gpu(
    tmp_path, tiny_model_dir, monkeypatch, rank
):
    """Under FSDP2 rank 0 reads the reference into host memory and the other ranks build it on the
    meta device; each rank's GPU then holds only its shards (``materialize``), as ``agentrl plan``
    counts it (N·b/S). Loading it onto rank 0's GPU whole would put 131 GB there for a 32 B model.
    The GPU here is only named: the loads and the materialisation are recorded."""
    from agentrl.assembly.build import reference_model
    from agentrl.parallel import sharding

    loads, filled = [], []
    real = components.load_model
    monkeypatch.setattr(
        components,
        "load_model",
        lambda cfg, path, device=None, **kw: (
            loads.append(str(device)) or real(cfg, path, device=device, **kw)
        ),
    )
    monkeypatch.setattr(
        sharding,
        "materialize",
        lambda m, device, full, broadcast=True: filled.append((str(device), full is not None)),
    )

    class Sharded:  # what the learner's FSDP2 strategy is to reference_model
        equal_forwards, world = True, 2

        def prepare_frozen(self, model):
            return model

    strategy = Sharded()
    strategy.rank = rank
    cfg = small_config(tmp_path, tiny_model_dir, "algorithm.kl_coef=0.1")
    reference_model(cfg, strategy, torch.device("cuda", rank), log=lambda *_: None)
    assert loads == ["cpu" if rank == 0 else "meta"]
    assert filled == [(f"cuda:{rank}", rank == 0)]  # the shards on the rank's GPU, from rank 0's copy


@pytest.fixture
def shifted_ref(tmp_path, tiny_model_dir):
    """A reference policy that differs from the start policy (its output head scaled)."""
    model, tokenizer = load_policy(tiny_model_dir)
    with torch.no_grad():
        model.lm_head.weight.mul_(1.5)
    out = tmp_path / "ref"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _one_update(tmp_path, tiny_model_dir, *extra):
    trainer = make_trainer(small_config(tmp_path, tiny_model_dir, "algorithm.name=grpo", "trainer.total_steps=1",
                                   *extra), log=lambda *_: None)  # fmt: skip
    out = trainer.train_step(0)
    return trainer, out.metrics


def test_the_loss_penalty_changes_the_update(tmp_path, tiny_model_dir, shifted_ref):
    base, m0 = _one_update(tmp_path / "a", tiny_model_dir)
    kl, m1 = _one_update(
        tmp_path / "b", tiny_model_dir, "algorithm.kl_coef=0.5", f"model.ref_path={shifted_ref}"
    )
    assert "loss/kl_ref" not in m0 and m1["loss/kl_ref"] > 0
    assert m0["loss/pg_loss"] == pytest.approx(m1["loss/pg_loss"])  # same rollouts, same policy term
    moved = [
        n
        for n, p in kl.model.named_parameters()
        if not torch.equal(p, dict(base.model.named_parameters())[n])
    ]
    assert moved, "the KL term must change the gradient"
    # with the start policy as reference, k3 and its gradient are exactly 0 at the first update
    same, m2 = _one_update(tmp_path / "c", tiny_model_dir, "algorithm.kl_coef=0.5")
    assert m2["loss/kl_ref"] == 0.0
    assert all(
        torch.equal(p, dict(base.model.named_parameters())[n]) for n, p in same.model.named_parameters()
    )


def test_the_reward_penalty_by_hand(tmp_path, tiny_model_dir, shifted_ref):
    beta = 0.05
    trainer = make_trainer(
        small_config(tmp_path, tiny_model_dir, "algorithm.name=grpo", f"algorithm.kl_coef={beta}",
                     "algorithm.kl_in=reward", "algorithm.kl_estimator=k1", f"model.ref_path={shifted_ref}"),
        log=lambda *_: None,
    )  # fmt: skip
    _, kept, _ = trainer.collect(0)
    learner = trainer.learner
    batch = learner.make_batch(kept)
    stats = learner.policy_stats(batch)
    assert not stats.pending  # the penalty needs π_old before the update
    ref = learner.reference_logprobs(batch)
    adv, out = learner.advantages(batch, stats, ref)
    # by hand: R_i - β·Σ_t (logp_old - logp_ref) over each episode's trained tokens, then GRPO
    rewards = []
    for i, e in enumerate(batch.episodes):
        m = batch.mask[i] > 0
        rewards.append(e.reward - beta * float((stats.logp[i][m] - ref[i][m]).sum()))
    expected = compute_advantages("grpo", rewards, [e.group for e in batch.episodes])
    torch.testing.assert_close(adv, expected)
    plain = compute_advantages("grpo", [e.reward for e in batch.episodes], [e.group for e in batch.episodes])
    assert not torch.allclose(adv, plain) and out["kl/reward_penalty_mean"] != 0
