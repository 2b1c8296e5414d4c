"""A full disk during a checkpoint: the run stops with exit 4 and a message naming the full
directory, the last complete checkpoint (intact) and the resume command, not a traceback; the
half-written checkpoint is removed; a warning comes before a save the disk has no room for. A full
disk while a step's records (metrics, transcripts) are written stops the run the same way, and the
resume loses and repeats nothing."""

from __future__ import annotations

import errno
import shutil

import pytest

from agentrl.cli import main
from agentrl.training import run_state
from agentrl.transcripts import TranscriptWriter, iter_episodes, read_metrics
from tests.helpers.configs import cli_args


def test_a_full_disk_stops_the_run_with_exit_4_and_the_resume_command(
    tmp_path, tiny_model_dir, monkeypatch, capsys
):
    """Before: a 20-line ``SafetensorError: ... No space left on device`` traceback, exit 1."""
    run = tmp_path / "run"
    args = cli_args(run, tiny_model_dir, "trainer.total_steps=4", "trainer.checkpoint_every=2")
    real = run_state.save_weights

    def fills_up(out, learner, base_path):
        if out.name == ".tmp_step_4":  # step_2 is written; step_4 meets a full disk
            (out / "model.safetensors").write_bytes(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(out, learner, base_path)

    monkeypatch.setattr(run_state, "save_weights", fills_up)
    _stops_on_a_full_disk(args, run, f"checkpoint step_4 in {run / 'checkpoints'}", capsys)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_2"]  # the partial one is gone


def test_a_save_the_disk_has_no_room_for_is_announced(tmp_path, tiny_model_dir, monkeypatch, capsys):
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(run_state.shutil, "disk_usage", lambda path: usage._replace(free=1024))
    run = tmp_path / "run"
    assert main(["train", *cli_args(run, tiny_model_dir, "trainer.total_steps=1")]) == 0
    out = capsys.readouterr()
    assert (
        f"warning: checkpoint step_1 needs about 0.01 GiB, and {run} has 0.00 GiB free" in out.out + out.err
    )
    assert run_state.disk_full(
        RuntimeError(
            'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'
        )
    )


def test_a_full_disk_while_writing_a_steps_records_stops_with_exit_4_and_the_resume_loses_nothing(
    tmp_path, tiny_model_dir, monkeypatch, capsys
):
    """Before: ``OSError: [Errno 28] No space left on device`` from ``TranscriptWriter.write``, a
    traceback and exit 1 (the real-model study met it, 2026-11-30)."""
    run = tmp_path / "run"
    args = cli_args(run, tiny_model_dir, "trainer.total_steps=4", "trainer.checkpoint_every=2")
    real = TranscriptWriter.write
    calls = []

    def fills_up(self, episodes):
        calls.append(1)
        if len(calls) == 4:  # step 3's transcripts: half a line lands, then the disk is full
            self._f.write(b'{"torn')
            self._f.flush()
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, episodes)

    monkeypatch.setattr(TranscriptWriter, "write", fills_up)
    _stops_on_a_full_disk(args, run, f"the records of step 3 in {run} (OSError)", capsys)
    monkeypatch.setattr(TranscriptWriter, "write", real)  # space freed
    assert main(["train", "--resume", str(run)]) == 0
    assert [row["step"] for row in read_metrics(run)] == [0, 1, 2, 3]  # step 3's row, logged once
    steps = [ep.step for ep in iter_episodes(run)]
    assert sorted(steps) == [s for s in range(4) for _ in range(4)], steps  # 2 prompts x 2 each, once


def _stops_on_a_full_disk(args, run, writing, capsys) -> None:
    """``agentrl train ARGS`` exits 4 with one message: what it was writing, the last complete
    checkpoint (step_2 in these runs) and the resume command; no traceback."""
    assert main(["train", *args]) == 4
    err = capsys.readouterr().err
    assert f"no space left on device while writing {writing}" in err
    assert "the last complete checkpoint, step_2, is intact" in err
    assert f"agentrl train --resume {run}" in err and "Traceback" not in err


def test_a_full_disk_after_the_last_checkpoint_warns_and_the_run_succeeds(
    tmp_path, tiny_model_dir, monkeypatch, capsys
):
    """The disk fills after the run's last checkpoint and records are written, in TensorBoard's close
    and in the plots: the run is complete, so it exits 0 with a warning saying how to get the plots,
    not 4 with a resume that would have nothing to train (before: a traceback, exit 1)."""
    from agentrl.training import metrics, trainer

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(metrics.MetricsLogger, "close", full)
    monkeypatch.setattr(trainer, "plot_run", full)
    run = tmp_path / "run"
    assert main(["train", *cli_args(run, tiny_model_dir, "trainer.total_steps=2", "logging.plots=true")]) == 0
    out = capsys.readouterr()
    text = out.out + out.err
    assert "no space left on device while writing the metrics' last events" in text
    assert "no space left on device while writing the plots (OSError)" in text
    assert f"free space, then run agentrl plot {run}" in text and "Traceback" not in text
    assert [row["step"] for row in read_metrics(run)] == [0, 1]
    assert (run / "checkpoints" / "step_2").is_dir()

    def broken(run_dir):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(trainer, "plot_run", broken)  # only a full disk is a warning
    other = cli_args(tmp_path / "other", tiny_model_dir, "trainer.total_steps=1", "logging.plots=true")
    with pytest.raises(OSError, match="Input/output error"):
        main(["train", *other])
