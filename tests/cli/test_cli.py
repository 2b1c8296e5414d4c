"""Each entry point runs: rollout, sft, train (2 steps), eval, plot; bad configs fail with the key."""

from __future__ import annotations

import json

import pytest

from agentrl.cli import main
from agentrl.episode import Episode
from tests.helpers.jsonl import lines


def common(tmp_path, model_dir):
    return [
        f"model.path={model_dir}",
        f"run.output_dir={tmp_path / 'run'}",
        "run.device=cpu",
        "rollout.prompts_per_step=2",
        "rollout.group_size=2",
        "rollout.max_tokens_per_turn=8",
        "logging.tensorboard=false",
        "data.num_test=3",
        "eval.k=2",
    ]


def test_rollout_writes_episodes(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "eps.jsonl"
    assert (
        main(
            [
                "rollout",
                "configs/quickstart.yaml",
                *common(tmp_path, tiny_model_dir),
                "sft.enabled=false",
                "--tasks",
                "3",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    eps = [Episode.from_json(x) for x in lines(out)]
    assert len(eps) == 3 * 2 and all(e.env == "calculator" for e in eps)
    assert "episodes/count" in capsys.readouterr().out


@pytest.mark.slow
def test_sft_train_eval_plot(tmp_path, tiny_model_dir, capsys):
    args = [
        *common(tmp_path, tiny_model_dir),
        "sft.steps=3",
        "sft.num_demos=8",
        "trainer.total_steps=2",
        "algorithm.dynamic_sampling=false",
    ]
    assert main(["sft", "configs/quickstart.yaml", *args]) == 0
    assert "warm-started model:" in capsys.readouterr().out
    # a 3-step warm start solves no task, so every advantage is 0: the run writes everything, then
    # says it trained on nothing (exit 3) instead of reporting success
    assert main(["train", "configs/quickstart.yaml", *args]) == 3
    assert "no step trained" in capsys.readouterr().err
    run = tmp_path / "run"
    assert (run / "checkpoints" / "step_2").is_dir() and (run / "plots" / "entropy.png").exists()
    out = tmp_path / "eval.json"
    assert (
        main(
            [
                "eval",
                "configs/quickstart.yaml",
                *args,
                "--checkpoint",
                str(run / "checkpoints" / "step_2"),
                "-o",
                str(out),
            ]
        )
        == 0
    )
    res = json.loads(out.read_text())
    assert (
        res["eval/tasks"] == 3 and res["eval/k"] == 2 and 0 <= res["eval/mean@k"] <= res["eval/pass@k"] <= 1
    )
    assert len(res["per_task"]) == 3 and all(n == 2 and 0 <= c <= 2 for c, n in res["per_task"].values())
    # the same tasks again, compared with the first evaluation: a paired bootstrap over the 3 tasks
    again = tmp_path / "again.json"
    checkpoint = ["--checkpoint", str(run / "checkpoints" / "step_2")]
    assert (
        main(["eval", "configs/quickstart.yaml", *args, *checkpoint, "-o", str(again), "--against", str(out)])
        == 0
    )
    compared = json.loads(again.read_text())["compared_with"]
    assert compared["file"] == str(out) and compared["mean@k"]["tasks"] == 3
    assert "paired bootstrap over 3 tasks" in capsys.readouterr().out
    (tmp_path / "old.json").write_text('{"eval/mean@k": 0.5}')  # written before per_task existed
    assert main(["eval", "configs/quickstart.yaml", *args, "--against", str(tmp_path / "old.json")]) == 2
    assert "evaluations written before per_task existed need to be run again" in capsys.readouterr().err
    (run / "plots" / "entropy.png").unlink()
    assert main(["plot", str(run)]) == 0 and (run / "plots" / "entropy.png").exists()


def test_bad_config_fails_before_work(tmp_path, capsys):
    assert (
        main(["train", "configs/quickstart.yaml", "trainer.totl_steps=3", f"run.output_dir={tmp_path / 'x'}"])
        == 2
    )
    err = capsys.readouterr().err
    assert "trainer.totl_steps" in err and "did you mean 'trainer.total_steps'" in err
    assert not (tmp_path / "x").exists()
    assert main(["train", "configs/quickstart.yaml", "algorithm.name=grp"]) == 2
    assert "did you mean 'grpo'" in capsys.readouterr().err


def test_resume_with_overrides_keeps_the_runs_own_config(tmp_path):
    """``agentrl train --resume RUN trainer.total_steps=N`` resumes with the run's resolved config
    plus the override (the override used to be taken for the config, and the run's config dropped)."""
    from agentrl.cli import build_parser, train_config
    from agentrl.config import load_config, save_config

    run = tmp_path / "run"
    save_config(
        load_config("configs/quickstart.yaml", ["rollout.group_size=3", f"run.output_dir={run}"]), run
    )
    for argv in (["--resume", str(run), "trainer.total_steps=7"], ["--resume", str(run)]):
        cfg = train_config(build_parser().parse_args(["train", *argv]))
        assert cfg.rollout.group_size == 3 and cfg.run.resume and cfg.run.output_dir == str(run)
    assert cfg.trainer.total_steps != 7
    cfg = train_config(build_parser().parse_args(["train", "--resume", str(run), "trainer.total_steps=7"]))
    assert cfg.trainer.total_steps == 7
