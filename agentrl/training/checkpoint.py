"""Checkpoints that make a killed run resumable with no transcript lost or written twice.

A checkpoint is a directory ``RUN/checkpoints/step_N/`` holding the policy's weights, the tokenizer,
and ``trainer_state.pt`` (sampler position, algorithm state such as STARE's controller, the step, the
weights' format, and under ``ranks`` one part per data-parallel rank: its RNG states and the byte
lengths of its own ``metrics.jsonl`` and ``transcripts.jsonl`` at that step). The weights:

- ``hf`` (``trainer.strategy: ddp``, one process): the policy in HF format (``model.safetensors``,
  ``config.json``), or with LoRA the adapter in peft's format (``adapter/``); the optimizer's state
  is in ``trainer_state.pt``. Rank 0 writes it all.
- ``dcp`` (``trainer.strategy: fsdp2``): ``dcp/``, a torch.distributed.checkpoint of the model's and
  the optimizer's shards (only the adapters with LoRA), each rank writing its own; ``config.json``
  for ``agentrl export``. DCP reshards on load, so a run may resume on another number of ranks.

Everything is written to a temporary directory that rank 0 renames once every rank's part is
written (``begin`` / ``commit``): the rename is the completion marker, so a kill at any point leaves
the previous checkpoint intact and no checkpoint some rank cannot resume from. On resume the JSONL
files are cut back to the recorded lengths: steps after the checkpoint are re-run and their lines
written once. With LoRA the state records the base model's identity and the adapter's settings; a
resume or export with another base or other settings is refused.
"""

from __future__ import annotations

import os
import random
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentrl.config import ConfigError
from agentrl.config.schema import LoraConfig

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


def saved_rank_state(state: dict[str, Any], rank: int, world: int) -> dict[str, Any] | None:
    """Rank ``rank``'s part of a checkpoint's state; None for a rank the saving run did not have (a
    resume on more ranks: that rank starts its RNG afresh and its own files over)."""
    parts = state.get("ranks") or [state]  # written before per-rank parts existed: one process
    return parts[rank] if rank < len(parts) else None


def begin(run_dir: Path, step: int, rank: int) -> Path:
    """The temporary directory every rank writes step ``step``'s checkpoint into (rank 0 clears a
    leftover of a killed save first; every rank waits for it)."""
    from agentrl.parallel import ranks

    tmp = run_dir / "checkpoints" / f".tmp_step_{step}"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    ranks.broadcast_from_rank0(None)
    return tmp


def commit(run_dir: Path, tmp: Path, step: int, tokenizer: Any, state: dict[str, Any], keep: int = 2) -> Path:
    """Rank 0, once every rank's weights are in ``tmp``: the tokenizer and ``trainer_state.pt``, then
    the atomic rename to ``checkpoints/step_{step}``, then all but the newest ``keep`` are dropped.
    ``state`` holds ``ranks``: every rank's ``rank_state``, in rank order."""
    root = run_dir / "checkpoints"
    final = root / f"step_{step}"
    tokenizer.save_pretrained(tmp)
    torch.save({**state, "step": step}, tmp / STATE_FILE)
    _fsync_tree(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    for old in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


# -- the weights ----------------------------------------------------------------------------------
DCP_DIR = "dcp"


def save_weights(out: Path, learner: Any, base_path: str) -> dict[str, Any]:
    """Every rank: the learner's weights (and a sharded optimizer) into ``out``; returns the record
    ``trainer_state.pt`` keeps under ``weights`` (format, LoRA settings, the base's identity)."""
    from agentrl.training import lora

    model: Any = learner.model
    lora_on = learner.settings.adapters
    record: dict[str, Any] = {
        "format": "dcp" if learner.strategy.equal_forwards else "hf",
        "lora": lora.settings_dict(learner.settings.model.lora) if lora_on else None,
        "base": lora.identity(base_path) if lora_on else None,
    }
    if record["format"] == "dcp":
        import torch.distributed.checkpoint as dcp

        dcp.save(_sharded_state(learner), checkpoint_id=str(out / DCP_DIR))
        if learner.rank == 0:
            base: Any = lora.base_model(model)
            base.config.save_pretrained(out)
    elif learner.rank == 0:
        if lora_on:
            lora.save_adapter(model, out / lora.ADAPTER_DIR, base_path)
        else:
            model.save_pretrained(out, safe_serialization=True)
    return record


def read_dcp(ckpt: Path, state: dict[str, Any], alone: bool | None = None) -> None:
    """Fill ``state`` in place from the checkpoint's DCP directory, resharded to this run's ranks, or
    whole in this process ``alone`` (by default: when there is no process group, as in a resume on one
    rank; an export reads alone whatever the process). One process is what is meant then, so DCP's
    warning that it assumed so is not shown."""
    import torch.distributed.checkpoint as dcp

    alone = not torch.distributed.is_initialized() if alone is None else alone
    with warnings.catch_warnings():
        if alone:
            warnings.filterwarnings("ignore", "torch.distributed is disabled, unavailable or uninitialized")
        dcp.load(state, checkpoint_id=str(ckpt / DCP_DIR), no_dist=alone)  # type: ignore[call-arg]


def load_weights(ckpt: Path, learner: Any, record: dict[str, Any]) -> None:
    """Every rank: ``save_weights``'s output back into a learner built like the saving one (the
    model from the base, or from ``ckpt`` itself for full HF weights). DCP reshards to this run's
    ranks."""
    from agentrl.training import lora

    if record["format"] == "dcp":
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state = _sharded_state(learner)
        read_dcp(ckpt, state)
        set_state_dict(
            learner.model,
            learner.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
            options=_dcp_options(learner),
        )
    elif record["lora"]:
        lora.load_adapter(learner.model, ckpt / lora.ADAPTER_DIR)


def _dcp_options(learner: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(ignore_frozen_params=learner.settings.adapters)  # LoRA: the adapters only


def _sharded_state(learner: Any) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(learner.model, learner.optimizer, options=_dcp_options(learner))
    return {"model": model_state, "optim": optim_state}


def weights_record(state: dict[str, Any]) -> dict[str, Any]:
    """The ``weights`` record of a checkpoint's state (older checkpoints: full HF weights)."""
    return state.get("weights") or {"format": "hf", "lora": None, "base": None}


def check_resumable(
    record: dict[str, Any], strategy: str, adapters: LoraConfig, ckpt: Path, base_path: str
) -> None:
    """A clear error when this run (``trainer.strategy``, ``model.lora``) cannot load ``ckpt``'s
    weights: another strategy's format, other LoRA settings, or an adapter trained on another base
    model."""
    from agentrl.training import lora

    fmt = "dcp" if strategy == "fsdp2" else "hf"
    if record["format"] != fmt:
        written = "fsdp2" if record["format"] == "dcp" else "ddp"
        raise ConfigError(
            f"{ckpt} was written with trainer.strategy={written} ({record['format']} weights) but this run "
            f"has trainer.strategy={strategy}: resume with trainer.strategy={written} (any "
            f"number of ranks), or `agentrl export` it and start a new run from the export"
        )
    now = lora.settings_dict(adapters) if lora.enabled(adapters) else None
    if record["lora"] != now:
        raise ConfigError(
            f"{ckpt} holds {'a LoRA adapter ' + str(record['lora']) if record['lora'] else 'full weights'} "
            f"but this run has model.lora={now}: resume with the settings it was written with"
        )
    if record["lora"]:
        lora.check_identity(record["base"], base_path, str(ckpt))


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
    """The checkpoint's ``trainer_state.pt``, after checking that its weights are there too; a
    damaged checkpoint is a ``ConfigError`` that names it and the one a resume could use instead."""
    # on the CPU: every rank reads rank 0's file; optimizer.load_state_dict moves each tensor to its
    # parameter's device
    try:
        state = torch.load(ckpt / STATE_FILE, weights_only=False, map_location="cpu")
        int(state["step"])  # a state without its step is not one of ours
    except Exception as e:
        raise _damaged(ckpt, f"{STATE_FILE} cannot be read: {type(e).__name__}: {e}") from e
    record = weights_record(state)
    weights = {
        "hf": [ckpt / "model.safetensors", ckpt / "model.safetensors.index.json"],
        "dcp": [ckpt / DCP_DIR],
    }[record["format"]]
    if record["lora"] and record["format"] == "hf":
        from agentrl.training.lora import ADAPTER_DIR

        weights = [ckpt / ADAPTER_DIR]
    if not any(p.exists() for p in weights):
        raise _damaged(ckpt, f"its weights are missing (no {' or '.join(p.name for p in weights)})")
    for f in sorted(ckpt.rglob("*.safetensors")):  # the model's files, or the adapter's
        if problem := safetensors_problem(f):
            raise _damaged(ckpt, f"{f.relative_to(ckpt)} {problem}")
    return state  # type: ignore[no-any-return]


def safetensors_problem(path: Path) -> str | None:
    """What is wrong with a safetensors file, from its header alone (cheap for any size): a header
    that cannot be read, or fewer bytes than the header's tensors need (a save cut short); None
    when it is whole."""
    import json
    import struct

    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > size - 8:
                return f"is cut short: its header says {n:,} bytes of header but the file has {size:,} in all"
            header = json.loads(f.read(n))
    except (struct.error, ValueError) as e:
        return f"has no readable header ({type(e).__name__}: {e})"
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end > size:
        return f"is cut short: its tensors need {8 + n + end:,} bytes but the file has {size:,}"
    return None


def _damaged(ckpt: Path, why: str) -> ConfigError:
    older = [p.name for p in list_checkpoints(ckpt.parent.parent) if p != ckpt]
    fallback = (
        f"move it out of checkpoints/ to resume from {older[-1]}"
        if older
        else "no older checkpoint is left: start the run anew (--overwrite)"
    )
    return ConfigError(f"checkpoint {ckpt} is damaged: {why}. To resume, {fallback}")


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


def _fsync_tree(path: Path) -> None:
    for f in sorted(path.rglob("*")):
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    _fsync_dir(path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


RUN_FILES = ("metrics.jsonl", "transcripts.jsonl", "checkpoints")
"""What makes a directory hold a run (a config.yaml alone does not: nothing was trained)."""


def existing_run(run_dir: Path) -> list[str]:
    """The run files in ``run_dir`` that hold something: a non-empty metrics or transcript file, or
    a complete checkpoint ([] for a new directory, or one that a start which failed before its
    first step left with empty files)."""
    run_dir = Path(run_dir)
    found = [n for n in RUN_FILES[:2] if (run_dir / n).is_file() and (run_dir / n).stat().st_size > 0]
    return found + (["checkpoints"] if list_checkpoints(run_dir) else [])


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
