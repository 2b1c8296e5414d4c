"""Device-correct training: every tensor the learner computes with follows the policy's device.

A CPU machine cannot show a CPU/CUDA mismatch, so these tests move the policy to PyTorch's ``meta``
device (tensors with shapes and no storage): an op that mixes a meta tensor with a stray CPU tensor
raises, as a CUDA op given a CPU tensor does. What meta cannot check: anything that reads a value
(``float(t)``, ``.item()``, ``.tolist()``) has none to read, so the phases that branch on values
(advantages' metrics, the token weightings' quantiles and controllers, the loss statistics, the
shared-prefix plan, which compares token ids) run only in ``scripts/gpu_check.sh`` on a real GPU.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from agentrl import algorithms as alg
from agentrl.assembly.records import learner_settings
from agentrl.models import load_policy
from agentrl.training.learner import Learner
from tests.helpers.batches import synthetic_batch
from tests.helpers.configs import small_config


def _meta_learner(tmp_path, tiny_model_dir, *extra: str) -> Learner:
    cfg = small_config(tmp_path, tiny_model_dir, "trainer.share_prefix=false", *extra)
    model, tokenizer = load_policy(tiny_model_dir)
    reference = load_policy(tiny_model_dir)[0].requires_grad_(False)  # used with algorithm.kl_coef > 0
    settings = learner_settings(
        dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, bf16=False))
    )
    learner = Learner(settings, model, tokenizer.pad_token_id or 0, log=lambda *_: None, reference=reference)
    # the optimizer is built on the CPU (fused AdamW has no meta kernel); the model then moves, as
    # a policy loaded on a GPU would be there from the start
    for m in (model, learner.ref_model):
        if m is not None:
            m.to("meta")
    learner.device = torch.device("meta")
    return learner


def test_the_learner_computes_on_the_policy_device(tmp_path, tiny_model_dir):
    learner = _meta_learner(tmp_path, tiny_model_dir, "algorithm.name=stare", "algorithm.kl_coef=0.1")
    episodes = synthetic_batch(learner.model.config.vocab_size).episodes  # type: ignore[union-attr]
    batch = learner.make_batch(episodes)
    assert {t.device.type for t in (batch.ids, batch.mask, batch.engine_logp, batch.advantages)} == {"meta"}
    assert batch.lengths.device.type == "cpu"  # host-side: trimming reads them
    stats = learner.policy_stats(batch)  # the no-grad pass, micro-batched
    ref = learner.reference_logprobs(batch)  # the KL reference's pass
    assert stats.logp.device.type == stats.entropy.device.type == "meta"
    assert ref is not None and ref.device.type == "meta"
    batch.advantages = torch.linspace(-1, 1, batch.size).to(batch.device)
    rows = torch.arange(batch.size)
    sub = batch.rows(rows)
    w = sub.mask.shape[1]
    logp, ent = learner.passes.forward(learner.train_module, sub, grad=True)  # the gradient pass
    loss = alg.policy_loss(
        logp, stats.logp[:, :w], sub.advantages, sub.mask, normaliser=1.0, logp_ref=ref[:, :w],
        kl_coef=0.1, entropy=ent, entropy_coef=0.01, stats=False,
    ).loss  # fmt: skip
    loss.backward()
    grads = [p.grad for p in learner.model.parameters() if p.grad is not None]
    assert grads and {g.device.type for g in grads} == {"meta"}


def test_a_stray_cpu_tensor_fails_on_meta(tmp_path, tiny_model_dir):
    """The control: the loss of meta log-probs with the advantages left on the CPU raises, so the test
    above would catch a tensor that does not follow the model. (Meta's embedding kernel accepts CPU
    token ids, so a stray ``ids`` tensor is caught only on a GPU.)"""
    learner = _meta_learner(tmp_path, tiny_model_dir)
    episodes = synthetic_batch(learner.model.config.vocab_size).episodes  # type: ignore[union-attr]
    batch = learner.make_batch(episodes)
    logp, _ = learner.passes.forward(learner.model, batch, grad=True)
    with pytest.raises(RuntimeError, match="device"):
        alg.policy_loss(logp, logp.detach(), torch.zeros(batch.size), batch.mask, normaliser=1.0, stats=False)
    alg.policy_loss(
        logp, logp.detach(), batch.advantages, batch.mask, normaliser=1.0, stats=False
    )  # on meta: fine
