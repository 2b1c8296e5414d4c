"""A two-step training run for each task family's CPU config (Short CoT, Long CoT, tool use)."""

from __future__ import annotations

import json

import pytest

from agentrl.assembly import make_trainer
from agentrl.config import load_config
from agentrl.episode import Episode
from agentrl.training.trainer import TrainingFailed
from tests.helpers import ROOT
from tests.helpers.jsonl import lines


@pytest.mark.parametrize("family", ["short_cot_cpu", "long_cot_cpu", "tool_use_cpu"])
@pytest.mark.slow
def test_family_config_trains_two_steps(tmp_path, tiny_model_dir, family):
    cfg = load_config(
        ROOT / "configs" / f"{family}.yaml",
        [
            f"model.path={tiny_model_dir}",
            f"run.output_dir={tmp_path / 'run'}",
            "trainer.total_steps=2",
            "rollout.prompts_per_step=2",
            "rollout.group_size=2",
            "rollout.max_tokens_per_turn=48",
            "sft.steps=2",
            "sft.num_demos=8",
            "logging.tensorboard=false",
            "logging.plots=false",
            "algorithm.dynamic_sampling=false",
            "algorithm.overlong.max_length=48",
            "algorithm.overlong.cache_length=8",
        ],
    )
    # an untrained tiny model solves nothing, so every advantage is 0 and the run must not report
    # success; everything up to that verdict ran (rollouts, the update, transcripts, metrics)
    with pytest.raises(TrainingFailed, match="no step trained"):
        make_trainer(cfg, log=lambda *_: None).train()
    episodes = [Episode.from_json(x) for x in lines(tmp_path / "run" / "transcripts.jsonl")]
    assert len(episodes) == 2 * 2 * 2
    assert all(e.failure is None for e in episodes), [e.failure for e in episodes if e.failure]
    rows = [json.loads(x) for x in lines(tmp_path / "run" / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [0, 1] and all("reward/correct" in r for r in rows)
    assert all("loss/pg_loss" in r and "update/skipped" not in r for r in rows)  # the update ran
