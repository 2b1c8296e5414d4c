"""A resume never breaks or rewrites a run (issue 28): what it cannot honour is refused before
anything is written, what it changes is recorded (``RUN/history.jsonl``, ``config.prev.yaml``) and
shown by the training summary, ``agentrl replay`` and ``agentrl inspect``; a damaged checkpoint is
named, with the one to fall back to."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from agentrl.cli import main
from tests.helpers import envs as _envs  # noqa: F401  (registers test_chatter, the fixture run's environment)
from tests.helpers.user_files import one_turn_env


@pytest.fixture(scope="module")
def env_file(tmp_path_factory):
    """The user's environment file (one file for the module: a name registers once per process)."""
    path = tmp_path_factory.mktemp("user") / "my_env.py"
    path.write_text(one_turn_env("resume_env"))
    return path


@pytest.fixture
def run(tmp_path, tiny_model_dir, env_file, capsys):
    """A finished two-step run with a checkpoint after each step; returns (run_dir, base args)."""
    run_dir = tmp_path / "run"
    args = [f"model.path={tiny_model_dir}", f"env.module={env_file}", "env.name=resume_env", "run.device=cpu",
            f"run.output_dir={run_dir}", "rollout.prompts_per_step=2", "rollout.group_size=2",
            "rollout.max_tokens_per_turn=8", "rollout.max_episode_tokens=64", "trainer.total_steps=2",
            "trainer.checkpoint_every=1", "trainer.micro_batch_size=4", "logging.tensorboard=false",
            "logging.plots=false", "data.num_test=4"]  # fmt: skip
    assert main(["train", *args]) == 0
    capsys.readouterr()
    return run_dir, args


def files(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}


def test_a_refused_change_writes_nothing_and_the_run_still_resumes(run, capsys):
    """Before: the merged config was written first, and every later plain resume failed on it."""
    run_dir, _ = run
    before = files(run_dir)
    assert main(["train", "--resume", str(run_dir), "env.name=calculator", "trainer.total_steps=3"]) == 2
    err = capsys.readouterr().err
    assert "env.name: resume_env -> calculator cannot change mid-run" in err and "--force" in err
    assert files(run_dir) == before  # not one byte: config.yaml, history, metrics, checkpoints
    assert main(["train", "--resume", str(run_dir), "trainer.total_steps=3"]) == 0


def test_a_forced_resume_that_cannot_work_writes_nothing_either(run, capsys):
    """The issue's case: another environment whose tasks do not take the run's data options."""
    run_dir, _ = run
    before = files(run_dir)
    code = main(
        ["train", "--resume", str(run_dir), "--force", "env.name=short_cot", "data.options={steps: 9, x: 1}"]
    )
    assert code == 2 and "does not take them" in capsys.readouterr().err
    assert files(run_dir) == before


def test_a_resume_records_what_it_changed(run, capsys):
    run_dir, _ = run
    old_config = (run_dir / "config.yaml").read_text()
    assert main(["train", "--resume", str(run_dir), "trainer.total_steps=3", "trainer.lr=2e-6"]) == 0
    out = capsys.readouterr()
    history = [json.loads(x) for x in (run_dir / "history.jsonl").read_text().splitlines()]
    assert [(h["event"], h["step"]) for h in history] == [("start", 0), ("resume", 2)]
    assert history[1]["checkpoint"] == "step_2" and history[1]["forced"] == []
    assert history[1]["changed"] == {"trainer.lr": [1e-6, 2e-6], "trainer.total_steps": [2, 3]}
    assert (run_dir / "config.prev.yaml").read_text() == old_config
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["trainer"]["lr"] == 2e-6
    summary = out.out + out.err
    assert "run history" in summary and "trainer.lr 1e-06 -> 2e-06; trainer.total_steps 2 -> 3" in summary
    assert main(["replay", str(run_dir), "--limit", "1"]) == 0
    assert "resumed from step_2 at step 2" in capsys.readouterr().out
    assert main(["inspect", str(run_dir)]) == 0
    assert "trainer.lr 1e-06 -&gt; 2e-06" in (run_dir / "inspect.html").read_text().replace("->", "-&gt;")


def test_force_lets_a_refused_change_through_and_says_so(run, capsys):
    run_dir, _ = run
    assert main(["train", "--resume", str(run_dir), "--force", "run.seed=7", "trainer.total_steps=3"]) == 0
    last = json.loads((run_dir / "history.jsonl").read_text().splitlines()[-1])
    assert last["forced"] == ["run.seed"] and last["changed"]["run.seed"] == [0, 7]


def test_a_resume_the_checkpoint_refuses_leaves_the_config_alone(run, capsys):
    """LoRA settings are refused by the resume check; a strategy the checkpoint was not written
    with by the checkpoint check, after the resume check passed: neither may rewrite config.yaml."""
    run_dir, _ = run
    before = files(run_dir)
    assert main(["train", "--resume", str(run_dir), "trainer.strategy=fsdp2"]) == 2
    assert "written with trainer.strategy=ddp" in capsys.readouterr().err
    assert files(run_dir) == before


def test_a_damaged_checkpoint_is_named_with_the_one_to_fall_back_to(run, capsys):
    run_dir, _ = run
    weights = run_dir / "checkpoints" / "step_2" / "model.safetensors"
    whole = weights.read_bytes()
    for cut in (len(whole) // 2, 6):  # a save cut short, in the tensors or in the header's length
        weights.write_bytes(whole[:cut])  # issue 66, item 8: before, a raw safetensors traceback
        assert main(["train", "--resume", str(run_dir), "trainer.total_steps=3"]) == 2
        err = capsys.readouterr().err
        assert (
            "step_2 is damaged: model.safetensors " in err
            and "move it out of checkpoints/ to resume from step_1" in err
        )
        assert "Traceback" not in err
    assert "is cut short: its tensors need" in err or "has no readable header" in err
    weights.unlink()
    assert main(["train", "--resume", str(run_dir), "trainer.total_steps=3"]) == 2
    err = capsys.readouterr().err
    assert "checkpoint" in err and "step_2 is damaged: its weights are missing" in err
    assert "move it out of checkpoints/ to resume from step_1" in err
    (run_dir / "checkpoints" / "step_1" / "trainer_state.pt").write_text("garbage")
    shutil.rmtree(run_dir / "checkpoints" / "step_2")
    assert main(["train", "--resume", str(run_dir), "trainer.total_steps=3"]) == 2
    assert "step_1 is damaged: trainer_state.pt cannot be read" in capsys.readouterr().err


def test_resuming_a_finished_run_says_there_is_nothing_to_train(run, capsys):
    run_dir, _ = run
    assert main(["train", "--resume", str(run_dir)]) == 0
    out = capsys.readouterr()
    assert "nothing to train" in out.out + out.err and "larger trainer.total_steps" in out.out + out.err


def test_a_start_that_failed_before_any_step_does_not_block_the_next(tmp_path, tiny_model_dir, capsys):
    """Empty metrics and transcript files hold no run: a fixed rerun is not refused."""
    run_dir = tmp_path / "run2"
    run_dir.mkdir()
    (run_dir / "transcripts.jsonl").write_text("")
    (run_dir / "metrics.jsonl").write_text("")
    from agentrl.training.checkpoint import existing_run

    assert existing_run(run_dir) == []
    (run_dir / "metrics.jsonl").write_text('{"step": 0}\n')
    assert existing_run(run_dir) == ["metrics.jsonl"]


def test_a_run_from_before_held_out_splits_keeps_training_on_every_row(tmp_path, tiny_model_dir, capsys):
    """Its config.yaml has no data.test_fraction: it trained on every row of its one file. A plain
    resume would now hold 10% out, changing the task list under the sampler: refused, and
    data.test_fraction=0 continues as before."""
    rows = tmp_path / "qa.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"Say {i}.", "answer": str(i)}) + "\n" for i in range(20)))
    run_dir = tmp_path / "old"
    args = [f"model.path={tiny_model_dir}", "env.name=short_cot", "data.source=file", f"data.path={rows}",
            "data.test_fraction=0", "run.device=cpu", f"run.output_dir={run_dir}", "rollout.prompts_per_step=2",
            "rollout.group_size=2", "rollout.max_tokens_per_turn=8", "rollout.max_episode_tokens=128",
            "trainer.total_steps=1", "trainer.micro_batch_size=4", "logging.tensorboard=false",
            "logging.plots=false"]  # fmt: skip
    assert main(["train", *args]) in (0, 3)  # 3: a random model's rewards never differ
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    for key in ("test_fraction", "split_seed", "test_path"):
        del saved["data"][key]
    (run_dir / "config.yaml").write_text(yaml.safe_dump(saved))
    capsys.readouterr()
    assert main(["train", "--resume", str(run_dir), "trainer.total_steps=2"]) == 2
    assert "data.test_fraction: 0.0 -> 0.1 cannot change mid-run" in capsys.readouterr().err
    assert main(["train", "--resume", str(run_dir), "trainer.total_steps=2", "data.test_fraction=0"]) in (
        0,
        3,
    )
    assert json.loads((run_dir / "history.jsonl").read_text().splitlines()[-1])["step"] == 1


def test_a_resume_from_full_weights_does_not_warm_start_again(tmp_path, tiny_model_dir, env_file, capsys):
    """The warm start is in the checkpoint's weights: on another machine, or with its cache gone, a
    resume used to run the whole SFT again before loading the checkpoint over it."""
    run_dir = tmp_path / "run"
    args = [f"model.path={tiny_model_dir}", "env.name=calculator", f"run.output_dir={run_dir}", "run.device=cpu",
            "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_tokens_per_turn=8",
            "trainer.total_steps=1", "sft.enabled=true", "sft.cache=false", "sft.steps=2", "sft.num_demos=8",
            "sft.batch_size=4", "logging.plots=false", "logging.tensorboard=false", "data.num_test=4"]  # fmt: skip
    assert main(["train", *args]) in (0, 3)
    shutil.rmtree(run_dir / "warm_start")
    capsys.readouterr()
    assert main(["train", "--resume", str(run_dir), "trainer.total_steps=2"]) in (0, 3)
    out = capsys.readouterr()
    assert "SFT warm start" not in out.out + out.err and not (run_dir / "warm_start").exists()


def pickled_classes(path: Path) -> set[str]:
    """Every ``module.name`` a torch checkpoint's pickle refers to (GLOBAL and STACK_GLOBAL)."""
    import io
    import pickletools
    import zipfile

    with zipfile.ZipFile(path) as z:
        data = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    out, strings = set(), []
    for op, arg, _ in pickletools.genops(io.BytesIO(data)):
        if op.name == "GLOBAL":
            out.add(str(arg).replace(" ", "."))
        elif op.name == "STACK_GLOBAL":
            out.add(".".join(strings[-2:]))
        elif isinstance(arg, str):
            strings.append(arg)
    return out


def test_a_checkpoint_names_no_agentrl_class_so_moving_modules_cannot_break_a_resume(run):
    """trainer_state.pt is pickled: a class of ours in it would be looked up by its module path on
    resume, and a checkpoint written before a module moved (issue 30's layout) would no longer load.
    It holds only torch, numpy and builtin types; the weights are safetensors."""
    run_dir, _ = run
    names = pickled_classes(run_dir / "checkpoints" / "step_2" / "trainer_state.pt")
    assert names and not [n for n in names if n.startswith(("agentrl", "environments", "sandboxes"))], names
    assert {n.split(".")[0] for n in names} <= {"torch", "numpy", "collections", "_codecs", "builtins"}, names


def test_tensorboard_shows_each_step_once_after_a_resume(tmp_path):
    """A killed invocation logged steps 0-3 to TensorBoard; the resume from step 2's checkpoint logs
    2-3 again. TensorBoard hides the first invocation's events from step 2 on (``purge_step``), so the
    curves have each step once, with the resumed values."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from agentrl.training.metrics import MetricsLogger

    first = MetricsLogger(tmp_path, tensorboard=True)
    for step in range(4):
        first.log(step, {"reward/mean": float(step)})
    first.close()
    resumed = MetricsLogger(tmp_path, tensorboard=True, start_step=2)
    for step in (2, 3):
        resumed.log(step, {"reward/mean": step + 100.0})
    resumed.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    points = [(e.step, e.value) for e in events.Scalars("reward/mean")]
    assert points == [(0, 0.0), (1, 1.0), (2, 102.0), (3, 103.0)], points


def test_a_run_being_trained_by_another_process_is_refused_untouched(run, capsys):
    """Two trainers on one run would interleave their steps in its history (a second resume started
    beside the first, a run a killed study left behind). The second is refused, naming the holder,
    with not one byte written; the lock goes with its process, even on SIGKILL."""
    import signal
    import subprocess
    import sys

    from agentrl.training.run_lock import RunLock

    run_dir, _ = run
    before = files(run_dir)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from agentrl.training.run_lock import RunLock; "
         f"lock = RunLock({str(run_dir)!r}); print('held', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert main(["train", "--resume", str(run_dir), "trainer.total_steps=3"]) == 2
        err = capsys.readouterr().err
        assert f"{run_dir} is being trained by another process (pid {holder.pid}" in err, err
        assert "run.output_dir" in err
        assert files(run_dir) == before
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    first, second = RunLock(run_dir), RunLock(run_dir)  # within one process it is shared
    first.release()
    second.release()
    # free again: the kernel dropped the killed holder's lock
    assert main(["train", "--resume", str(run_dir), "trainer.total_steps=3"]) == 0


PRE_ASSEMBLY = Path(__file__).parents[1] / "data" / "checkpoints" / "pre_assembly"


def test_a_checkpoint_written_before_the_assembly_floor_resumes(tmp_path, tiny_model_dir, capsys):
    """A LoRA + STARE run checkpointed at step 1 by the code before ``agentrl/assembly/`` existed
    (``tests/data/checkpoints/make_pre_assembly.py`` at c6743ac) resumes here and trains step 2: its
    adapters, optimizer state and STARE controller load, and the metrics keep the old step's row."""
    run_dir = tmp_path / "run"
    shutil.copytree(PRE_ASSEMBLY, run_dir)
    (run_dir / "transcripts.jsonl").touch()
    # its base model was a tiny model built in a temporary directory: the same one (seed 0) is here
    args = [f"model.path={tiny_model_dir}", f"run.output_dir={run_dir}", "trainer.total_steps=2"]
    assert main(["train", "--resume", str(run_dir), "--force", *args]) == 0, capsys.readouterr().err
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    history = [json.loads(x) for x in (run_dir / "history.jsonl").read_text().splitlines()]
    assert [(h["event"], h["step"]) for h in history] == [("start", 0), ("resume", 1)]
    assert history[1]["checkpoint"] == "step_1"
    assert (run_dir / "checkpoints" / "step_2" / "adapter" / "adapter_model.safetensors").is_file()
