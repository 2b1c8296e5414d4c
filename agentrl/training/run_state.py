"""A run's checkpoints from the trainer's side: writing one (every rank its part of the weights, rank 0
the state), finding the one to resume from, and restoring a trainer's parts from it (the files cut
back to it, weights pushed, RNG streams restored). The formats are ``checkpoint.py``'s."""

from __future__ import annotations

import contextlib
import errno
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from agentrl.engines.base import Engine
from agentrl.parallel import ranks
from agentrl.seeds import mix_seed, seed_everything
from agentrl.training.checkpoint import (
    begin,
    commit,
    latest_checkpoint,
    load_state,
    load_weights,
    rank_state,
    save_weights,
    saved_rank_state,
    set_rng_state,
    truncate_to,
    weights_record,
)
from agentrl.training.collect import Collector
from agentrl.training.weight_push import WeightPush


class DiskFull(RuntimeError):
    """A checkpoint or a step's records could not be written: the disk is full (``agentrl train``
    exits ``exit_code``)."""

    exit_code = 4


def disk_full(e: BaseException) -> bool:
    """Whether ``e`` (an ``OSError``, or safetensors' own error) says the device has no space left."""
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
        return True
    text = str(e)
    return "No space left on device" in text or "StorageFull" in text


def stopped_by_full_disk(root_dir: Path, writing: str, e: BaseException) -> DiskFull:
    """The ``DiskFull`` for a write into the run ``root_dir`` that found no space: what was being
    written, which checkpoint is the last complete one (resuming cuts the run's files back to it, so
    nothing is lost or written twice) and the command that continues the run."""
    last = latest_checkpoint(root_dir)
    kept = (
        f"the last complete checkpoint, {last.name}, is intact" if last else "no checkpoint was complete yet"
    )
    resume = f"agentrl train --resume {root_dir}" if last else "the same command again"
    return DiskFull(
        f"no space left on device while writing {writing} ({type(e).__name__}); {kept}: free space there "
        f"(or lower trainer.keep_checkpoints), then run {resume}"
    )


class RunState:
    """``keep_checkpoints``: ``trainer.keep_checkpoints``; ``seed``: ``run.seed``."""

    def __init__(
        self,
        keep_checkpoints: int,
        seed: int,
        root_dir: Path,
        run_dir: Path,
        rank: int,
        world: int,
        log: Callable,
    ) -> None:
        self.keep_checkpoints, self.seed, self.root_dir, self.run_dir = (
            keep_checkpoints,
            seed,
            root_dir,
            run_dir,
        )
        self.rank, self.world, self.log = rank, world, log

    def save(
        self, step: int, learner: Any, base_path: str, rollouts: Collector, engine: Engine, tokenizer: Any
    ) -> Path:
        """Every rank calls this. Each writes its part of the weights (all of them on rank 0 unless
        sharded) into one temporary directory; rank 0 adds the state (sampler, algorithm state, every
        rank's RNG states and JSONL lengths gathered) and renames it complete (``checkpoint.commit``).

        A full disk: the temporary directory is removed and ``DiskFull`` says which directory is
        full, which checkpoint is the last complete one and how to resume (nothing of it is lost: the
        run's files are cut back to that checkpoint on resume). Before writing, a warning when the
        disk has less room than the checkpoint is expected to take."""
        self._room_for(step, learner)
        try:
            return self._save(step, learner, base_path, rollouts, engine, tokenizer)
        except Exception as e:
            if not disk_full(e):
                raise
            shutil.rmtree(self.root_dir / "checkpoints" / f".tmp_step_{step}", ignore_errors=True)
            where = f"checkpoint step_{step} in {self.root_dir / 'checkpoints'}"
            raise stopped_by_full_disk(self.root_dir, where, e) from e

    @contextlib.contextmanager
    def writing(self, what: str) -> Iterator[None]:
        """Around a write of the run's records (metrics, transcripts): a full disk stops the run with
        ``DiskFull`` naming ``what``, the last complete checkpoint and the resume command."""
        try:
            yield
        except DiskFull:
            raise
        except Exception as e:
            if not disk_full(e):
                raise
            raise stopped_by_full_disk(self.root_dir, what, e) from e

    @contextlib.contextmanager
    def after_the_run(self, what: str, instead: str) -> Iterator[None]:
        """Around a write at the end of a run, after its last checkpoint and its every step's records
        are written (TensorBoard's last events, the plots): a full disk there is a warning naming
        ``what`` and ``instead`` (how to get it once there is space), not a failure of a complete run,
        which a resume could not repeat anyway (every step is trained)."""
        try:
            yield
        except Exception as e:
            if not disk_full(e):
                raise
            self.log(
                f"warning: no space left on device while writing {what} ({type(e).__name__}); the run is "
                f"complete (its last checkpoint and every step's records are written): {instead}"
            )

    def _room_for(self, step: int, learner: Any) -> None:
        """Warn when the checkpoint's expected size (weights, or LoRA's adapters, and AdamW's two
        moments) exceeds the free space of the run's disk."""
        if self.rank:  # rank 0 checks for every rank (their parts land in the same directory)
            return
        params = list(learner.model.parameters())  # a sharded parameter counts whole
        trainable = sum(p.numel() for p in params if p.requires_grad)
        lora = learner.settings.adapters
        weights = trainable * 4 if lora else sum(p.numel() * p.element_size() for p in params)
        need = weights + 2 * trainable * 4
        free = shutil.disk_usage(self.root_dir).free
        if free < need:
            self.log(
                f"warning: checkpoint step_{step} needs about {need / 2**30:.2f} GiB, and {self.root_dir} has "
                f"{free / 2**30:.2f} GiB free: the save will fail; free space or lower trainer.keep_checkpoints"
            )

    def _save(
        self, step: int, learner: Any, base_path: str, rollouts: Collector, engine: Engine, tokenizer: Any
    ) -> Path:
        parts = ranks.gather_to_rank0(rank_state(self.run_dir))
        tmp = begin(self.root_dir, step, self.rank)
        record = save_weights(tmp, learner, base_path)
        if self.rank:
            return self.root_dir / "checkpoints" / f"step_{step}"
        state = {
            **learner.state_dict(),  # the weighting's state (and the optimizer's, unless sharded)
            **rollouts.state(),  # the sampler's position, async mode's pending batches
            "engine_version": int(engine.version),
            "ranks": parts,
            "weights": record,
        }
        return commit(self.root_dir, tmp, step, tokenizer, state, keep=self.keep_checkpoints)

    def resume_point(self) -> tuple[Path | None, dict[str, Any] | None]:
        """Rank 0's newest complete checkpoint and its state: rank 0 picks it for every rank. Without
        one the run starts over: lines a killed first attempt wrote before any checkpoint are cut, so
        no step is written twice."""
        ckpt = ranks.broadcast_from_rank0(latest_checkpoint(self.root_dir) if self.rank == 0 else None)
        if ckpt is None:
            cut = sum(truncate_to(self.run_dir / f, 0) for f in ("metrics.jsonl", "transcripts.jsonl"))
            if cut:
                self.log(
                    f"no checkpoint in {self.root_dir}: starting over (dropped {cut} bytes written before one)"
                )
            return None, None
        return ckpt, load_state(ckpt)  # every rank reads rank 0's directory (one node or a shared filesystem)

    def restore(
        self, ckpt: Path, state: dict[str, Any], learner: Any, rollouts: Collector, weights: WeightPush
    ) -> int:
        """Load the checkpoint into the trainer's parts; returns the step to start from."""
        start_step = int(state["step"])
        load_weights(ckpt, learner, weights_record(state))  # DCP reshards to this run's ranks
        learner.load_state_dict(state)
        rollouts.load_state(state)
        weights.push()
        while int(weights.engine.version) < state["engine_version"]:
            weights.engine.load_weights({})  # keep version numbers continuous
        own = saved_rank_state(state, self.rank, self.world)  # this rank's RNG and file lengths
        if own is None:  # a resume on more ranks than saved it: this rank starts its streams afresh
            own = {"metrics_bytes": 0, "transcripts_bytes": 0, "rng": None}
            seed_everything(mix_seed(self.seed, start_step, 1000 + self.rank))
        cut_m = truncate_to(self.run_dir / "metrics.jsonl", own["metrics_bytes"])
        cut_t = truncate_to(self.run_dir / "transcripts.jsonl", own["transcripts_bytes"])
        if own["rng"] is not None:
            set_rng_state(own["rng"])
        saved_world = len(state.get("ranks") or [state])
        if self.rank == 0:  # ranks this run no longer has: their files end at the checkpoint too
            for r, part in enumerate(state.get("ranks") or []):
                if r >= self.world:
                    gone = self.root_dir / "ranks" / str(r)
                    truncate_to(gone / "metrics.jsonl", part["metrics_bytes"])
                    truncate_to(gone / "transcripts.jsonl", part["transcripts_bytes"])
        self.log(
            f"resumed from {ckpt} (the state after steps 0-{start_step - 1}) at step {start_step}"
            + (
                f" (dropped {cut_m} + {cut_t} bytes of metrics/transcripts written after it)"
                if cut_m or cut_t
                else ""
            )
            + (
                f"; written by {saved_world} rank(s), resumed on {self.world}: weights and optimizer "
                "resharded, ranks without a saved part start fresh RNG streams"
                if saved_world != self.world
                else ""
            )
        )
        return start_step
