"""STEER, STAPO, Clip-Cov, KL-Cov, high-entropy minority, and the registry."""

import math

import pytest
import torch

from agentrl.algorithms import (
    WEIGHTINGS,
    StepContext,
    WeightingInputs,
    compute_weights,
    loss_normaliser,
    masked_quantile,
    policy_loss,
)
from tests.helpers.weighting_inputs import perturb_masked, random_inputs


def steer_batch() -> WeightingInputs:
    # Three policy tokens and one masked (tool) token with extreme values.
    # t0: A=+1, π=.5, H=1:   Ω = (1/.5)·.5·.5·(ln .5 + 1)     = .153426
    # t1: A=-1, π=.25, H=1:  Ω = (-1/.25)·.25·.75·(ln .25 + 1) = .289721
    # t2: A=+1, π=.5, H=1.5: Ω = .5·(ln .5 + 1.5)              = .403426
    logp_old = torch.log(torch.tensor([[0.5, 0.25, 0.5, 1e-6]]))
    entropy = torch.tensor([[1.0, 1.0, 1.5, 50.0]])
    adv = torch.tensor([[1.0, -1.0, 1.0, 9.0]])
    return WeightingInputs.build(logp_old, entropy, adv, torch.tensor([[1, 1, 1, 0]]))


def test_steer_linear_hand_values():
    # a_min .153426, a_max .403426 (range .25): w = 1.2 - (a - a_min)·0.4/0.25
    # -> [1.2, 1.2 - .136295·1.6 = .981929, 0.8]; the masked token stays 1.
    tw = compute_weights("steer", steer_batch(), mode="linear")
    torch.testing.assert_close(tw.weights, torch.tensor([[1.2, 0.981929, 0.8, 1.0]]), rtol=0, atol=1e-5)


def test_steer_exp_hand_values():
    # k = -ln .8 / .403426 = .553121; w = clamp(exp(-k·a), .8, 1) -> [.918638, .851930, .8]
    tw = compute_weights("steer", steer_batch(), mode="exp")
    torch.testing.assert_close(tw.weights, torch.tensor([[0.918638, 0.851930, 0.8, 1.0]]), rtol=0, atol=1e-5)


def test_steer_single_value_gives_midpoint():
    one = WeightingInputs.build(torch.tensor([[-0.7]]), torch.tensor([[1.0]]), torch.tensor([1.0]),
                                torch.tensor([[1]]))  # fmt: skip
    assert compute_weights("steer", one).weights.item() == pytest.approx(1.0)  # (0.8 + 1.2) / 2


def test_stapo_hand_example():
    # t0: A>0, π=.001 < .002, H=.1 -> spurious (dropped). t1: same but H=2 (high) -> kept.
    # t2: A<0 -> kept. t3: π=.5 -> kept. t4: π=.5. H sorted [.1,.1,.1,1,2]: q.8 at pos 3.2 -> 1 + .2·1 = 1.2.
    logp_old = torch.log(torch.tensor([[0.001, 0.001, 0.001, 0.5, 0.5]]))
    entropy = torch.tensor([[0.1, 2.0, 0.1, 0.1, 1.0]])
    adv = torch.tensor([[1.0, 1.0, -1.0, 1.0, 1.0]])
    inputs = WeightingInputs.build(logp_old, entropy, adv, torch.ones(1, 5))
    tw = compute_weights("stapo", inputs)
    assert tw.mask.tolist() == [[False, True, True, True, True]]
    assert tw.stats["drop_frac"] == pytest.approx(0.2) and tw.stats["entropy_threshold"] == pytest.approx(1.2)
    # the denominator is renormalised over kept tokens: Σ I·m·L / Σ I·m with 4 kept tokens
    per_token = torch.tensor([[5.0, 1.0, 2.0, 3.0, 4.0]])
    loss, _, _ = policy_loss(torch.zeros(1, 5), torch.zeros(1, 5), -per_token, tw.mask,
                          normaliser=loss_normaliser(tw.mask, "token-mean"), weights=tw.weights)  # fmt: skip
    assert loss.item() == pytest.approx((1 + 2 + 3 + 4) / 4)  # r = 1, L = -A = per_token


def cov_batch() -> WeightingInputs:
    # A = [2, 2, -2, -2] (mean 0), logp = [0, -4, 0, -3] (mean -1.75):
    # c = [2·1.75, 2·(-2.25), -2·1.75, -2·(-1.25)] = [3.5, -4.5, -3.5, 2.5]; a masked token would have c = 20.
    logp_old = torch.tensor([[0.0, -4.0, 0.0, -3.0, -40.0]])
    adv = torch.tensor([[2.0, 2.0, -2.0, -2.0, 2.0]])
    return WeightingInputs.build(logp_old, torch.ones(1, 5), adv, torch.tensor([[1, 1, 1, 1, 0]]))


def test_clip_cov_hand_example():
    # eligible (1 < c < 5): t0 (3.5), t3 (2.5); r_c = 2e-4 -> max(1, ⌊.0008⌋) = 1 random pick of the two.
    g = torch.Generator().manual_seed(0)
    tw = compute_weights("clip_cov", cov_batch(), generator=g)
    zeros = (tw.weights == 0).nonzero()[:, 1].tolist()
    assert len(zeros) == 1 and zeros[0] in (0, 3)
    assert tw.stats["n_eligible"] == 2 and tw.mask.tolist() == [[True] * 4 + [False]]
    both = compute_weights("clip_cov", cov_batch(), ratio=0.5)  # ⌊.5·4⌋ = 2 -> both eligible tokens
    assert both.weights.tolist() == [[0.0, 1.0, 1.0, 0.0, 1.0]]


def test_kl_cov_hand_example():
    # top max(1, ⌊2e-3·4⌋) = 1 token by c -> t0 (3.5); ratio .5 -> 2 tokens -> t0, t3 (2.5).
    tw = compute_weights("kl_cov", cov_batch())
    assert tw.abs_kl_weights.tolist() == [[1.0, 0.0, 0.0, 0.0, 0.0]] and tw.clip is False
    two = compute_weights("kl_cov", cov_batch(), ratio=0.5, beta=0.5)
    assert two.abs_kl_weights.tolist() == [[0.5, 0.0, 0.0, 0.5, 0.0]]


def test_high_entropy_hand_example():
    # H = [.1, .5, .9, 1.3, 1.7] (+ a masked 9.0): ρ = .2 -> q.8 at pos 3.2 -> 1.3 + .2·.4 = 1.38 -> keep 1.7
    # ρ = .4 -> q.6 at pos 2.4 -> .9 + .4·.4 = 1.06 -> keep 1.3, 1.7. Masked tokens keep weight 1 (ignored).
    ent = torch.tensor([[0.1, 0.5, 0.9, 1.3, 1.7, 9.0]])
    inputs = WeightingInputs.build(
        torch.zeros(1, 6), ent, torch.tensor([1.0]), torch.tensor([[1, 1, 1, 1, 1, 0]])
    )
    tw = compute_weights("high_entropy", inputs)
    assert tw.weights.tolist() == [[0, 0, 0, 0, 1, 1]] and tw.stats["entropy_threshold"] == pytest.approx(
        1.38
    )
    assert compute_weights("high_entropy", inputs, rho=0.4).weights.tolist() == [[0, 0, 0, 1, 1, 1]]


def test_masked_quantile_matches_torch_quantile():
    g = torch.Generator().manual_seed(0)
    x, m = torch.randn(7, 9, generator=g), torch.rand(7, 9, generator=g) > 0.3
    for q in (0.0, 0.2, 0.5, 0.8, 1.0):
        assert masked_quantile(x, m, q) == pytest.approx(torch.quantile(x[m], q).item(), abs=1e-6)
    assert math.isnan(masked_quantile(x, torch.zeros_like(m), 0.5))


SETTINGS = {  # settings that make each built-in method act on random_inputs (defaults for the rest)
    "stare": {"controller": "pi", "P": 0.2},
    "stapo": {"tau_p": 0.5},
    "clip_cov": {"ratio": 0.05, "lb": -10.0, "ub": 10.0},
    "kl_cov": {"ratio": 0.05},
}


def record_kwargs(name: str) -> dict:
    """The keyword arguments the trainer would pass: the record's settings -> arguments mapping."""
    record = WEIGHTINGS[name]
    settings = record.settings(**SETTINGS.get(name, {})) if record.settings else None
    return record.kwargs(settings, StepContext(seed=1, row_groups=[[0, 1], [2, 3], [4, 5], [6, 7]]))


@pytest.mark.parametrize("name", sorted(WEIGHTINGS))
def test_masked_tokens_never_change_any_weighting(name):
    inputs = random_inputs(seed=11)
    base = compute_weights(name, inputs, **record_kwargs(name))
    pert = compute_weights(name, perturb_masked(inputs, 12), **record_kwargs(name))
    assert torch.equal(base.weights, pert.weights) and torch.equal(base.mask, pert.mask)
    assert base.stats == pert.stats and base.state == pert.state
    if base.abs_kl_weights is not None:
        assert torch.equal(base.abs_kl_weights, pert.abs_kl_weights)
    # and the method acted on this batch (a test that cannot see a change would prove nothing)
    acted = (base.weights[inputs.mask] != 1).any() or not torch.equal(base.mask, inputs.mask)
    assert acted or base.abs_kl_weights is not None or name == "none"


def test_registry_rejects_unknown_names():
    with pytest.raises(ValueError, match="unknown token weighting"):
        compute_weights("nope", random_inputs())
    assert {"none", "stare", "steer", "stapo", "clip_cov", "kl_cov", "high_entropy"} <= set(WEIGHTINGS)


def test_stapo_tau_zero_drops_nothing():
    # τ_p = 0 (allowed by the config): no probability is below 0, so no token is spurious. This was
    # log(0) -> "math domain error" before.
    logp_old = torch.log(torch.tensor([[1e-9, 0.001, 0.5]]))
    inputs = WeightingInputs.build(logp_old, torch.zeros(1, 3), torch.tensor([1.0]), torch.ones(1, 3))
    tw = compute_weights("stapo", inputs, prob_threshold=0.0)
    assert tw.mask.tolist() == [[True, True, True]] and tw.stats["n_dropped"] == 0
