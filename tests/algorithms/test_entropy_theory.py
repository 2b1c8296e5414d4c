"""The first-order entropy change (four quadrants) against an exact finite difference."""

import torch

from agentrl.algorithms import entropy_phi, exact_entropy_change, first_order_entropy_change


def random_softmaxes(n=3000, seed=0):
    g = torch.Generator().manual_seed(seed)
    vocab = 12
    scale = 2 + 3 * torch.rand(n, 1, generator=g, dtype=torch.float64)  # logit scales 2–5
    logits = scale * torch.randn(n, vocab, generator=g, dtype=torch.float64)
    action = torch.multinomial(torch.softmax(logits, -1), 1, generator=g).squeeze(-1)
    adv = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).double()
    return logits, action, adv


def test_first_order_sign_agrees_with_exact_change():
    logits, action, adv = random_softmaxes()
    pred = first_order_entropy_change(logits, action, adv, lr=0.01)
    exact = exact_entropy_change(logits, action, adv, lr=0.01)
    agree = torch.sign(pred) == torch.sign(exact)
    assert (
        agree.double().mean() >= 0.99
    )  # docs/algorithms.md, "The entropy lab" measured 99.4–100 % at η = 0.01
    big = pred.abs() > 1e-3
    assert big.sum() > 100 and agree[big].all()  # 100 % where the predicted change is not tiny
    rel = ((pred - exact).abs() / exact.abs())[big]
    assert rel.median() < 0.01


def test_four_quadrants():
    # The most likely token has s_a ≤ H and φ > 0; the least likely has φ < 0 (Chebyshev's sum
    # inequality makes E_π[π_j(H - s_j)] ≥ 0). So, exactly:
    # A>0 & low surprisal: H falls; A<0 & low: rises; A>0 & high surprisal: rises; A<0 & high: falls.
    logits, _, _ = random_softmaxes(n=1000, seed=1)
    top, bottom = logits.argmax(-1), logits.argmin(-1)
    pos, neg = torch.ones(1000, dtype=torch.float64), -torch.ones(1000, dtype=torch.float64)
    assert (entropy_phi(logits, top) > 0).all() and (entropy_phi(logits, bottom) < 0).all()
    assert (exact_entropy_change(logits, top, pos, 0.01) < 0).all()
    assert (exact_entropy_change(logits, top, neg, 0.01) > 0).all()
    assert (exact_entropy_change(logits, bottom, pos, 0.01) > 0).all()
    assert (exact_entropy_change(logits, bottom, neg, 0.01) < 0).all()


def test_phi_hand_example():
    # π = [1/2, 1/4, 1/4]: H = 1.5 ln 2 = 1.039721; π_j(H - s_j) = [.5(1.5-1), .25(1.5-2), .25(1.5-2)]·ln 2
    # = [.25, -.125, -.125]·ln 2; E_π = (.125 - .03125 - .03125)·ln 2 = .0625 ln 2;
    # φ_0 = (.25 - .0625) ln 2 = .129968, φ_1 = (-.125 - .0625) ln 2 = -.129968.
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.25]], dtype=torch.float64))
    ln2 = torch.log(torch.tensor(2.0, dtype=torch.float64))
    torch.testing.assert_close(entropy_phi(logits, torch.tensor([0])), (0.1875 * ln2).reshape(1))
    torch.testing.assert_close(entropy_phi(logits, torch.tensor([1])), (-0.1875 * ln2).reshape(1))
