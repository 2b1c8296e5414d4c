"""The ``groups/*`` metrics (docs/training.md, "Group metrics"): counts end in ``_count``, fractions
end in ``_frac`` and are shares of ``groups/count``, the step's groups."""

from __future__ import annotations

from agentrl.assembly import make_trainer
from agentrl.episode import Episode
from agentrl.errors import Failure
from agentrl.training.metrics import episode_metrics
from tests.helpers.configs import small_config

OLD_NAMES = ("groups/informative", "groups/all_correct", "groups/all_wrong", "groups/seen")


def test_no_group_is_informative_when_no_rewards_differ(tmp_path, tiny_model_dir):
    # The trial's report: GRPO has no dynamic sampling, so it trains on every group of 2+ episodes;
    # groups/informative counted those (2 = prompts_per_step) though every reward is 1.0, and the run
    # then stopped with "no group had rewards that differ". 2 groups of 4, all correct: 0 of 2 informative.
    cfg = small_config(tmp_path, tiny_model_dir, "env.name=test_all_correct", "algorithm.name=grpo")
    trainer = make_trainer(cfg, log=lambda *_: None)
    episodes, kept, info = trainer.collect(0)
    metrics = {**episode_metrics(episodes), **info}
    assert {e.reward for e in episodes} == {1.0} and len(kept) == 8
    assert metrics["groups/count"] == 2.0
    assert metrics["groups/informative_frac"] == 0.0
    assert metrics["groups/trained_count"] == 2.0  # GRPO trains on them anyway, with zero advantages
    assert metrics["groups/all_correct_frac"] == 1.0 and metrics["groups/all_wrong_frac"] == 0.0
    assert metrics["groups/sampling_rounds"] == 1.0 and metrics["groups/dropped_count"] == 0.0
    assert not set(OLD_NAMES) & set(metrics)


def test_group_fractions_share_the_steps_groups(tmp_path, tiny_model_dir, monkeypatch):
    # Four groups of two; "-" is a failed episode. a: 1, 0 (mixed: informative); b: 1, 1 (all correct);
    # c: 0, - (one usable episode: all wrong, not informative); d: -, - (nothing usable: none of them).
    # Each fraction is of the 4 groups: informative 1/4, all correct 1/4, all wrong 1/4. Dynamic
    # sampling keeps a alone: 1 group trained.
    rewards = {"a": [1.0, 0.0], "b": [1.0, 1.0], "c": [0.0, None], "d": [None, None]}
    episodes = [
        Episode(f"{g}{i}", "test", g, reward=r or 0.0, group=g, failure=None if r is not None else Failure("env", "x"))
        for g, rs in rewards.items()
        for i, r in enumerate(rs)
    ]  # fmt: skip
    cfg = small_config(tmp_path, tiny_model_dir, "algorithm.name=grpo", "algorithm.dynamic_sampling=true",
                       "algorithm.max_sampling_rounds=1")  # fmt: skip
    trainer = make_trainer(cfg, log=lambda *_: None)
    monkeypatch.setattr(trainer.rollouts, "_round", lambda step, r, info: (episodes, 0.0))
    _, kept, info = trainer.collect(0)
    metrics = {**episode_metrics(episodes), **info}
    assert [e.id for e in kept] == ["a0", "a1"]
    assert metrics["groups/count"] == 4.0 and metrics["groups/trained_count"] == 1.0
    assert metrics["groups/informative_frac"] == 0.25
    assert metrics["groups/all_correct_frac"] == 0.25 and metrics["groups/all_wrong_frac"] == 0.25
    assert metrics["groups/dropped_count"] == 2.0  # c and d: fewer than two scored episodes
