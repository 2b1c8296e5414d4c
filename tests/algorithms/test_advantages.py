"""Advantages and episode filters on hand-computed examples."""

import pytest
import torch

from agentrl.algorithms import (
    compute_advantages,
    dynamic_sampling_keep,
    overlong_penalty,
    void_turn_multipliers,
)

# Group a: rewards [1, 0, 1, 1]; b: a single episode; c: two equal rewards.
REWARDS = [1.0, 0.0, 1.0, 1.0, 0.5, 2.0, 2.0]
GROUPS = ["a", "a", "a", "a", "b", "c", "c"]


def test_grpo_hand_example():
    # a: mean 0.75, centred [.25, -.75, .25, .25]; unbiased var = (3·.0625 + .5625)/3 = .25, std .5
    # -> A = centred / (0.5 + 1e-6) = [0.5, -1.5, 0.5, 0.5]; b: group of one -> 0; c: std 0 -> 0.
    adv = compute_advantages("grpo", REWARDS, GROUPS)
    scale = 0.5 / (0.5 + 1e-6)
    expected = torch.tensor([0.5, -1.5, 0.5, 0.5, 0.0, 0.0, 0.0]) * scale
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-6)


def test_dr_grpo_hand_example():
    # R - group mean, no std: a -> [.25, -.75, .25, .25]; b -> 0; c -> 0.
    adv = compute_advantages("dr_grpo", REWARDS, GROUPS)
    torch.testing.assert_close(adv, torch.tensor([0.25, -0.75, 0.25, 0.25, 0, 0, 0]), rtol=0, atol=1e-6)


def test_rloo_hand_example():
    # a: A_0 = 1 - mean(0, 1, 1) = 1/3, A_1 = 0 - mean(1, 1, 1) = -1; b: no baseline -> 0; c: 2 - 2 = 0.
    adv = compute_advantages("rloo", REWARDS, GROUPS)
    expected = torch.tensor([1 / 3, -1.0, 1 / 3, 1 / 3, 0.0, 0.0, 0.0])
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-6)


def test_group_ids_interleaved_and_as_tensor():
    # The same groups, interleaved and given as a LongTensor, give the same per-episode advantages.
    order = [4, 0, 5, 1, 2, 6, 3]
    ids = {"a": 0, "b": 1, "c": 2}
    adv = compute_advantages(
        "grpo", [REWARDS[i] for i in order], torch.tensor([ids[GROUPS[i]] for i in order])
    )
    full = compute_advantages("grpo", REWARDS, GROUPS)
    torch.testing.assert_close(adv, full[order], rtol=0, atol=0)


def test_unknown_estimator():
    with pytest.raises(ValueError, match="unknown advantage"):
        compute_advantages("ppo", [1.0], [0])


def test_dynamic_sampling_keeps_informative_groups_only():
    # a has mixed rewards -> kept; b (single) and c (all 2.0) are uninformative -> dropped.
    assert dynamic_sampling_keep(REWARDS, GROUPS) == [0, 1, 2, 3]
    assert dynamic_sampling_keep([1.0, 1.0, 0.0, 1.0], [0, 0, 1, 1]) == [2, 3]


def test_overlong_penalty_hand_example():
    # L_max 100, L_cache 20: free up to 80; 90 -> -(90-80)/20 = -0.5; 100 -> -1.0; past 100 -> -1.
    assert overlong_penalty([50, 80, 90, 100, 101], max_len=100, cache_len=20) == [0.0, 0.0, -0.5, -1.0, -1.0]


def test_void_turns():
    assert void_turn_multipliers([False, True, False]) == [1.0, 0.0, 1.0]


def test_void_turn_episode_stays_in_group_statistics():
    # SimpleTIR: the void episode (reward 0) is part of the group baseline, and only its mask is zeroed.
    rewards, groups, void = [1.0, 0.0, 0.0], [0, 0, 0], [False, True, False]
    adv = compute_advantages("dr_grpo", rewards, groups)  # mean 1/3 includes the void episode
    torch.testing.assert_close(adv, torch.tensor([2 / 3, -1 / 3, -1 / 3]), rtol=0, atol=1e-6)
    assert void_turn_multipliers(void) == [1.0, 0.0, 1.0]
