"""Checkpoints that make a killed run resumable with no transcript lost or written twice.

A checkpoint is a directory ``RUN/checkpoints/step_N/`` holding the policy in HF format, the
tokenizer, and ``trainer_state.pt`` (optimizer, sampler position, algorithm state such as STARE's
controller, the step, and under ``ranks`` one part per data-parallel rank: its RNG states and the
byte lengths of its own ``metrics.jsonl`` and ``transcripts.jsonl`` at that step). It is written to a
temporary directory and renamed, so a kill during a save leaves the previous checkpoint intact.

Under torchrun only rank 0 writes checkpoints, with every rank's part gathered into the same state
file: the one rename makes all parts complete together, so no kill can leave a checkpoint some rank
cannot resume from. On resume the JSONL files are cut back to the recorded lengths: steps after the
checkpoint are re-run and their lines written once.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentrl.config import ConfigError

STATE_FILE = "trainer_state.pt"


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def file_length(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def rank_state(run_dir: Path) -> dict[str, Any]:
    """What a rank restores for itself on resume: its RNG states and the byte lengths of the JSONL
    files in its own run directory (``RUN/ranks/r/`` for rank r > 0)."""
    return {
        "rng": rng_state(),
        "metrics_bytes": file_length(run_dir / "metrics.jsonl"),
        "transcripts_bytes": file_length(run_dir / "transcripts.jsonl"),
    }


def saved_rank_state(state: dict[str, Any], rank: int, world: int, ckpt: Path) -> dict[str, Any]:
    """Rank ``rank``'s part of a checkpoint's state; a clear error when a different number of ranks
    wrote it (rank r's RNG states and files have no counterpart under another world size)."""
    parts = state.get("ranks") or [state]  # written before per-rank parts existed: one process
    if len(parts) != world:
        raise ConfigError(
            f"{ckpt} was written by {len(parts)} data-parallel rank(s) but this run has {world}: "
            f"resume with the same world size (torchrun --nproc_per_node {len(parts)}, or no torchrun for 1)"
        )
    return parts[rank]


def save_checkpoint(
    run_dir: Path, step: int, model: Any, tokenizer: Any, state: dict[str, Any], keep: int = 2
) -> Path:
    """Write ``checkpoints/step_{step}`` atomically, then drop all but the newest ``keep``. ``state``
    holds ``ranks``: every rank's ``rank_state``, in rank order."""
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step}"
    tmp = root / f".tmp_step_{step}_{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    torch.save({**state, "step": step}, tmp / STATE_FILE)
    _fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    for old in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first (a directory without its state file is incomplete)."""
    root = Path(run_dir) / "checkpoints"
    if not root.exists():
        return []
    found = [p for p in root.glob("step_*") if (p / STATE_FILE).exists()]
    return sorted(found, key=lambda p: int(p.name.split("_")[1]))


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def load_state(ckpt: Path) -> dict[str, Any]:
    # on the CPU: every rank reads rank 0's file; optimizer.load_state_dict moves each tensor to its
    # parameter's device
    return torch.load(ckpt / STATE_FILE, weights_only=False, map_location="cpu")


def truncate_to(path: Path, length: int) -> int:
    """Cut ``path`` back to ``length`` bytes (lines written after the checkpoint); returns bytes cut."""
    if not path.exists():
        return 0
    extra = path.stat().st_size - length
    if extra > 0:
        with open(path, "r+b") as f:
            f.truncate(length)
            f.flush()
            os.fsync(f.fileno())
    return max(extra, 0)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


RUN_FILES = ("metrics.jsonl", "transcripts.jsonl", "checkpoints")
"""What makes a directory hold a run (a config.yaml alone does not: nothing was trained)."""


def existing_run(run_dir: Path) -> list[str]:
    """The run files in ``run_dir`` ([] for a new or empty directory)."""
    return [name for name in RUN_FILES if (Path(run_dir) / name).exists()]


def refuse_existing_run(run_dir: Path) -> None:
    """A ``ConfigError`` when ``run_dir`` already holds a run: writing a new run into it would mix two
    runs' steps and transcripts, and prune the old checkpoints."""
    found = existing_run(run_dir)
    if not found:
        return
    ckpt = latest_checkpoint(run_dir)
    where = f" (newest checkpoint: {ckpt.name})" if ckpt else ""
    raise ConfigError(
        f"{run_dir} already holds a run ({', '.join(found)}){where}. Continue it with "
        f"`agentrl train --resume {run_dir}`, start a new one elsewhere with run.output_dir=DIR, or "
        "pass --overwrite to move the old run aside (nothing is deleted)"
    )


def move_aside(run_dir: Path) -> Path:
    """Rename ``run_dir`` to a free ``<run_dir>.old-<n>`` sibling and return the new path."""
    run_dir = Path(run_dir)
    n = 1
    while (target := run_dir.with_name(f"{run_dir.name}.old-{n}")).exists():
        n += 1
    os.replace(run_dir, target)
    return target
