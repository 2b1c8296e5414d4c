"""Shared-prefix forward passes (agentrl/training/forward.py): same logits, losses and gradients as a full
forward, and the trainer and SFT give the same numbers with the sharing on or off."""

from __future__ import annotations

import pytest
import torch

from agentrl.assembly import make_trainer
from agentrl.training.forward import first_loss_column, prefix_plan, shared_prefix_len, suffix_logits
from tests.helpers.configs import small_config


def test_shared_prefix_len_hand_cases():
    ids = torch.tensor([[1, 2, 3, 4, 5], [1, 2, 3, 9, 9], [1, 2, 3, 4, 0]])
    assert shared_prefix_len(ids) == 3  # columns 0..2 agree in all rows
    assert shared_prefix_len(ids, limit=2) == 2
    # the shortest row (length 3) needs one token of its own: at most 2 shared
    assert shared_prefix_len(ids, lengths=torch.tensor([5, 5, 3])) == 2
    same = torch.tensor([[7, 7, 7], [7, 7, 7]])
    assert shared_prefix_len(same) == 2  # identical rows still keep one suffix token
    assert shared_prefix_len(torch.tensor([[1, 2], [3, 2]])) == 0


def test_prefix_plan_hand_cases():
    """Rows 0, 2, 4 start with prompt A, rows 1, 3, 5 with prompt B (6 tokens each); A and B agree
    on their first 2 tokens. Sharing 2 columns once saves (6 - 1) * 2 = 10 positions, sharing each
    group's 6 columns twice saves (6 - 2) * 6 = 24: the plan takes the groups."""
    A, B = [1, 2, 3, 4, 5, 6], [1, 2, 7, 8, 9, 10]
    ids = torch.tensor([[*p, 20 + i, 30 + i] for i, p in enumerate([A, B, A, B, A, B])])
    plan = prefix_plan(ids)
    assert plan.share == 6 and plan.owners.tolist() == [0, 1, 0, 1, 0, 1] and plan.distinct == 2
    capped = prefix_plan(ids, limit=4)  # (6 - 2) * 4 = 16 beats 10
    assert capped.share == 4 and capped.owners.tolist() == [0, 1, 0, 1, 0, 1]
    short = prefix_plan(ids, lengths=torch.tensor([8, 8, 8, 8, 8, 3]))  # a row of 3 tokens: <= 2
    assert short.share == 2 and short.owners.tolist() == [0] * 6
    # one identical row pair among distinct rows: (3 - 2) * 5
    mixed = torch.tensor([[1, 2, 3, 4, 5, 6], [9, 9, 9, 9, 9, 9], [1, 2, 3, 4, 5, 7]])
    assert prefix_plan(mixed).share == 5 and prefix_plan(mixed).owners.tolist() == [0, 1, 0]
    none = prefix_plan(torch.tensor([[1, 2], [3, 2]]))
    assert none.share == 0 and none.owners.tolist() == [0, 1]
    assert prefix_plan(torch.tensor([[1, 2, 3]])).share == 0  # one row: nothing to share


def test_first_loss_column():
    mask = torch.tensor([[0, 0, 0, 1, 1], [0, 0, 1, 1, 0]])
    assert first_loss_column(mask) == 2
    assert first_loss_column(torch.zeros(2, 4)) == 4


def _rows_with_prefix(vocab: int, B: int = 4, P: int = 20, T: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (B, T), generator=g)
    ids[:, :P] = ids[0, :P]
    lengths = torch.tensor([T, T - 5, T - 2, T - 9])[:B]
    for i, n in enumerate(lengths.tolist()):
        ids[i, n:] = 0  # right padding
    return ids, lengths


def test_suffix_logits_and_gradients_match_full_forward(tiny_policy):
    model, _ = tiny_policy
    model.train()
    ids, lengths = _rows_with_prefix(model.config.vocab_size)
    share = shared_prefix_len(ids, lengths)
    assert share == 20
    weights = torch.randn(ids.shape[0], ids.shape[1] - share, generator=torch.Generator().manual_seed(1))

    def loss_of(logits: torch.Tensor) -> torch.Tensor:  # a loss touching every suffix position
        return (logits.float().log_softmax(-1)[..., 7] * weights).sum()

    full = model(input_ids=ids).logits[:, share:]
    loss_full = loss_of(full)
    loss_full.backward()
    g_full = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    part = suffix_logits(model, ids, share)
    assert part.shape == full.shape
    assert torch.allclose(part, full, atol=2e-5), (part - full).abs().max()
    loss_of(part).backward()
    for n, p in model.named_parameters():
        scale = g_full[n].abs().max().clamp(min=1e-6)
        assert (p.grad - g_full[n]).abs().max() / scale < 1e-4, n  # every weight, prefix layers too


def test_group_prefixes_give_the_full_forward_logits_and_gradients(tiny_policy):
    """Two groups with prompts of 12 tokens that agree on their first 4: each group's prompt runs
    once, its cache rows are repeated for the group's rows, and logits and every weight gradient
    match the full forward."""
    model, _ = tiny_policy
    model.train()
    g = torch.Generator().manual_seed(2)
    V, T = model.config.vocab_size, 30
    prompts = torch.randint(5, V, (2, 12), generator=g)
    prompts[1, :4] = prompts[0, :4]
    ids = torch.randint(5, V, (6, T), generator=g)
    ids[:, :12] = prompts[torch.tensor([0, 1, 1, 0, 1, 0])]
    lengths = torch.tensor([T, T - 3, T - 7, T - 1, T, T - 10])
    for i, n in enumerate(lengths.tolist()):
        ids[i, n:] = 0
    plan = prefix_plan(ids, lengths)
    assert plan.share == 12 and plan.distinct == 2 and plan.owners.tolist() == [0, 1, 1, 0, 1, 0]
    weights = torch.randn(6, T - 12, generator=g)

    def loss_of(logits: torch.Tensor) -> torch.Tensor:
        return (logits.float().log_softmax(-1)[..., 3] * weights).sum()

    full = model(input_ids=ids).logits[:, 12:]
    loss_of(full).backward()
    g_full = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    part = suffix_logits(model, ids, plan.share, plan.owners)
    assert torch.allclose(part, full, atol=2e-5), (part - full).abs().max()
    loss_of(part).backward()
    for n, p in model.named_parameters():
        scale = g_full[n].abs().max().clamp(min=1e-6)
        assert (p.grad - g_full[n]).abs().max() / scale < 1e-4, n


def _one_step(tmp_path, tiny_model_dir, share: bool, name: str, fuse: bool = True, *extra: str):
    cfg = small_config(
        tmp_path / str(share),
        tiny_model_dir,
        *extra,
        f"algorithm.name={name}",
        "algorithm.stare.target_entropy=100",
        "trainer.total_steps=1",
        f"trainer.share_prefix={str(share).lower()}",
        "logging.transcripts=true",
    )
    trainer = make_trainer(cfg, log=lambda *_: None)
    trainer.learner.fuse_old_logprobs = fuse
    assert trainer.learner.share_prefix is share
    history = trainer.train()
    return history[0], {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


@pytest.mark.parametrize(
    "name,variant",
    [("stare", "share"), ("grpo", "share"), ("grpo", "fuse"), ("grpo", "fuse-tis")],
    ids=[
        "stare-shared-prefix",
        "grpo-shared-prefix",
        "grpo-fused-old-logprobs",
        "grpo-tis-fused-old-logprobs",
    ],
)
def test_trainer_step_is_the_same_with_and_without_the_shortcuts(
    tmp_path, tiny_model_dir, name, variant, monkeypatch
):
    """Shared-prefix forward on/off, and (GRPO, one on-policy pass, with or without TIS) the old
    log-probs taken from the gradient forward instead of a separate no-grad pass: same metrics, same
    updated weights."""
    if variant == "share":
        m_on, w_on = _one_step(tmp_path, tiny_model_dir, True, name)
        m_off, w_off = _one_step(tmp_path, tiny_model_dir, False, name)
    else:
        extra = ["algorithm.is_correction=tis"] if variant == "fuse-tis" else []
        if (
            extra
        ):  # a float32 engine matches the trainer to 1e-7: a gap, a function of each value, gives weights ≠ 1
            from agentrl.training import offpolicy

            real = offpolicy.tis_weights
            gap = lambda old, ro, has, cap: real(old, ro - 0.2 + 0.3 * torch.sin(1e3 * ro), has, cap)  # noqa: E731
            monkeypatch.setattr(offpolicy, "tis_weights", gap)
        m_on, w_on = _one_step(tmp_path / "a", tiny_model_dir, True, name, True, *extra)
        m_off, w_off = _one_step(tmp_path / "b", tiny_model_dir, True, name, False, *extra)
        if extra:  # the same weights, far from 1, applied on both paths
            assert abs(m_on["offpolicy/tis_mean"] - 1) > 0.01
            assert m_on["offpolicy/tis_mean"] == pytest.approx(m_off["offpolicy/tis_mean"], rel=1e-6)
    keys = ["loss/pg_loss", "entropy/mean", "entropy/branching", "grad/norm", "loss/ratio_mean"]
    keys += ["stare/entropy_mean"] if name == "stare" else []
    for key in keys:
        assert key in m_on, key
        assert abs(m_on[key] - m_off[key]) <= 1e-4 * max(1.0, abs(m_off[key])), (key, m_on[key], m_off[key])
    # Adam's first step is lr * g / (|g| + eps): coordinates whose gradient is near eps turn float
    # rounding into visible differences, so compare against the step size (lr = 1e-3), not 0. A wrong
    # forward would move most weights by a whole step.
    for n in w_on:
        diff = (w_on[n] - w_off[n]).abs()
        assert diff.max() < 1e-4, (n, float(diff.max()))
        assert (diff > 1e-5).float().mean() < 1e-3, n


def test_sft_losses_are_the_same_with_and_without_prefix_sharing(tiny_model_dir):
    """SFT on demonstrations in two groups (two prompts, loss on the answers only): the shared-prefix
    forward changes the work, not the losses."""
    from agentrl.models import load_policy
    from agentrl.training.sft import sft_train

    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(5, 900, (16,), generator=g).tolist() for _ in range(2)]
    examples = []
    for i in range(8):
        answer = torch.randint(5, 900, (6 + i,), generator=g).tolist()
        ids = prompts[i % 2] + answer
        examples.append((ids, [0] * 16 + [1] * len(answer)))
    losses = {}
    for share in (True, False):
        model, _ = load_policy(tiny_model_dir)
        res = sft_train(model, examples, steps=3, lr=1e-3, batch_size=8, seed=0, share_prefix=share)
        losses[share] = res.losses
    assert losses[True] == pytest.approx(losses[False], abs=1e-5)
