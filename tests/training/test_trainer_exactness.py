"""The trainer's exactness fixes from the algorithm audit (issue 16 §1): dynamic sampling keys on
the outcome, Clip-Cov draws afresh every step, STARE's ``scope: micro`` ranks within the micro-batches
the update really runs."""

from __future__ import annotations

import pytest

from agentrl.assembly import make_trainer
from agentrl.config import ConfigError
from agentrl.engines.scripted import ScriptedEngine
from agentrl.training import learner as learner_mod
from tests.helpers.configs import small_config


def test_dynamic_sampling_ignores_length_shaping(tmp_path, tiny_model_dir):
    # DAPO's overlong penalty with L_max 4, L_cache 3 gives replies of 2..5 policy tokens the penalties
    # 0, -1/3, -2/3, -1: the shaped rewards differ within every group, the outcome (1.0) does not.
    cfg = small_config(
        tmp_path, tiny_model_dir, "env.name=test_all_correct", "algorithm.name=dapo",
        "algorithm.overlong.max_length=4", "algorithm.overlong.cache_length=3",
        "algorithm.max_sampling_rounds=1",
    )  # fmt: skip
    trainer = make_trainer(cfg, log=lambda *_: None)
    eos = trainer.tokenizer.eos_token_id
    trainer.engine = ScriptedEngine(lambda prompt, i: [300] * (1 + i % 4) + [eos], trainer.tokenizer)
    episodes, kept, info = trainer.collect(0)
    shaped = {}
    for e in episodes:
        shaped.setdefault(e.group, set()).add(round(e.reward, 6))
    assert all(len(v) > 1 for v in shaped.values()), "the length penalty must vary within each group"
    assert kept == [] and info["groups/informative_frac"] == 0 and info["groups/trained_count"] == 0


def test_clip_cov_draws_afresh_every_step(tmp_path, tiny_model_dir, monkeypatch):
    seeds: list[int] = []
    real = learner_mod.alg.compute_weights

    def spy(name, inputs, **params):
        seeds.append(params["generator"].initial_seed())
        return real(name, inputs, **params)

    monkeypatch.setattr(learner_mod.alg, "compute_weights", spy)
    cfg = small_config(tmp_path, tiny_model_dir, "algorithm.name=clip_cov")
    make_trainer(cfg, log=lambda *_: None).train()
    assert len(seeds) == 2 and seeds[0] != seeds[1]
    # the draw depends on the step only, so a resumed run draws what the uninterrupted one drew
    again = make_trainer(small_config(tmp_path / "again", tiny_model_dir, "algorithm.name=clip_cov"),
                    log=lambda *_: None)  # fmt: skip
    again.train_step(1)
    assert seeds[2] == seeds[1]


def test_stare_micro_scope_ranks_the_trained_micro_batches(tmp_path, tiny_model_dir, monkeypatch):
    groups: list[list[list[int]]] = []
    real = learner_mod.alg.compute_weights

    def spy(name, inputs, **params):
        groups.append(params["row_groups"])
        return real(name, inputs, **params)

    monkeypatch.setattr(learner_mod.alg, "compute_weights", spy)
    cfg = small_config(
        tmp_path, tiny_model_dir, "algorithm.name=stare", "algorithm.stare.scope=micro",
        "trainer.mini_batches_per_step=2", "trainer.micro_batch_size=2", "trainer.total_steps=1",
        "algorithm.dynamic_sampling=false",
    )  # fmt: skip
    trainer = make_trainer(cfg, log=lambda *_: None)
    trained: list[list[int]] = []
    real_rows = learner_mod.Batch.rows

    def rows(self, idx):
        trained.append(idx.tolist())
        return real_rows(self, idx)

    monkeypatch.setattr(learner_mod.Batch, "rows", rows)
    trainer.train_step(0)
    (ranked,) = groups
    assert ranked == trained  # the shuffled micro-batches, in the order the update ran them
    assert sorted(i for g in ranked for i in g) == list(range(8))
    assert ranked != [[0, 1], [2, 3], [4, 5], [6, 7]]  # not arange(B).split(mb): the rows were shuffled


def test_stare_micro_scope_refused_when_epochs_reshuffle(tmp_path, tiny_model_dir):
    with pytest.raises(ConfigError, match=r"algorithm\.stare\.scope"):
        small_config(
            tmp_path, tiny_model_dir, "algorithm.name=stare", "algorithm.stare.scope=micro",
            "trainer.mini_batches_per_step=2", "trainer.epochs_per_step=2",
        )  # fmt: skip
