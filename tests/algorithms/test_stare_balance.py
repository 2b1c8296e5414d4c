"""The batch's first-order entropy balance (Λ, Γ±, W*) and the critical controller, against
``entropy_theory`` and a brute-force step of a tabular softmax policy."""

import math

import pytest
import torch

from agentrl.algorithms import (
    StareController,
    WeightingInputs,
    entropy_phi,
    stare_weights,
    token_shares,
    token_stats_with_phi,
    token_stats_with_phi_from_hidden,
)
from agentrl.algorithms.entropy_theory import softmax_entropy
from agentrl.algorithms.stare import stare_selection
from agentrl.algorithms.stare_balance import Balance, critical_weights, entropy_balance


def tabular_batch(seed=0, rows=6, cols=12, vocab=16):
    """Logits [B, T, V] of a tabular policy (one softmax per position), sampled tokens, per-row
    advantages, a ragged mask: a batch whose L+ (high-surprisal A > 0 tokens) raises entropy."""
    g = torch.Generator().manual_seed(seed)
    logits = (1.5 + 2.5 * torch.rand(rows, cols, 1, generator=g)) * torch.randn(
        rows, cols, vocab, generator=g
    )
    logits = logits.double()
    ids = torch.multinomial(torch.softmax(logits, -1).reshape(-1, vocab), 1, generator=g).reshape(rows, cols)
    adv = torch.tensor([1.0, -0.5, 0.8, -1.2, 0.4, -0.3], dtype=torch.float64)[:rows]
    lengths = torch.tensor([12, 9, 12, 5, 11, 7])[:rows]
    mask = torch.arange(cols)[None, :] < lengths[:, None]
    return logits, ids, adv, mask


def brute_force_change(logits, ids, adv, share, weights, lr):
    """Σ_t H(z_t') − H(z_t) after one SGD step of the surrogate −Σ c·ω·A·log π(a) at ratio 1 on the
    tabular logits themselves (autograd, float64)."""
    z = logits.clone().requires_grad_(True)
    logp = torch.log_softmax(z, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    loss = -(share * weights * adv[:, None] * logp).sum()
    (grad,) = torch.autograd.grad(loss, z)
    return float((softmax_entropy(logits - lr * grad) - softmax_entropy(logits))[share > 0].sum())


def inputs_of(logits, ids, adv, mask, agg="token-mean"):
    logp = torch.log_softmax(logits, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    return WeightingInputs.build(
        logp, softmax_entropy(logits), adv, mask, phi=entropy_phi(logits, ids), share=token_shares(mask, agg)
    )


def test_phi_from_the_same_pass_matches_entropy_theory():
    g = torch.Generator().manual_seed(3)
    logits = 3 * torch.randn(2, 7, 40, generator=g)
    ids = torch.randint(0, 40, (2, 7), generator=g)
    _, ent, phi = token_stats_with_phi(logits, ids, temperature=0.7, chunk_size=3)
    ref = entropy_phi(logits / 0.7, ids)
    assert torch.allclose(phi.double(), ref, atol=2e-6)
    assert torch.allclose(ent.double(), softmax_entropy(logits / 0.7), atol=2e-5)
    hidden, head = torch.randn(2, 7, 8, generator=g), torch.randn(40, 8, generator=g)
    bias = torch.randn(40, generator=g)
    _, _, phi_h = token_stats_with_phi_from_hidden(hidden, head, ids, chunk_size=5, lm_head_bias=bias)
    assert torch.allclose(phi_h.double(), entropy_phi(hidden @ head.T + bias, ids), atol=2e-6)


def test_token_shares_read_the_aggregation():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]]).bool()
    assert torch.equal(token_shares(mask, "token-mean"), mask.float())
    want = torch.tensor([[1 / 3, 1 / 3, 1 / 3, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    assert torch.allclose(token_shares(mask, "seq-mean-token-mean"), want)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_balance_is_the_first_order_change_of_a_tabular_step(agg):
    logits, ids, adv, mask = tabular_batch()
    inputs = inputs_of(logits, ids, adv, mask, agg)
    l_pos, l_neg, _, _ = stare_selection(inputs, 0.2, [torch.arange(mask.shape[0])])
    bal = entropy_balance(inputs.phi, inputs.advantages, inputs.share, l_pos, l_neg)
    assert bal.gain_pos > 0 and bal.gain_neg > 0  # high-surprisal selections: the entropy-raising levers
    lr = 1e-5
    for w, m in [(1.0, 1.0), (1.7, 1.0), (3.0, 0.4), (bal.w_star, 1.0)]:
        weights = torch.ones_like(logits[..., 0])
        weights[l_pos], weights[l_neg] = w, m
        exact = brute_force_change(logits, ids, adv, inputs.share.double(), weights, lr) / lr
        assert exact == pytest.approx(bal.change(w, m), rel=1e-3, abs=1e-4 * abs(bal.drive))
    # the sign flips at W*: below it entropy falls (when Λ > 0), above it it rises
    assert bal.drive > 0 and bal.w_star > 1
    below, above = bal.w_star - 0.2, bal.w_star + 0.2
    weights = torch.ones_like(logits[..., 0])
    weights[l_pos] = below
    assert brute_force_change(logits, ids, adv, inputs.share.double(), weights, lr) < 0
    weights[l_pos] = above
    assert brute_force_change(logits, ids, adv, inputs.share.double(), weights, lr) > 0
    assert bal.change(bal.w_star_c2, 2 - bal.w_star_c2) == pytest.approx(0, abs=1e-9 * abs(bal.drive) + 1e-12)
    frac = float((inputs.phi[l_pos] > 0).double().mean())
    assert bal.lowering_frac == pytest.approx(frac)


def test_critical_weights_meet_the_margin_within_bounds():
    bal = Balance(drive=2.0, gain_pos=0.5, gain_neg=0.3, lowering_frac=0.1)
    w, m = critical_weights(bal, "O1", margin=0.25, w_max=100, m_min=0.0)
    assert m == 1.0 and bal.change(w, m) == pytest.approx(0.25 * 2.0)
    w, m = critical_weights(bal, "C2", margin=0.25, w_max=100, m_min=0.0)
    assert w - 1 == pytest.approx(1 - m) or m == 0.0
    assert bal.change(w, m) == pytest.approx(0.5)
    w, m = critical_weights(bal, "C2", margin=0.25, w_max=100, m_min=0.5)  # M at its floor, W the rest
    assert m == 0.5 and bal.change(w, m) == pytest.approx(0.5)
    assert critical_weights(bal, "O1", 0.25, w_max=2.0, m_min=0.5) == (2.0, 1.0)  # bounded
    assert critical_weights(Balance(-1.0, 0.5, 0.3, 0.0), "C2", 0.25, 10, 0.5) == (1.0, 1.0)  # rising already
    assert critical_weights(Balance(1.0, -0.2, 0.0, 1.0), "O1", 0.25, 10, 0.5) == (1.0, 1.0)  # no lever
    assert Balance(1.0, -0.2, 0.0, 1.0).w_star == math.inf
    assert math.isnan(Balance(-1.0, 0.0, 0.0, math.nan).w_star)


def test_stare_logs_the_balance_and_the_critical_controller_sets_w_from_it():
    logits, ids, adv, mask = tabular_batch()
    inputs = inputs_of(logits, ids, adv, mask)
    gate = stare_weights(inputs, target_entropy=100.0)
    for key in (
        "lambda",
        "gamma_pos",
        "gamma_neg",
        "w_star",
        "w_star_c2",
        "lpos_lowering_frac",
        "dH_first_order",
    ):
        assert key in gate.stats
    assert gate.stats["dH_first_order"] == pytest.approx(
        -gate.stats["lambda"] + 0.1 * gate.stats["gamma_pos"]
    )
    ctl = StareController(law="critical", w_max=50.0, margin=0.25)
    tw = stare_weights(inputs, target_entropy=100.0, controller=ctl)
    bal = Balance(tw.stats["lambda"], tw.stats["gamma_pos"], tw.stats["gamma_neg"], 0.0)
    assert bal.drive > 0 and bal.gain_pos > 0  # entropy falls at ω ≡ 1, and L+ can raise it
    assert tw.stats["w"] == pytest.approx(1 + 1.25 * bal.drive / bal.gain_pos)
    assert tw.stats["dH_first_order"] == pytest.approx(0.25 * bal.drive)
    boosted = tw.weights[tw.weights != 1]
    assert len(boosted) == tw.stats["n_sel_pos"] and torch.allclose(boosted, torch.tensor(tw.stats["w"]))
    off = stare_weights(inputs, target_entropy=1e-6, controller=ctl)  # gate off: ω ≡ 1
    assert off.stats["gate_on"] == 0.0 and torch.all(off.weights == 1)
    assert off.stats["dH_first_order"] == pytest.approx(-off.stats["lambda"])
    bare = WeightingInputs.build(inputs.logp_old, inputs.entropy, adv, mask)
    with pytest.raises(ValueError, match="entropy balance"):
        stare_weights(bare, controller=ctl)
