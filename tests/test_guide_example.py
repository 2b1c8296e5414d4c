"""The example of docs/environments.md is a real file: it passes the checker and trains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.config import load_config
from agentrl.env import import_environment_module
from agentrl.env_check import check_environment
from agentrl.trainer import Trainer, TrainingFailed
from tests.jsonl import lines

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "docs" / "examples" / "lookup_env.py"


def test_guide_example_passes_the_checker():
    import_environment_module(str(EXAMPLE))
    report = check_environment("population_lookup")
    assert report.ok, report.problems


def test_guide_example_trains(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.chdir(ROOT)  # the config names the module by a repo-relative path
    cfg = load_config(
        ROOT / "configs" / "examples" / "lookup_cpu.yaml",
        [
            f"model.path={tiny_model_dir}",
            f"run.output_dir={tmp_path / 'run'}",
            "trainer.total_steps=2",
            "rollout.prompts_per_step=2",
            "rollout.group_size=4",
            "sft.steps=4",
            "sft.num_demos=16",
            "logging.tensorboard=false",
            "logging.plots=false",
            "algorithm.dynamic_sampling=false",
        ],
    )
    with pytest.raises(TrainingFailed, match="no step trained"):  # 4 SFT steps solve nothing yet
        Trainer(cfg, log=lambda *_: None).train()
    rows = [json.loads(x) for x in lines(tmp_path / "run" / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [0, 1] and all("reward/correct" in r for r in rows)
