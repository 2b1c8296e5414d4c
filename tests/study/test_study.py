"""`agentrl study`: a micro study (one family, two methods, one seed, two steps) end to end, the
report's structure, resuming without rerunning, and config errors. The science is not checked here
(docs/results.md holds the measured study)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from agentrl.assembly import build
from agentrl.config import ConfigError, load_config
from agentrl.study import RunSpec, load_study, run_study
from agentrl.study.archive import restore_runs
from agentrl.study.report import band_fraction
from agentrl.transcripts import read_metrics
from tests.helpers import ROOT
from tests.helpers.user_files import one_turn_env


def test_paired_differences_and_what_the_seeds_support():
    from agentrl.study.report import paired_differences, supported

    runs = {
        "base": [{"seed": 0, "x": 1.0}, {"seed": 1, "x": 2.0}, {"seed": 2, "x": 3.0}],
        "m": [{"seed": 2, "x": 3.5}, {"seed": 0, "x": 1.4}, {"seed": 1, "x": 2.6}],  # order differs
        "partial": [{"seed": 1, "x": 1.0}],
    }
    diffs = paired_differences(runs, "base", "x")
    assert diffs["m"] == pytest.approx([0.5, 0.4, 0.6]) and diffs["partial"] == [-1.0]
    assert supported([0.5, 0.4, 0.6])  # mean 0.5, sd 0.1: t = 8.7 > 4.30 (df 2, α 0.05)
    assert not supported([1.0, 1.5, 2.5])  # one sign and t = 3.8 > 2 (the old rule's mark), but not > 4.30
    assert not supported([0.5, -0.1, 0.6])  # one seed disagrees
    assert not supported([0.01, 1.0, 0.02])  # same sign but the spread swamps the mean
    assert not supported([-1.0])  # one seed supports nothing


def test_extra_methods_run_after_every_required_run(tmp_path, tiny_model_dir, varied_env):
    from agentrl.study import plan

    path = _write_study(tmp_path, tiny_model_dir, METHODS, varied_env)
    study = load_study(path, ["seeds=[0,1]", "extra_methods={steer: [algorithm.name=steer]}"])
    order = [(r.method, r.seed) for r in plan(study, {"calc": 0.1})]
    assert order == [
        ("grpo_ds", 0),
        ("stare_pi", 0),
        ("grpo_ds", 1),
        ("stare_pi", 1),
        ("steer", 0),
        ("steer", 1),
    ]
    reduced = load_study(
        path, ["extra_methods={steer: [algorithm.name=steer]}", "reduced.methods=[steer]"], reduced=True
    )
    assert list(reduced.methods) == ["steer"] and not reduced.extra_methods
    with pytest.raises(ValueError, match="both 'methods' and 'extra_methods'"):
        load_study(path, ["extra_methods={grpo_ds: [algorithm.name=grpo]}"])


def test_band_fraction_hand_values():
    # target 1, band [0.5, 1.5], warm-up 1: steps 1..4 -> 0.7 in, 2.0 out, None out, 1.5 in
    assert band_fraction([9.0, 0.7, 2.0, None, 1.5], 1.0, (0.5, 1.5), 1) == pytest.approx(0.5)
    assert math.isnan(band_fraction([1.0], 1.0, (0.5, 1.5), 3))


def test_entropy_slope_hand_values():
    from agentrl.study.report import entropy_slope

    # after warm-up 1: points (1, 1.0), (2, 0.9), (3, None), (4, 0.7): slope -0.1 a step, -1.0 per 10
    assert entropy_slope([5.0, 1.0, 0.9, None, 0.7], 1) == pytest.approx(-1.0)
    assert math.isnan(entropy_slope([1.0, 0.9, None], 0))  # two points are no trend


@pytest.fixture(scope="module")
def varied_env(tmp_path_factory) -> Path:
    """One file for the module's tests (an environment name registered from two files is refused)."""
    path = tmp_path_factory.mktemp("env") / "varied_env.py"
    path.write_text(one_turn_env("study_test_varied"))
    return path


def _write_study(tmp_path: Path, model_dir: Path, methods: dict, env_file: Path) -> Path:
    family = {
        "model": {"path": str(model_dir)},
        "env": {"name": "study_test_varied", "module": str(env_file)},
        "data": {"num_test": 4, "num_train": 16},
        "rollout": {
            "prompts_per_step": 2,
            "group_size": 4,
            "max_turns": 2,
            "max_tokens_per_turn": 12,
            "max_episode_tokens": 400,
        },
        "trainer": {"lr": 1e-3, "micro_batch_size": 8},
        "logging": {"tensorboard": False, "plots": False},
    }
    (tmp_path / "family.yaml").write_text(yaml.safe_dump(family))
    study = {
        "name": "micro",
        "output_dir": str(tmp_path / "runs"),
        "report_dir": str(tmp_path / "report"),
        "seeds": [0],
        "steps": 2,
        "parallel": 2,
        "eval_k": 2,
        "eval_tasks": 2,
        "warmup_steps": 0,
        "target": {"rule": "initial", "scale": 1.0, "probe_prompts": 2},
        "families": {"calc": str(tmp_path / "family.yaml")},
        "methods": methods,
    }
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


METHODS = {
    "grpo_ds": ["algorithm.name=grpo", "algorithm.loss_agg=token-mean", "algorithm.dynamic_sampling=true"],
    "stare_pi": ["algorithm.name=stare", "algorithm.stare.controller=pi"],
}


@pytest.mark.slow
def test_micro_study_writes_a_well_formed_report_resumes_and_continues_from_its_archive(
    tmp_path, tiny_model_dir, varied_env
):
    path = _write_study(tmp_path, tiny_model_dir, METHODS, varied_env)
    raw = yaml.safe_load(path.read_text())  # a second evaluation of every run and the warm start
    path.write_text(yaml.safe_dump({**raw, "eval_sampling": {"greedy": ["eval.temperature=0", "eval.k=1"]}}))
    logs: list[str] = []
    # H_tgt above the entropy: STARE's gate opens and it selects tokens
    over = ["target.scale=3.0", f"archive_dir={tmp_path / 'archive'}"]
    stale = tmp_path / "runs" / "calc" / "grpo_ds" / "s0" / "failed.json"  # an earlier attempt failed
    stale.parent.mkdir(parents=True)
    stale.write_text("{}")
    report = run_study(load_study(path, over), log=logs.append)
    text = report.read_text()
    assert sum("recorded in" in line for line in logs) == 2, logs
    assert report == tmp_path / "report" / "results.md"
    assert "## calc" in text and "H_tgt" in text
    rows = [
        line for line in text.splitlines() if line.startswith("| grpo_ds") or line.startswith("| stare_pi")
    ]
    rows = [line for line in rows if line.count("|") == 16]  # the main table (not the per-seed rows)
    assert len(rows) == 2, text
    for panel in ("entropy", "entropy_rollout", "entropy_branching", "reward", "length", "pass_at_k"):
        assert (tmp_path / "report" / "img" / f"study_calc_{panel}.png").stat().st_size > 1000
    assert "| grpo_ds | 0 |" in text and "| stare_pi | 0 |" in text  # the per-seed rows
    assert "Paired by seed against `grpo_ds`" in text and "| stare_pi | " in text
    assert "collapsed (final entropy < 0.5 × H0) on **" in text
    assert "- Entropy trend after step 0" in text and "`stare_pi` " in text
    # STARE's selections, read back from the transcripts and decoded; GRPO-ds selects nothing
    (tokens,) = [ln for ln in text.splitlines() if ln.startswith("| stare_pi | ") and "`'" in ln]
    assert not any(line.startswith("| grpo_ds | ") and "`'" in line for line in text.splitlines())
    trained, boosted = tokens.split(" | ")[1:3]
    assert int(trained) > 0 and float(boosted.rstrip("%")) > 0
    summary = json.loads((tmp_path / "report" / "summary.json").read_text(), parse_constant=pytest.fail)
    assert summary["calc"]["methods"]["grpo_ds"][0]["gate_on"] is None  # not recorded: null, strict JSON
    prep = summary["calc"]["prep"]
    assert prep["h0"] > 0 and prep["target_entropy"] == pytest.approx(3.0 * prep["h0"])
    assert prep["h0_branching"] >= prep["h0"]  # the top 10 % of tokens are at least the mean
    assert sorted(int(j) for j in prep["initial_pass_curve"]) == [1, 2]
    greedy = prep["initial_extra_evals"]["greedy"]
    assert greedy["eval/k"] == 1 and greedy["eval/tasks"] == 2 and 0 <= greedy["eval/mean@k"] <= 1
    assert "**Held-out mean@k at other sampling settings** (`eval_sampling`: greedy = " in text
    assert f"| warm start | {greedy['eval/mean@k']:.3f} | – |" in text
    for method in METHODS:
        (run,) = summary["calc"]["methods"][method]
        assert run["steps"] == 2 and run["seed"] == 0
        assert 0.0 <= run["mean_at_k"] <= run["pass_at_k"] <= 1.0
        assert run["pass_curve"]["1"] == pytest.approx(run["mean_at_k"])  # pass@1 is the mean accuracy
        assert run["pass_curve"]["2"] == pytest.approx(run["pass_at_k"])
        assert run["policy_tokens"] > 0
        assert run["mean_at_k:greedy"] in (0.0, 0.5, 1.0)  # one greedy sample of each of 2 tasks
    # the runs' configs carry the measured target and the shared warm-start seed
    cfg = yaml.safe_load((tmp_path / "runs" / "calc" / "stare_pi" / "s0" / "config.yaml").read_text())
    assert cfg["algorithm"]["stare"]["target_entropy"] == pytest.approx(prep["target_entropy"], rel=1e-5)
    assert cfg["sft"]["seed"] == 0 and cfg["run"]["seed"] == 0
    assert not stale.exists()  # the run that finished took the earlier attempt's failure mark away
    # rerun: nothing is trained again, the report is rewritten, here also as a section of another
    # study's results file (docs/results.md holds the real-model study's report so)
    logs.clear()
    other = tmp_path / "docs" / "results.md"
    other.parent.mkdir()
    other.write_text("# Another study\n\nIts own tables.\n")
    run_study(load_study(path, [*over, f"section_in={other}"]), log=logs.append)
    assert any("2 runs, 2 already done" in line for line in logs), logs
    merged = other.read_text()
    assert merged.startswith("# Another study\n\nIts own tables.\n") and "\n### calc\n" in merged
    links = re.findall(r"\]\(([^)#]+)", merged.split("<!-- agentrl study section: micro -->")[1])
    assert any(link.endswith("study_calc_entropy.png") for link in links), links
    for link in links:  # every link of the section, images included, resolves from its new folder
        assert (other.parent / link).exists(), link
    _check_the_archive_restores_the_study(tmp_path, path, over, text)


def _check_the_archive_restores_the_study(tmp_path: Path, path: Path, over: list[str], before: str) -> None:
    """With ``archive_dir`` every finished run left a small record; a study whose run directories are
    gone (a fresh machine, the archive committed) restores them: nothing is rerun, the target is the
    one the runs trained against, and the report (tables, token selections) is the same."""
    for method in METHODS:
        rec = tmp_path / "archive" / "calc" / method / "s0"
        assert sorted(p.name for p in rec.iterdir()) == sorted(
            ["result.json", "metrics.jsonl", "config.yaml", "selections.json"]
        )
        assert len(read_metrics(rec)) == 2
        assert len(json.loads((rec / "result.json").read_text())["warm_start_sha256"]) == 64
    assert (tmp_path / "archive" / "calc" / "prep.json").exists()
    assert json.loads((tmp_path / "archive" / "calc" / "stare_pi" / "s0" / "selections.json").read_text())
    assert "Every run started from the warm start the probe measured" in before
    shutil.rmtree(tmp_path / "runs")  # what a fresh machine has: the archive only

    def tables(text: str) -> list[str]:  # everything but the header's timing line
        return [line for line in text.splitlines() if line.startswith("|") or "started from" in line]

    # --report-only neither trains nor builds the warm start (here: it is gone); the configured
    # model's tokenizer decodes the selected tokens
    with pytest.MonkeyPatch.context() as mp:
        gone = tmp_path / "gone" / Path(str(build.warm_start_dir(load_config(tmp_path / "family.yaml")))).name
        mp.setattr(build, "warm_start_dir", lambda cfg, base=None: str(gone))
        mp.setattr(build, "policy_path", lambda *a, **k: pytest.fail("--report-only built the warm start"))
        only = run_study(load_study(path, over), log=lambda _: None, only_report=True).read_text()
    assert tables(only) == tables(before)
    shutil.rmtree(tmp_path / "runs")

    logs: list[str] = []
    after = run_study(load_study(path, over), log=logs.append).read_text()
    assert any("2 finished runs restored from the archive" in line for line in logs), logs
    assert any("2 runs, 2 already done" in line for line in logs), logs
    assert any("restored from the archive" in line and "warm start" in line for line in logs), logs
    assert not any(line.startswith("[") for line in logs), logs  # no run was launched
    assert tables(after) == tables(before)
    assert any(line.startswith("| stare_pi | ") and "`'" in line for line in tables(after))
    # a record trained with other settings than the study now gives that run is not taken for it
    rec = json.loads((tmp_path / "archive" / "calc" / "grpo_ds" / "s0" / "result.json").read_text())
    fields = {f.name: rec[f.name] for f in dataclasses.fields(RunSpec)}
    for steps, expected in ((2, 1), (3, 0)):
        out = tmp_path / f"elsewhere{steps}"
        spec = RunSpec(**{**fields, "out": str(out)})
        spec.overrides = [o if not o.startswith("trainer.total_steps=") else f"trainer.total_steps={steps}"
                          for o in spec.overrides]  # fmt: skip
        logs.clear()
        assert len(restore_runs(str(tmp_path / "archive"), [spec], logs.append)) == expected
        assert (out / "result.json").exists() == bool(expected)
    assert any("trainer.total_steps: 2 -> 3" in line and "not used" in line for line in logs), logs
    # nor one that was not evaluated at a sampling setting the study now asks for
    spec = RunSpec(
        **{**fields, "out": str(tmp_path / "nucleus"), "eval_sampling": {"nucleus": ["eval.top_p=0.7"]}}
    )
    assert restore_runs(str(tmp_path / "archive"), [spec], logs.append) == []
    assert "eval_sampling.nucleus: not evaluated" in logs[-1], logs


@pytest.mark.slow
def test_a_stopped_run_continues_from_its_checkpoint_or_starts_over(tmp_path, tiny_model_dir, varied_env):
    """A study stopped inside a run: with a checkpoint the run continues from it (no step twice in its
    metrics); without one it starts over, instead of refusing the directory it left."""
    from agentrl.study import plan, prepare_family, run_one

    path = _write_study(tmp_path, tiny_model_dir, {"grpo_ds": METHODS["grpo_ds"]}, varied_env)
    study = load_study(path, ["checkpoint_every=1"])
    prep = prepare_family(study, "calc", log=lambda _: None)
    (spec,) = plan(study, {"calc": prep["target_entropy"]})
    first = dataclasses.replace(spec, overrides=[*spec.overrides, "trainer.total_steps=1"])
    run_one(first, study.families["calc"])  # "stopped" after step 0, its checkpoint written
    assert (Path(spec.out) / "checkpoints").is_dir()
    result = run_one(spec, study.families["calc"])
    rows = read_metrics(spec.out)
    assert [row["step"] for row in rows] == [0, 1] and result["steps"] == 2
    # its time counts the step of the first invocation too
    assert result["train_seconds"] == pytest.approx(sum(row["time/step_s"] for row in rows))
    assert result["seconds"] == pytest.approx(result["train_seconds"] + result["eval_seconds"])

    # a run stopped before its first checkpoint left lines behind: the study starts it over
    other = tmp_path / "runs" / "calc" / "grpo_ds" / "s0"
    shutil.rmtree(other / "checkpoints")
    (other / "result.json").unlink()
    logs: list[str] = []
    run_study(load_study(path), log=logs.append)
    assert any("grpo_ds seed 0: ok" in line for line in logs), logs
    assert [row["step"] for row in read_metrics(other)] == [0, 1]


def test_study_config_errors_name_the_key(tmp_path, tiny_model_dir, varied_env):
    path = _write_study(tmp_path, tiny_model_dir, {"bad": ["algorithm.name=grpoo"]}, varied_env)
    with pytest.raises(ValueError, match="stepz"):
        load_study(path, ["stepz=3"])
    with pytest.raises(ValueError, match=r"eval_sampling.greedy must be a list of eval.KEY=VALUE"):
        load_study(path, ["eval_sampling.greedy=[rollout.top_p=0.7]"])
    with pytest.raises(ValueError, match=r"reduced.methods names \['nope'\]"):
        load_study(path, ["reduced.methods=[nope]"], reduced=True)
    with pytest.raises(ConfigError, match="grpoo"):  # a method's override is checked before any work
        run_study(load_study(path), log=lambda *_: None)
    assert not (tmp_path / "runs").exists()


@pytest.mark.study
@pytest.mark.slow
def test_reduced_study_command_end_to_end(tmp_path):
    """The literal `agentrl study configs/study.yaml --reduced` through the CLI (real tiny model;
    countdown, 3 methods, 8 steps: measured 39 s by hand and 118 s as `pytest -m study` with the
    warm start cached, ~2.5 min more when it has to be built)."""
    import subprocess
    import sys

    root = ROOT
    out = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "study", "configs/study.yaml", "--reduced",
         f"output_dir={tmp_path / 'runs'}", f"report_dir={tmp_path / 'report'}"],
        cwd=root, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    study = load_study(root / "configs" / "study.yaml", reduced=True)
    # apart from the full study's runs and report (an 8-step run must never pass for a full one)
    assert not (tmp_path / "runs" / "countdown").exists() and (tmp_path / "runs" / "reduced").is_dir()
    text = (tmp_path / "report" / "reduced" / "results.md").read_text()
    for family in study.families:
        assert f"## {family}" in text
        for method in study.methods:
            main_rows = [line for line in text.splitlines() if line.startswith(f"| {method} |")]
            assert sum(line.count("|") == 16 for line in main_rows) == 1, method  # + its per-seed row
            summary = json.loads((tmp_path / "report" / "reduced" / "summary.json").read_text())
            (run,) = summary[family]["methods"][method]
            assert run["steps"] == study.steps and 0 <= run["mean_at_k"] <= 1
    assert "Runs without a result" not in text


def test_probe_tasks_take_an_equal_share_of_each_run_seed(tmp_path, tiny_model_dir, varied_env):
    from agentrl.assembly import components
    from agentrl.config import load_config
    from agentrl.study import family_overrides, probe_tasks

    path = _write_study(tmp_path, tiny_model_dir, METHODS, varied_env)
    study = load_study(path, ["seeds=[0,1,2]", "target.probe_prompts=4"])
    cfg = load_config(study.families["calc"], family_overrides(study, "calc"))
    by_seed = {s: components.load_tasks(cfg, "train", seed=s) for s in (0, 1, 2)}
    assert by_seed[0][:2] != by_seed[1][:2]  # the seeds really draw different lists
    got = [t.id for t in probe_tasks(cfg, study)]
    # ceil(4 / 3) = 2 from each seed in order, cut to 4: seed 0's first two, then seed 1's
    assert got == [t.id for t in by_seed[0][:2] + by_seed[1][:2]]
    study.target.probe = "sft_seed"
    assert [t.id for t in probe_tasks(cfg, study)] == [t.id for t in by_seed[0][:4]]


def test_a_cell_shows_its_spread_without_a_sign():
    from agentrl.study.report.comparison import cell

    assert cell([-0.035, -0.040], "{:+.4f}") == "-0.0375 ± 0.0035"  # the slope's sign, not the spread's
    assert cell([0.5], "{:+.4f}") == "+0.5000"
    assert cell([0.1, 0.3], pct=True) == "20 % ± 14"


def test_token_text_stays_inside_its_table_cell():
    from agentrl.study.tokens import _code

    assert _code(" the") == "`' the'`"
    assert _code("a|b") == "`'a\\|b'`"  # a pipe would end the cell
    assert _code("x`y") == "`` 'x`y' ``"  # a backtick would end a single-backtick span


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _start_and_wait_for_steps(command: list[str], run: Path, steps: int):
    """Start the study command and return it once its run has logged ``steps`` steps."""
    import signal
    import subprocess
    import time

    # SIGINT as a terminal's Ctrl-C delivers it: a suite run in the background (CI) inherits it
    # ignored, and a process that starts with SIGINT ignored keeps ignoring it
    parent = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    deadline = time.monotonic() + 300
    while not (run / "metrics.jsonl").exists() or len(read_metrics(run)) < steps:
        assert parent.poll() is None and time.monotonic() < deadline, "the study ended or took too long"
        time.sleep(0.2)
    return parent


def _assert_checkpointed_at_its_step(run: Path) -> int:
    from agentrl.training.checkpoint import latest_checkpoint

    steps = [row["step"] for row in read_metrics(run)]
    assert steps == list(range(len(steps)))  # nothing twice, nothing lost
    checkpoint = latest_checkpoint(run)
    assert checkpoint is not None and checkpoint.name == f"step_{len(steps)}", (checkpoint, steps)
    assert not (run / "result.json").exists()
    return len(steps)


def test_a_run_whose_study_died_before_it_started_watching_stops(monkeypatch):
    """A study killed in the seconds a run spends on its imports has already handed the run to init
    when the run starts watching: the run compares its parent with the study's pid
    (``AGENTRL_STUDY_PID``), not with the parent it finds then, and stops at once."""
    import os
    import signal
    import threading

    from agentrl.study import runs

    killed = threading.Event()
    sent: list[tuple[int, int]] = []

    def kill(pid: int, sig: int) -> None:
        sent.append((pid, sig))
        killed.set()

    monkeypatch.setattr(os, "kill", kill)
    monkeypatch.setenv("AGENTRL_STUDY_PID", str(os.getppid() + 1_000_000))  # a study that is gone
    runs.stop_when_orphaned(poll_s=0.01)
    assert killed.wait(5.0), "the run kept training after its study was gone"
    assert sent == [(os.getpid(), signal.SIGTERM)]


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_a_stopped_or_killed_study_checkpoints_its_run_at_the_step_and_continues(
    tmp_path, tiny_model_dir, varied_env
):
    """Ctrl-C (SIGINT) to the study: it SIGTERMs its run once, the run finishes its step, checkpoints
    it and the study exits 130 saying how to continue. SIGKILL to the study: the run notices it is
    orphaned and does the same on its own. (Continuing from such a checkpoint:
    test_a_stopped_run_continues_from_its_checkpoint_or_starts_over.)"""
    import signal
    import time

    path = _write_study(tmp_path, tiny_model_dir, {"grpo_ds": METHODS["grpo_ds"]}, varied_env)
    command = [sys.executable, "-m", "agentrl.cli", "study", str(path), "checkpoint_every=1000"]
    run = tmp_path / "runs" / "calc" / "grpo_ds" / "s0"
    parent = _start_and_wait_for_steps([*command, "steps=400"], run, 2)
    parent.send_signal(signal.SIGINT)
    _, err = parent.communicate(timeout=120)
    assert parent.returncode == 130 and "run the same command to continue" in err, err[-2000:]
    done = _assert_checkpointed_at_its_step(run)
    log = (run / "log.txt").read_text()
    assert "SIGTERM: finishing step" in log and "SIGTERM again" not in log, log[-2000:]

    parent = _start_and_wait_for_steps([*command, "steps=400"], run, done + 2)
    (child,) = _children(parent.pid)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 120
    while Path(f"/proc/{child}").exists() and Path(f"/proc/{child}/stat").read_text().split()[2] != "Z":
        assert time.monotonic() < deadline, "the run outlived its study"
        time.sleep(0.2)
    assert "the study is gone" in (run / "log.txt").read_text()
    done = _assert_checkpointed_at_its_step(run)


def test_a_run_that_finds_the_disk_full_stops_the_study_from_starting_more(tmp_path, monkeypatch):
    """A run that exits with ``DiskFull`` (its own message in its log) is reported as such, and the
    study starts no further run (each would meet the same disk): rerunning it continues them all."""
    from agentrl.study import runs
    from agentrl.study.spec import StudyConfig
    from agentrl.training.run_state import DiskFull

    class Finished:  # a run process that has exited with ``code``
        def __init__(self, code: int) -> None:
            self.returncode, self.log_file = code, open(tmp_path / f"log{code}", "w")  # noqa: SIM115

        def poll(self) -> int:
            return self.returncode

    launched: list[str] = []

    def launch(spec: RunSpec, config: str, threads: int) -> Finished:
        launched.append(spec.method)
        return Finished(DiskFull.exit_code if spec.method == "b" else 0)

    monkeypatch.setattr(runs, "_launch", launch)
    monkeypatch.setattr(runs.time, "sleep", lambda s: None)
    specs = [RunSpec("f", m, 0, [], str(tmp_path / m)) for m in ("a", "b", "c", "d")]
    for spec in specs:
        Path(spec.out).mkdir()
    logs: list[str] = []
    study = StudyConfig(families={"f": "f.yaml"}, parallel=1)
    runs._run_all(list(specs), [], study, 1, len(specs), logs.append)
    assert launched == ["a", "b"], logs
    assert f"f b seed 0: FAILED (exit 4: the disk is full, see {tmp_path / 'b'}/log.txt)" in logs[1]
    assert logs[2].startswith("study: the disk is full, so 2 run(s) not started; free space and run the same")
    assert json.loads((tmp_path / "b" / "failed.json").read_text())["exit"] == 4


def test_a_run_child_that_finds_the_disk_full_says_so_and_exits_4(monkeypatch, capsys):
    from agentrl.study import runs
    from agentrl.training.run_state import DiskFull

    def fills_up(spec: RunSpec, config: str) -> None:
        raise DiskFull("no space left on device while writing the records of step 3 in R (OSError); ...")

    monkeypatch.setattr(runs, "stop_when_orphaned", lambda: None)
    monkeypatch.setattr(runs, "run_one", fills_up)
    payload = json.dumps({"spec": dataclasses.asdict(RunSpec("f", "m", 0, [], "R")), "config": "c.yaml"})
    assert runs.child_main(payload) == 4
    assert "agentrl: no space left on device while writing the records of step 3" in capsys.readouterr().out


def test_run_overrides_on_the_study_command_reach_every_run_and_parallel_0_takes_the_idle_cores(
    tmp_path, tiny_model_dir, varied_env, monkeypatch
):
    """Issue 66, item 12: `agentrl study ... run.threads=1` was refused ("unknown section 'run'"), and
    two torch processes started by default even beside a busy process on 2 cores."""
    from agentrl.study.spec import busy_cores, plan, run_threads, runs_at_once, split_overrides

    path = _write_study(tmp_path, tiny_model_dir, METHODS, varied_env)
    study = load_study(path, ["run.threads=1", "steps=3", "trainer.lr=1e-4", "parallel=0"])
    assert study.steps == 3 and study.overrides[-2:] == ["run.threads=1", "trainer.lr=1e-4"]
    assert run_threads(study, 2) == 1
    spec = plan(study, {"calc": 1.0})[0]
    cfg = load_config(study.families[spec.family], spec.overrides)
    assert cfg.run.threads == 1 and cfg.trainer.lr == 1e-4
    assert split_overrides(["reduced.steps=2", "rollout.group_size=2"]) == (
        ["reduced.steps=2"],
        ["rollout.group_size=2"],
    )
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    for busy, parallel in ((0.1, 2), (1.0, 1), (1.6, 1), (5.0, 1)):
        monkeypatch.setattr("agentrl.study.spec.busy_cores", lambda window_s, busy=busy: busy)
        assert runs_at_once(study) == parallel, busy
    monkeypatch.undo()
    assert 0.0 <= busy_cores(0.2) <= (os.cpu_count() or 1)  # measured from /proc/stat
    assert runs_at_once(dataclasses.replace(study, parallel=2)) == 2
    assert run_threads(dataclasses.replace(study, overrides=[]), 2) == 1
    assert run_threads(dataclasses.replace(study, overrides=[]), 1) == 2
