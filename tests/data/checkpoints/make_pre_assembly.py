"""Writes ``pre_assembly/``: a LoRA run of one step with STARE, checkpointed by the code from before
the assembly floor existed (commit c6743ac), so tests/training/test_resume.py can show that a
checkpoint written before the move resumes after it. LoRA keeps the fixture small: the checkpoint
holds the adapters and their optimizer state; its base is the tiny model the tests build (seed 0),
whose path the resume passes as ``model.path``.

Run from a checkout of c6743ac (``git worktree add /tmp/old c6743ac``):
    cd /tmp/old && PYTHONPATH=$PWD python PATH/TO/make_pre_assembly.py OUT
then copy OUT/run to tests/data/checkpoints/pre_assembly/."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from agentrl.models import build_tiny_model, train_tokenizer
from agentrl.training.trainer import Trainer
from tests.helpers.configs import small_config

OVERRIDES = (
    "model.lora.rank=2",
    "model.lora.target_modules=[q_proj,v_proj]",
    "algorithm.name=stare",
    "trainer.total_steps=1",
    "trainer.checkpoint_every=1",
    "logging.transcripts=false",
    "run.seed=3",
)

if __name__ == "__main__":
    out = Path(sys.argv[1])
    base = build_tiny_model(
        out / "base" / "h128-L2", "h128-L8", num_layers=2, tokenizer=train_tokenizer(), seed=0
    )
    Trainer(small_config(out, base, *OVERRIDES), log=print).train()
    shutil.rmtree(out / "base")
    for p in sorted((out / "run").rglob("*")):
        print(p.relative_to(out), p.stat().st_size if p.is_file() else "")
