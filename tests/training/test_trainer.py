"""The RL loop end to end on a 2-layer tiny model: every algorithm runs, parameters move, seeded runs
reproduce, checkpoints resume after kill -9 with no transcript lost or duplicated."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from agentrl.algorithms import METHODS
from agentrl.assembly import make_trainer
from agentrl.cli import main
from agentrl.episode import Episode
from tests.helpers.configs import cli_args, small_config
from tests.helpers.jsonl import lines

ALGORITHMS = sorted(METHODS)  # every registered method: the records are the test matrix


@pytest.mark.parametrize("name", ALGORITHMS)
def test_two_step_smoke_run_per_algorithm(tmp_path, tiny_model_dir, name):
    cfg = small_config(
        tmp_path, tiny_model_dir, f"algorithm.name={name}", "algorithm.stare.target_entropy=100"
    )
    history = make_trainer(cfg, log=lambda *_: None).train()
    assert len(history) == 2
    run = tmp_path / "run"
    rows = [json.loads(line) for line in lines(run / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [0, 1]
    assert all("update/skipped" not in r for r in rows), "both steps should have trained"
    assert all(r["entropy/mean"] > 0 for r in rows)
    episodes = [Episode.from_json(line) for line in lines(run / "transcripts.jsonl")]
    assert len(episodes) == 2 * 2 * 4
    trained = [e for e in episodes if e.overlays]
    assert trained, "overlays are attached to trained episodes"
    for e in trained:
        for key in ("logp_old", "logp_new", "entropy", "advantage", "weight", "selected", "clipped"):
            vals = e.overlays[key]
            assert len(vals) == len(e.token_ids())
            assert all((v is None) == (m == 0) for v, m in zip(vals, e.loss_mask()))
    if name == "stare":
        assert all(r["stare/gate_on"] == 1.0 for r in rows)  # H_tgt = 100 keeps the gate on
        assert any(v == 1.0 for e in trained for v in e.overlays["selected"] if v is not None)
        for r in rows:  # the balance from the π_old pass, on every step (O1 at W = 1.1)
            want = -r["stare/lambda"] + 0.1 * r["stare/gamma_pos"]
            assert r["stare/dH_first_order"] == pytest.approx(want, rel=1e-6, abs=1e-12)
    assert (run / "checkpoints" / "step_2" / "trainer_state.pt").exists()


def test_the_critical_controller_sets_w_from_the_logged_balance(tmp_path, tiny_model_dir):
    cfg = small_config(
        tmp_path,
        tiny_model_dir,
        "algorithm.name=stare",
        "algorithm.stare.target_entropy=100",
        "algorithm.stare.controller=critical",
        "algorithm.stare.critical.margin=0.5",
        "algorithm.stare.critical.W_max=1000",
    )
    make_trainer(cfg, log=lambda *_: None).train()
    rows = [json.loads(line) for line in lines(tmp_path / "run" / "metrics.jsonl")]
    assert any(r["stare/w"] > 1 for r in rows), "a step where W came from the balance"
    for r in rows:
        lam, gain = r["stare/lambda"], r["stare/gamma_pos"]
        want = max(1.0, 1 + 1.5 * lam / gain) if gain > 0 and lam > 0 else 1.0
        assert r["stare/w"] == pytest.approx(want, rel=1e-6)
        if want > 1:  # the batch's first-order entropy change is +margin·Λ
            assert r["stare/dH_first_order"] == pytest.approx(0.5 * lam, rel=1e-6)
    from agentrl.training.progress import step_line

    top = max(rows, key=lambda r: r["stare/w"])
    assert f"W {top['stare/w']:.2f}" in step_line(top) and f"W* {top['stare/w_star']:.2f}" in step_line(top)


def test_every_parameter_changes_after_one_update(tmp_path, tiny_model_dir):
    cfg = small_config(tmp_path, tiny_model_dir, "algorithm.name=grpo", "trainer.total_steps=1")
    trainer = make_trainer(cfg, log=lambda *_: None)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    out = trainer.train_step(0)
    assert "update/skipped" not in out.metrics
    unchanged = [n for n, p in trainer.model.named_parameters() if torch.equal(p, before[n])]
    assert unchanged == []
    # the engine got the new weights and a new version
    assert trainer.engine.version == 1
    eng = dict(trainer.engine.model.named_parameters())
    assert all(torch.equal(eng[n], p) for n, p in trainer.model.named_parameters())


def test_gradient_checkpointing_trains_the_same_step(tmp_path, tiny_model_dir):
    """``model.gradient_checkpointing`` turns checkpointing on through transformers' current API (no
    deprecation warning, LoRA included) and changes nothing but memory: the same step's loss and
    gradient norm."""
    import warnings

    runs = {}
    for on, lora in ((False, 0), (True, 0), (True, 4)):
        cfg = small_config(
            tmp_path / f"{on}{lora}", tiny_model_dir, f"model.gradient_checkpointing={on}",
            f"model.lora.rank={lora}", "trainer.total_steps=1",
        )  # fmt: skip
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            trainer = make_trainer(cfg, log=lambda *_: None)
            runs[on, lora] = trainer.train_step(0).metrics
            m = trainer.model
            assert (
                m.is_activation_checkpointing
                if hasattr(m, "is_activation_checkpointing")
                else m.is_gradient_checkpointing
            ) == on
    for key in ("loss/pg_loss", "grad/norm"):
        assert runs[True, 0][key] == pytest.approx(runs[False, 0][key], rel=1e-5), key


def _metrics_without_time(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in lines(run / "metrics.jsonl")]
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "tokens/s"))} for r in rows]


def test_seeded_runs_reproduce(tmp_path, tiny_model_dir):
    a = small_config(tmp_path / "a", tiny_model_dir, "algorithm.name=stare")
    b = small_config(tmp_path / "b", tiny_model_dir, "algorithm.name=stare")
    make_trainer(a, log=lambda *_: None).train()
    make_trainer(b, log=lambda *_: None).train()
    assert _metrics_without_time(tmp_path / "a" / "run") == _metrics_without_time(tmp_path / "b" / "run")
    ta = (tmp_path / "a" / "run" / "transcripts.jsonl").read_text()
    tb = (tmp_path / "b" / "run" / "transcripts.jsonl").read_text()
    strip = lambda t: [{**json.loads(x), "metrics": None} for x in t.splitlines()]  # noqa: E731
    assert strip(ta) == strip(tb)


@pytest.mark.slow
def test_sigterm_finishes_the_step_checkpoints_and_resumes(tmp_path, tiny_model_dir, capsys):
    """SIGTERM (as a scheduler sends before preempting) lets the current step finish, writes a
    checkpoint at it even with periodic checkpoints off, and exits with 130 naming the resume
    command; the resumed run continues at that step with every step written once."""
    run = tmp_path / "run"
    args = cli_args(
        run,
        tiny_model_dir,
        "algorithm.dynamic_sampling=false",
        "trainer.total_steps=200",
        "trainer.checkpoint_every=0",
    )
    proc = train_process(args)
    metrics, deadline = run / "metrics.jsonl", time.time() + 300
    while not (metrics.exists() and metrics.read_text().count("\n") >= 1):
        assert proc.poll() is None, "the run ended before the signal"
        assert time.time() < deadline, "no step within 300 s"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 130, out[-2000:]
    assert f"agentrl train --resume {run}" in out
    steps = [json.loads(x)["step"] for x in lines(metrics)]
    n = len(steps)
    assert steps == list(range(n)) and n < 200
    assert [p.name for p in (run / "checkpoints").iterdir()] == [f"step_{n}"]  # the only one
    transcripts = run / "transcripts.jsonl"
    before = [json.loads(x)["id"] for x in lines(transcripts)]
    assert sorted({i.split("-")[0] for i in before}) == sorted(f"s{k}" for k in range(n))
    # the resume in this process (the signal needed a process of its own; a second fresh one cost ~10 s
    # of imports, issue 51)
    capsys.readouterr()
    code = main(["train", "--resume", str(run), f"trainer.total_steps={n + 2}"])
    done = capsys.readouterr()
    assert code == 0, done.err[-2000:]
    assert f"at step {n}" in done.out + done.err
    steps = [json.loads(x)["step"] for x in lines(metrics)]
    assert steps == list(range(n + 2))
    ids = [json.loads(x)["id"] for x in lines(transcripts)]
    assert ids[: len(before)] == before and len(ids) == len(set(ids))
    assert sorted({i.split("-")[0] for i in ids}) == sorted(f"s{k}" for k in range(n + 2))


@pytest.mark.slow
def test_kill_minus_9_then_resume(tmp_path, tiny_model_dir):
    """A run killed with SIGKILL after its second checkpoint resumes at the checkpoint's step; every
    step's episodes and metrics appear exactly once."""
    run = tmp_path / "run"
    args = cli_args(run, tiny_model_dir, "trainer.total_steps=6", "trainer.checkpoint_every=1")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentrl.cli", "train", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 300
    while not (run / "checkpoints" / "step_2" / "trainer_state.pt").exists():
        assert proc.poll() is None, "the run ended before it could be killed"
        assert time.time() < deadline, "no second checkpoint within 300 s"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    steps_before = {json.loads(x)["step"] for x in lines(run / "metrics.jsonl") if x.strip()}
    assert 1 in steps_before
    done = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "train", "--resume", str(run)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "resumed from" in done.stdout + done.stderr
    steps = [json.loads(x)["step"] for x in lines(run / "metrics.jsonl")]
    assert steps == [0, 1, 2, 3, 4, 5]
    ids = [json.loads(x)["id"] for x in lines(run / "transcripts.jsonl")]
    assert len(ids) == len(set(ids)) == 6 * 2 * 2
    assert sorted({i.split("-")[0] for i in ids}) == [f"s{k}" for k in range(6)]


@pytest.mark.slow
def test_sigterm_during_the_warm_start_stops_the_run_saying_so(tmp_path, tiny_model_dir):
    """Issue 66, item 9: SIGTERM during the SFT warm start killed the run without a word (SIGINT
    was handled). It now stops as Ctrl-C does: exit 130, the signal named, nothing to resume said,
    and no half-trained warm start left in the cache."""
    run, cache = tmp_path / "run", tmp_path / "cache"
    args = cli_args(run, tiny_model_dir, "sft.enabled=true", "sft.steps=100000", "env.name=calculator")
    proc = train_process(args, AGENTRL_CACHE=str(cache))
    seen = []
    killer = threading.Timer(300, proc.kill)  # a hung run fails the test instead of hanging it
    killer.start()
    for line in proc.stdout:  # until the warm start is under way (it logs every steps/10 steps)
        seen.append(line)
        if line.startswith("SFT warm start:"):
            break
    time.sleep(2)
    killer.cancel()
    assert proc.poll() is None, "".join(seen)[-2000:]
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out[-2000:]
    assert "SIGTERM: stopping the run's set-up" in out and "nothing to resume" in out
    assert not list((cache / "warmstart").glob("*")), list((cache / "warmstart").glob("*"))
    assert not run.exists()  # nothing was written before every input was checked and the set-up done


def train_process(args: list[str], **env: str) -> subprocess.Popen:
    """``agentrl train ARGS`` in a subprocess, its output unbuffered on one text pipe."""
    return subprocess.Popen(
        [sys.executable, "-m", "agentrl.cli", "train", *args],
        env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
