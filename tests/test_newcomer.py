"""The first-week mistakes of a new user (issue 17): a second run into the same directory, evaluating
a run, runs where episodes fail or nothing trains, environment typos, the warm-start cache, the step
numbering and the summary after a resume."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agentrl.assembly import build, make_trainer
from agentrl.cli import main
from agentrl.config import ConfigError, load_config
from agentrl.env import register
from agentrl.training.trainer import TrainingFailed
from tests.helpers.configs import small_config
from tests.helpers.envs import Chatter
from tests.helpers.jsonl import lines


def _steps(run: Path) -> list[int]:
    return [json.loads(x)["step"] for x in lines(run / "metrics.jsonl")]


def test_a_second_run_into_a_run_directory_is_refused_and_loses_nothing(tmp_path, tiny_model_dir, capsys):
    run = tmp_path / "run"
    make_trainer(small_config(tmp_path, tiny_model_dir, "trainer.total_steps=2"), log=lambda *_: None).train()
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    with pytest.raises(ConfigError, match="already holds a run") as e:
        make_trainer(small_config(tmp_path, tiny_model_dir, "trainer.total_steps=2"), log=lambda *_: None)
    assert f"agentrl train --resume {run}" in str(e.value) and "run.output_dir" in str(e.value)
    assert "--overwrite" in str(e.value)
    after = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert after == before  # not a byte changed (config.yaml included)
    args = [f"model.path={tiny_model_dir}", "env.name=test_chatter", f"run.output_dir={run}", "run.device=cpu",
            "rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.max_tokens_per_turn=8",
            "trainer.total_steps=1", "logging.tensorboard=false", "logging.plots=false"]  # fmt: skip
    assert main(["train", *args]) == 2 and "already holds a run" in capsys.readouterr().err
    assert main(["train", *args, "--overwrite"]) == 0
    old = tmp_path / "run.old-1"
    assert {p.relative_to(old): p.read_bytes() for p in old.rglob("*") if p.is_file()} == before
    assert _steps(run) == [0] and _steps(old) == [0, 1]


def test_eval_of_a_run_directory_evaluates_its_newest_checkpoint(tmp_path, tiny_model_dir, capsys):
    run = tmp_path / "run"
    cfg = small_config(tmp_path, tiny_model_dir, "trainer.total_steps=2", "trainer.checkpoint_every=1")
    make_trainer(cfg, log=lambda *_: None).train()
    assert main(["eval", str(run), "eval.k=2", "eval.num_tasks=2"]) == 0
    err = capsys.readouterr().err
    assert f"evaluating {run / 'checkpoints' / 'step_2'}" in err
    result = json.loads((run / "eval" / "step_2.json").read_text())  # next to the run, not in the cache
    assert result["checkpoint"] == str(run / "checkpoints" / "step_2") and result["eval/k"] == 2
    ckpt = run / "checkpoints" / "step_1"
    assert main(["eval", str(run), "eval.k=1", "eval.num_tasks=1", "--checkpoint", str(ckpt)]) == 0
    assert (run / "eval" / "step_1.json").exists()


@register
class BrokenStep(Chatter):
    """Every step raises: every episode fails at the env boundary."""

    name = "test_broken_step"

    def step(self, action):
        raise ValueError("the unit table has no entry 'furlong'")


def test_the_circuit_breaker_stops_a_run_whose_episodes_fail(tmp_path, tiny_model_dir, capsys):
    cfg = small_config(tmp_path, tiny_model_dir, "env.name=test_broken_step", "trainer.total_steps=10",
                       "trainer.max_failed_steps=2")  # fmt: skip
    with pytest.raises(TrainingFailed) as e:
        make_trainer(cfg, log=lambda *_: None).train()
    msg = str(e.value)
    assert "100% of step 1's episodes failed" in msg and "2 steps in a row" in msg
    assert "'env' boundary" in msg and "ValueError: the unit table has no entry 'furlong'" in msg
    example = msg.split("Example episode: ")[1].split(" ")[0]
    assert example in [json.loads(x)["id"] for x in lines(tmp_path / "run" / "transcripts.jsonl")]
    err = capsys.readouterr().err
    assert "FAILED 100% (env: ValueError: the unit table has no entry 'furlong')" in err  # the progress line
    assert _steps(tmp_path / "run") == [0, 1]


def test_a_run_that_trained_on_nothing_is_not_a_success(tmp_path, tiny_model_dir, capsys):
    run = tmp_path / "run"
    args = [f"model.path={tiny_model_dir}", "env.name=test_all_correct", f"run.output_dir={run}",
            "run.device=cpu", "algorithm.name=dapo", "rollout.prompts_per_step=2", "rollout.group_size=4",
            "rollout.max_tokens_per_turn=4", "trainer.total_steps=2", "algorithm.max_sampling_rounds=1",
            "logging.tensorboard=false", "logging.plots=false"]  # fmt: skip
    assert main(["train", *args]) == 3
    err = capsys.readouterr().err
    assert "no step trained" in err and "no group had rewards that differ" in err
    # the breaker also catches failures with the breaker off: nothing trained is still an error
    cfg = small_config(
        tmp_path / "b", tiny_model_dir, "env.name=test_broken_step", "trainer.max_failed_fraction=null"
    )
    with pytest.raises(TrainingFailed, match="episodes failed"):
        make_trainer(cfg, log=lambda *_: None).train()


def test_environment_mistakes_are_config_errors_before_any_work(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "configs/quickstart.yaml", "env.name=calculatr", f"run.output_dir={run}"]) == 2
    err = capsys.readouterr().err
    assert "did you mean 'calculator'" in err and "set env.module" in err
    assert main(["train", "configs/quickstart.yaml", "env.name=units", "env.module=units_env.py",
                 f"run.output_dir={run}"]) == 2  # fmt: skip
    assert "env.module='units_env.py': no such file" in capsys.readouterr().err
    assert (
        main(["train", "configs/quickstart.yaml", "env.module=no_such_pkg.units", f"run.output_dir={run}"])
        == 2
    )
    assert "ModuleNotFoundError" in capsys.readouterr().err
    assert not run.exists()  # nothing was started: not even a config.yaml


def test_sft_cache_false_writes_nothing_to_the_cache(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path / "cache"))
    cfg = load_config(None, [f"model.path={tiny_model_dir}", "env.name=calculator", "sft.enabled=true",
                             "sft.cache=false", "sft.steps=2", "sft.num_demos=8", "sft.batch_size=4",
                             f"run.output_dir={tmp_path / 'run'}"])  # fmt: skip
    path = build.policy_path(cfg, log=lambda *_: None)
    assert Path(path) == tmp_path / "run" / "warm_start" and (Path(path) / "config.json").exists()
    assert not (tmp_path / "cache" / "warmstart").exists()
    # the run's own warm start is reused while the settings match, and remade when they change
    assert build.policy_path(cfg, log=lambda *_: None) == path
    mtime = os.path.getmtime(Path(path) / "config.json")
    changed = load_config(None, [f"model.path={tiny_model_dir}", "env.name=calculator", "sft.enabled=true",
                                 "sft.cache=false", "sft.steps=3", "sft.num_demos=8", "sft.batch_size=4",
                                 f"run.output_dir={tmp_path / 'run'}"])  # fmt: skip
    build.policy_path(changed, log=lambda *_: None)
    assert os.path.getmtime(Path(path) / "config.json") != mtime


def test_one_step_numbering_and_a_summary_that_covers_the_whole_run(tmp_path, tiny_model_dir, capsys):
    cfg = small_config(tmp_path, tiny_model_dir, "trainer.total_steps=2", "trainer.checkpoint_every=1")
    make_trainer(cfg, log=lambda *_: None).train()
    err = capsys.readouterr().err
    assert "step 0 (1/2)" in err and "step 1 (2/2)" in err and "step 2" not in err.split("summary")[0]
    resumed = small_config(tmp_path, tiny_model_dir, "trainer.total_steps=3", "run.resume=true")
    make_trainer(resumed, log=lambda *_: None).train()
    err = capsys.readouterr().err
    assert "step 2 (3/3)" in err and "resumed at step 2" in err
    header = next(x for x in err.splitlines() if "metric" in x)
    assert "step 0" in header and "step 2" in header  # the run's first step, not the first resumed one
