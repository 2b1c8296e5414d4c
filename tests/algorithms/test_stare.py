"""STARE: selection, gate, variants, scopes, controllers, and its invariances."""

import json
import math

import pytest
import torch

from agentrl.algorithms import (
    StareController,
    StareState,
    WeightingInputs,
    loss_normaliser,
    policy_loss,
    stare_weights,
    update_stare_state,
)
from agentrl.algorithms.stare import selection_size
from tests.helpers.weighting_inputs import perturb_masked, random_inputs


def hand_batch(entropy_value: float) -> WeightingInputs:
    """Row 0: A = +1, position 2 is tool output (masked, surprisal 9); row 1: A = -1, position 4 is
    padding (masked, surprisal 8); row 2: A = 0 with the highest surprisals of all (5, 6, 7)."""
    logp_old = torch.tensor(
        [[-0.1, -2.0, -9.0, -0.5, -3.0], [-1.0, -0.2, -4.0, -0.3, -8.0], [-5.0, -6.0, -7.0, 0.0, 0.0]]
    )
    mask = torch.tensor([[1, 1, 0, 1, 1], [1, 1, 1, 1, 0], [1, 1, 1, 0, 0]])
    return WeightingInputs.build(
        logp_old, torch.full_like(logp_old, entropy_value), torch.tensor([1.0, -1.0, 0.0]), mask
    )


def test_selection_size():
    # k = min(n, max(1, ceil(P·n))); 0.1·30 is 3.0000000000000004 in floats but k must be 3.
    assert [selection_size(n, 0.1) for n in (0, 1, 4, 11, 30)] == [0, 1, 1, 2, 3]
    assert selection_size(5, 1.0) == 5 and selection_size(5, 0.0) == 0


def test_hand_example_c2_and_o1():
    # H̄ = 0.1 < 0.3 -> gate on. T+ surprisals (row 0, valid) [.1, 2, .5, 3] -> k+ = 1 -> (0, 4);
    # T- surprisals (row 1, valid) [1, .2, 4, .3] -> k- = 1 -> (1, 2). Tool/padding/A=0 never picked.
    tw = stare_weights(hand_batch(0.1), variant="C2", target_entropy=0.3)
    expected = torch.ones(3, 5)
    expected[0, 4], expected[1, 2] = 1.1, 0.9
    torch.testing.assert_close(tw.weights, expected, rtol=0, atol=0)
    s = tw.stats
    assert (s["gate_on"], s["n_pos"], s["n_neg"], s["n_sel_pos"], s["n_sel_neg"]) == (1.0, 4, 4, 1, 1)
    # mean weight over the 11 policy tokens: (11 + 0.1 - 0.1) / 11 = 1.
    assert s["mean_weight"] == pytest.approx(1.0) and s["w"] == 1.1 and s["m"] == 0.9
    o1 = stare_weights(hand_batch(0.1), variant="O1", target_entropy=0.3)
    expected[1, 2] = 1.0
    torch.testing.assert_close(o1.weights, expected, rtol=0, atol=0)
    assert o1.stats["n_sel_neg"] == 0


def test_hand_example_p_half():
    # P = 0.5: k± = ceil(2) = 2 -> L+ = {(0,4) s=3, (0,1) s=2}; L- = {(1,2) s=4, (1,0) s=1}.
    ctl = StareController(w=2.0, m=0.5, p=0.5)
    tw = stare_weights(hand_batch(0.1), variant="C2", controller=ctl, target_entropy=0.3)
    expected = torch.ones(3, 5)
    expected[0, 4] = expected[0, 1] = 2.0
    expected[1, 2] = expected[1, 0] = 0.5
    torch.testing.assert_close(tw.weights, expected, rtol=0, atol=0)


def test_gate_is_strict_and_off_means_unit_weights():
    for h in (0.25, 0.5):  # H̄ = H_tgt (exact in binary) is not below it
        tw = stare_weights(hand_batch(h), target_entropy=0.25)
        assert tw.stats["gate_on"] == 0.0 and torch.equal(tw.weights, torch.ones(3, 5))


def test_gate_off_is_exactly_grpo_ds():
    inputs = random_inputs(seed=3, mean_entropy=1.0)
    tw = stare_weights(inputs, target_entropy=0.3)  # H̄ ≈ 1 > 0.3: gate off
    assert tw.stats["gate_on"] == 0.0
    g = torch.Generator().manual_seed(4)
    logp = (inputs.logp_old + 0.1 * torch.randn(inputs.logp_old.shape, generator=g)).requires_grad_()
    norm = loss_normaliser(inputs.mask, "token-mean")
    kw = dict(normaliser=norm, dual_clip=10.0)
    stare_loss, _, _ = policy_loss(
        logp, inputs.logp_old, inputs.advantages, tw.mask, weights=tw.weights, **kw
    )
    (g_stare,) = torch.autograd.grad(stare_loss, logp)
    grpo_loss, _, _ = policy_loss(logp, inputs.logp_old, inputs.advantages, inputs.mask, **kw)
    (g_grpo,) = torch.autograd.grad(grpo_loss, logp)
    assert torch.equal(stare_loss, grpo_loss) and torch.equal(g_stare, g_grpo)


def test_zero_advantage_never_selected_and_k_at_least_one():
    inputs = random_inputs(seed=1)
    tw = stare_weights(inputs, controller=StareController(w=2.0, m=0.5, p=0.3), target_entropy=0.3)
    assert torch.all(tw.weights[2] == 1.0)  # row 2 has A = 0
    # a single positive token still gets selected (k = max(1, ceil(0.1·1)) = 1)
    one = WeightingInputs.build(torch.tensor([[-1.0, -2.0]]), torch.zeros(1, 2), torch.tensor([1.0]),
                                torch.tensor([[1, 0]]))  # fmt: skip
    torch.testing.assert_close(stare_weights(one).weights, torch.tensor([[1.1, 1.0]]), rtol=0, atol=0)


@pytest.mark.parametrize("scope", ["batch", "micro"])
def test_masked_tokens_never_change_stare(scope):
    inputs = random_inputs(seed=2)
    kw = dict(controller=StareController(law="adaptive", p=0.2), target_entropy=0.3, scope=scope,
              micro_batch_size=3)  # fmt: skip
    base = stare_weights(inputs, **kw)
    pert = stare_weights(perturb_masked(inputs, 5), **kw)
    assert torch.equal(base.weights, pert.weights) and base.stats == pert.stats
    assert base.state == pert.state


def test_batch_scope_identical_weights_and_gradients_for_any_split():
    inputs = random_inputs(seed=6)
    ctl = StareController(w=3.0, m=0.5, p=0.2)
    tw = stare_weights(inputs, controller=ctl, target_entropy=0.3)
    g = torch.Generator().manual_seed(7)
    delta = 0.2 * torch.randn(inputs.logp_old.shape, generator=g)
    norm = loss_normaliser(tw.mask, "token-mean")

    def grad_for(split: int) -> torch.Tensor:
        logp = (inputs.logp_old + delta).requires_grad_()
        total = 0.0
        for rows in torch.arange(8).split(split):
            part = tw.rows(rows)
            loss, _, _ = policy_loss(logp[rows], inputs.logp_old[rows], inputs.advantages[rows], part.mask,
                                  normaliser=norm, weights=part.weights)  # fmt: skip
            total = total + loss
        return torch.autograd.grad(total, logp)[0]

    full = grad_for(8)
    for split in (1, 2, 4):
        torch.testing.assert_close(grad_for(split), full, rtol=1e-6, atol=1e-8)
        sliced = torch.cat([tw.rows(r).weights for r in torch.arange(8).split(split)])
        assert torch.equal(sliced, tw.weights)
    # the weights do not depend on row order either (batch ranking, no micro-batch boundaries)
    perm = torch.randperm(8, generator=g)
    shuffled = WeightingInputs(
        *(x[perm] for x in (inputs.logp_old, inputs.entropy, inputs.advantages, inputs.mask))
    )
    assert torch.equal(stare_weights(shuffled, controller=ctl, target_entropy=0.3).weights, tw.weights[perm])


def test_micro_scope_ranks_within_each_micro_batch():
    inputs = random_inputs(seed=8)
    ctl = StareController(w=2.0, m=0.5, p=0.1)
    micro = stare_weights(
        inputs, variant="C2", controller=ctl, target_entropy=0.3, scope="micro", micro_batch_size=2
    )
    groups = stare_weights(inputs, variant="C2", controller=ctl, target_entropy=0.3, scope="micro",
                           row_groups=[[0, 1], [2, 3], [4, 5], [6, 7]])  # fmt: skip
    assert torch.equal(micro.weights, groups.weights)
    # each micro-batch, ranked on its own, gives the same weights as its rows given as a batch of 2
    for rows in ([0, 1], [4, 5]):
        sub = WeightingInputs(
            *(x[rows] for x in (inputs.logp_old, inputs.entropy, inputs.advantages, inputs.mask))
        )
        alone = stare_weights(sub, variant="C2", controller=ctl, target_entropy=0.3)
        # the gate is global (H̄ of the whole batch); with H̄ ≈ 0.1 both gates are on
        assert torch.equal(alone.weights, micro.weights[rows])
    batch = stare_weights(inputs, variant="C2", controller=ctl, target_entropy=0.3)
    assert not torch.equal(micro.weights, batch.weights)  # the scope matters on this batch
    with pytest.raises(ValueError, match="micro"):
        stare_weights(inputs, scope="micro")


def test_gate_and_adaptive_laws():
    ctl = StareController(law="adaptive", alpha=0.01, w_max=1.5, m_min=0.5)
    s = StareState(w=1.1, m=0.9, p=0.1)
    below = update_stare_state(s, 0.2, 0.3, ctl)  # sign(+) -> W + .01, M - .01
    assert (below.gate_on, below.w, below.m, below.steps) == (
        True,
        pytest.approx(1.11),
        pytest.approx(0.89),
        1,
    )
    above = update_stare_state(s, 0.4, 0.3, ctl)  # sign(-) -> W - .01, M + .01, gate off
    assert (above.gate_on, above.w, above.m) == (False, pytest.approx(1.09), pytest.approx(0.91))
    at_bounds = update_stare_state(StareState(w=1.5, m=0.5, p=0.1), 0.0, 0.3, ctl)
    assert (at_bounds.w, at_bounds.m) == (1.5, 0.5)
    at_floor = update_stare_state(StareState(w=1.0, m=1.0, p=0.1), 1.0, 0.3, ctl)
    assert (at_floor.w, at_floor.m) == (1.0, 1.0)
    gate = update_stare_state(s, 0.2, 0.3, StareController())
    assert gate.gate_on and (gate.w, gate.m) == (1.1, 0.9)
    assert update_stare_state(s, math.nan, 0.3, ctl) == s  # non-finite entropy: unchanged


def test_pi_law_hand_values_and_anti_windup():
    ctl = StareController(law="pi", kp=2.0, ki=0.2, w_max=1.5, m_min=0.5)
    s = StareState.initial(ctl)
    # H̄ = .9, H_tgt = 1: e = .1, I = .02, u = 2·.1 + .02 = .22 -> W = 1 + .22·.5 = 1.11, M = 1 - .22·.5 = .89
    s1 = update_stare_state(s, 0.9, 1.0, ctl)
    assert (s1.integral, s1.strength, s1.w, s1.m, s1.gate_on) == (
        pytest.approx(0.02), pytest.approx(0.22), pytest.approx(1.11), pytest.approx(0.89), True)  # fmt: skip
    # 100 steps far below target: the integrator is clamped at 1 (no windup) and u saturates at 1.
    for _ in range(100):
        s = update_stare_state(s, 0.5, 1.0, ctl)
    assert (s.integral, s.strength, s.w, s.m) == (1.0, 1.0, 1.5, 0.5)
    # one step above target (e = -.5): I = 1 - .1 = .9, u = -1 + .9 = -.1 -> clipped to 0: off at once.
    s = update_stare_state(s, 1.5, 1.0, ctl)
    assert (
        s.integral == pytest.approx(0.9) and s.strength == 0.0 and not s.gate_on and (s.w, s.m) == (1.0, 1.0)
    )
    # at the target, the integral holds the standing strength: u = I = .9
    s = update_stare_state(s, 1.0, 1.0, ctl)
    assert s.strength == pytest.approx(0.9) and s.w == pytest.approx(1.45)
    # symmetric option: u < 0 mirrors W and M (W = 1 - |u|(1 - M_min), M = 1 + |u|(W_max - 1))
    sym = StareController(law="pi", kp=2.0, ki=0.0, w_max=1.5, m_min=0.5, u_min=-1.0)
    s2 = update_stare_state(StareState.initial(sym), 1.2, 1.0, sym)  # e = -.2 -> u = -.4
    assert (s2.w, s2.m) == (pytest.approx(0.8), pytest.approx(1.2))
    with pytest.raises(ValueError):
        StareController(u_min=-2.0)


def test_state_round_trip_and_threading_through_steps():
    ctl = StareController(law="pi", p_max=0.3)
    tw1 = stare_weights(random_inputs(seed=9), controller=ctl, target_entropy=0.3)
    restored = StareState.from_dict(json.loads(json.dumps(tw1.state.to_dict())))
    assert restored == tw1.state
    tw2 = stare_weights(random_inputs(seed=10), controller=ctl, target_entropy=0.3, state=restored)
    assert tw2.state.steps == 2 and tw2.state.integral > tw1.state.integral > 0
    assert tw2.state.p > 0.1  # P grows with the strength when p_max is set


def test_default_variant_is_o1_as_released():
    # The released code and its README use O1 (L+ only) as the 7B default: a default call leaves the
    # high-surprisal negative tokens at weight 1.
    tw = stare_weights(hand_batch(0.1), target_entropy=0.3)
    assert tw.weights[1].tolist() == [1.0] * 5 and tw.weights[0, 4] == pytest.approx(1.1)


@pytest.mark.parametrize("law", ["gate", "adaptive", "pi"])
def test_empty_mask_skips_the_controller(law):
    # No policy token kept (every episode void or truncated): the mean entropy is undefined. The
    # released controller gets NaN and skips its update; a 0 would turn the gate (and PI) fully on.
    ctl = StareController(law=law, alpha=0.05, w_max=3.0, m_min=0.0)
    state = StareState.initial(ctl)
    inputs = random_inputs(seed=3)
    empty = WeightingInputs.build(inputs.logp_old, inputs.entropy, inputs.advantages,
                                  torch.zeros_like(inputs.mask))  # fmt: skip
    tw = stare_weights(empty, controller=ctl, target_entropy=0.3, state=state)
    assert tw.state == state and not tw.state.gate_on and tw.state.steps == 0
    assert math.isnan(tw.stats["entropy_mean"]) and tw.stats["gate_on"] == 0.0
    assert torch.equal(tw.weights, torch.ones_like(tw.weights))


def test_pi_w_min_and_m_max_set_the_weakest_reweighting():
    # W moves from W_min to W_max and M from M_max to M_min as u goes 0 -> 1; u = 0 is off (1, 1).
    ctl = StareController(law="pi", kp=2.0, ki=0.0, w_min=1.1, w_max=2.1, m_min=0.5, m_max=0.9)
    s = update_stare_state(StareState.initial(ctl), 0.9, 1.0, ctl)  # e = .1 -> u = .2
    assert s.strength == pytest.approx(0.2)
    assert (s.w, s.m) == (pytest.approx(1.1 + 0.2 * 1.0), pytest.approx(0.9 - 0.2 * 0.4))
    off = update_stare_state(StareState.initial(ctl), 1.2, 1.0, ctl)  # above target: u = 0
    assert (off.w, off.m, off.gate_on) == (1.0, 1.0, False)
    with pytest.raises(ValueError, match="w_min"):
        StareController(law="pi", w_min=0.9)
    with pytest.raises(ValueError, match="m_max"):
        StareController(law="pi", m_min=0.6, m_max=0.5)


def test_relative_target_is_measured_once_and_kept():
    # target_scale 0.8: H_tgt = 0.8 × the first batch's H̄ (0.5 -> 0.4), then fixed; the gate compares
    # later batches with it (0.3 < 0.4: on; 0.45: off), through a checkpoint round trip too.
    ctl = StareController(law="adaptive", alpha=0.1, w_max=3.0, m_min=0.0)
    first = stare_weights(hand_batch(0.5), controller=ctl, target_scale=0.8, target_entropy=9.0)
    assert first.state.target == pytest.approx(0.4) and first.stats["target_entropy"] == pytest.approx(0.4)
    assert not first.state.gate_on  # 0.5 is above 0.4
    state = StareState.from_dict(json.loads(json.dumps(first.state.to_dict())))
    low = stare_weights(hand_batch(0.3), controller=ctl, target_scale=0.8, state=state)
    assert low.state.target == pytest.approx(0.4) and low.state.gate_on
    high = stare_weights(hand_batch(0.45), controller=ctl, target_scale=0.8, state=low.state)
    assert not high.state.gate_on and high.state.target == pytest.approx(0.4)
