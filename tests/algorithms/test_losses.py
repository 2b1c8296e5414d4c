"""Surrogate, KL, aggregation and the whole policy loss: hand examples and invariances."""

import math

import pytest
import torch

from agentrl.algorithms import (
    AGGREGATIONS,
    aggregate,
    clipped_surrogate,
    k3_kl,
    loss_normaliser,
    policy_loss,
    token_logprobs_and_entropy,
)


def test_clipped_surrogate_hand_values():
    # ε_low .2, ε_high .28, c = 3:
    # A=+1, r=1.5: max(-1.5, -1.28) = -1.28   A=+1, r=0.5: max(-0.5, -0.8) = -0.5
    # A=-1, r=1.5: max(1.5, 1.2) = 1.5        A=-1, r=5: max(5, 1.2) = 5 -> dual clip min(5, 3) = 3
    # A=-1, r=0.5: max(0.5, 0.8) = 0.8
    r = torch.tensor([1.5, 0.5, 1.5, 5.0, 0.5])
    a = torch.tensor([1.0, 1.0, -1.0, -1.0, -1.0])
    out = clipped_surrogate(r, a, 0.2, 0.28, 3.0)
    torch.testing.assert_close(out, torch.tensor([-1.28, -0.5, 1.5, 3.0, 0.8]), rtol=0, atol=1e-6)
    no_dual = clipped_surrogate(r, a, 0.2, 0.28, None)
    assert no_dual[3].item() == pytest.approx(5.0)


def test_k3_hand_value():
    # logp = 0, logp_ref = ln .5: exp(d) - d - 1 = .5 + .693147 - 1 = .193147; clamped at 10 far out.
    out = k3_kl(torch.tensor([0.0, 0.0]), torch.tensor([math.log(0.5), 30.0]))
    torch.testing.assert_close(out, torch.tensor([0.5 + math.log(2) - 1, 10.0]), rtol=0, atol=1e-6)


def _agg_example():
    x = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0], [9.0, 9.0, 9.0, 9.0]])
    m = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)  # row 2: void
    return x, m


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 10 / 4),  # (1+2+3+4) / 4 tokens
        ("seq-mean-token-mean", (2 + 4) / 2),  # means 2 and 4 over the 2 non-empty sequences
        ("seq-mean-token-sum", (6 + 4) / 2),  # sums 6 and 4 over 2 sequences
        ("seq-mean-token-sum-norm", 10 / (2 * 4)),  # Σ / (2 sequences × max_len 4)
    ],
)
def test_aggregation_hand_values(mode, expected):
    x, m = _agg_example()
    assert aggregate(x, m, mode, loss_normaliser(m, mode, max_len=4)).item() == pytest.approx(expected)


def _random_batch(seed=0, b=8, t=6, v=7):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, t, v, generator=g, dtype=torch.float64).requires_grad_()
    ids = torch.randint(v, (b, t), generator=g)
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    mask = torch.arange(t)[None, :] < lengths[:, None]
    mask[1, 0] = False  # a masked hole (tool token) inside a response
    mask[5] = False  # a void-turn episode
    logp_old = (
        torch.log_softmax(logits.detach(), -1).gather(-1, ids[..., None]).squeeze(-1)
    ) - 0.1 * torch.randn(b, t, generator=g, dtype=torch.float64)
    adv = torch.randn(b, generator=g, dtype=torch.float64)
    weights = 0.5 + torch.rand(b, t, generator=g, dtype=torch.float64)
    logp_ref = logp_old + 0.2 * torch.randn(b, t, generator=g, dtype=torch.float64)
    return logits, ids, mask, logp_old, adv, weights, logp_ref


def _loss(logits, ids, mask, logp_old, adv, weights, logp_ref, rows, mode, norm):
    logp, ent = token_logprobs_and_entropy(logits[rows], ids[rows], temperature=1.0, chunk_size=5)
    loss, _, _ = policy_loss(
        logp.double(),
        logp_old[rows],
        adv[rows],
        mask[rows],
        normaliser=norm,
        agg_mode=mode,
        weights=weights[rows],
        logp_ref=logp_ref[rows],
        kl_coef=0.1,
        entropy=ent.double(),
        entropy_coef=0.01,
    )
    return loss


@pytest.mark.parametrize("mode", sorted(AGGREGATIONS))
def test_gradient_accumulation_1x8_equals_8x1(mode):
    logits, ids, mask, logp_old, adv, weights, logp_ref = _random_batch()
    norm = loss_normaliser(mask, mode, max_len=6)
    full = _loss(logits, ids, mask, logp_old, adv, weights, logp_ref, slice(None), mode, norm)
    (g_full,) = torch.autograd.grad(full, logits)
    parts = [
        _loss(logits, ids, mask, logp_old, adv, weights, logp_ref, slice(i, i + 1), mode, norm)
        for i in range(8)
    ]
    (g_acc,) = torch.autograd.grad(sum(parts), logits)
    torch.testing.assert_close(sum(parts), full, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(g_acc, g_full, rtol=1e-5, atol=1e-7)
    assert g_full.abs().sum() > 0


def test_masked_tokens_never_change_loss_or_stats():
    logits, ids, mask, logp_old, adv, weights, logp_ref = _random_batch(seed=1)
    logp = torch.log_softmax(logits.detach(), -1).gather(-1, ids[..., None]).squeeze(-1).requires_grad_()
    ent = torch.rand_like(logp_old)
    adv_tok = adv[:, None].expand_as(logp_old).clone()

    def run(logp_, old, a, w, ref, h):
        loss, stats, _ = policy_loss(
            logp_, old, a, mask, normaliser=loss_normaliser(mask, "token-mean"), weights=w,
            logp_ref=ref, kl_coef=0.1, entropy=h, entropy_coef=0.01,
        )  # fmt: skip
        (grad,) = torch.autograd.grad(loss, logp_)
        return loss.detach(), stats, grad

    base = run(logp, logp_old, adv_tok, weights, logp_ref, ent)
    off = ~mask
    bump = torch.where(off, torch.full_like(logp_old, 7.3), torch.zeros_like(logp_old))
    perturbed = run(
        (logp.detach() - bump).requires_grad_(), logp_old + bump, adv_tok + 5 * bump, weights + bump,
        logp_ref - bump, ent + bump,
    )  # fmt: skip
    assert torch.equal(base[0], perturbed[0])
    assert base[1] == perturbed[1]
    assert torch.equal(base[2], perturbed[2])
    assert base[2][off].abs().sum() == 0


def test_multi_turn_structure_does_not_change_the_loss():
    # Episode 0: 6 policy tokens as 3 turns of 2, separated by masked tool tokens; episode 1: the same
    # 6 policy tokens in one turn. Every mode gives both the same per-token gradient weight, since
    # aggregation depends only on policy-token counts, never on how they are split into turns.
    x = torch.tensor([[1.0, 2.0, 0.0, 0.0, 3.0, 4.0, 0.0, 5.0, 6.0], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 0, 0, 0]])
    m = torch.tensor([[1, 1, 0, 0, 1, 1, 0, 1, 1], [1, 1, 1, 1, 1, 1, 0, 0, 0]], dtype=torch.bool)
    for mode in sorted(AGGREGATIONS):
        xs = x.clone().requires_grad_()
        aggregate(xs, m, mode, loss_normaliser(m, mode, max_len=9)).backward()
        torch.testing.assert_close(xs.grad[0][m[0]], xs.grad[1][m[1]], rtol=0, atol=0)


def test_kl_cov_abs_penalty_and_no_clip():
    # One token, A = +1, logp - logp_old = ln 2 (r = 2): unclipped -A·r = -2; + β|Δ| = 0.5·ln 2.
    logp, old = torch.tensor([[math.log(2.0)]]), torch.tensor([[0.0]])
    m = torch.tensor([[True]])
    loss, _, _ = policy_loss(logp, old, torch.tensor([1.0]), m, normaliser=1.0, clip=False,
                          abs_kl_weights=torch.tensor([[0.5]]))  # fmt: skip
    assert loss.item() == pytest.approx(-2.0 + 0.5 * math.log(2.0), abs=1e-6)
    clipped, stats, _ = policy_loss(logp, old, torch.tensor([1.0]), m, normaliser=1.0)
    assert clipped.item() == pytest.approx(-1.28, abs=1e-6)  # clip at 1 + 0.28
    assert stats["clip_frac_high"] == 1.0 and stats["clip_frac_low"] == 0.0
