"""A token weighting defined and registered in this test file, outside agentrl/: one record makes it a
method the config accepts (with its own settings section), the trainer runs, and a resume restores."""

from __future__ import annotations

import json
import sys
import types
from dataclasses import asdict, dataclass
from typing import Any

import pytest
import torch

from agentrl.algorithms import (
    METHODS,
    WEIGHTINGS,
    StepContext,
    TokenWeighting,
    TokenWeights,
    WeightingInputs,
    masked_mean,
    register_weighting,
)
from agentrl.assembly import make_trainer
from agentrl.config import ConfigError, load_config
from agentrl.dataclass_tree import knob
from agentrl.episode import Episode
from tests.helpers import ROOT
from tests.helpers.configs import small_config
from tests.helpers.jsonl import lines
from tests.helpers.user_files import one_turn_env


@dataclass
class SurprisalTiltSettings:
    alpha: float = knob(0.5, gt=0, le=1)
    """How far the weight moves with the token's surprisal above the batch mean."""


@dataclass
class TiltState:
    steps: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> TiltState:
        return TiltState(**d)


def surprisal_tilt_weights(inputs: WeightingInputs, *, alpha: float, state: TiltState | None) -> TokenWeights:
    """ω = 1 + α·tanh(s - mean s) on policy tokens: more weight on surprising tokens."""
    s = -inputs.logp_old
    w = 1.0 + alpha * torch.tanh(s - masked_mean(s, inputs.mask))
    weights = torch.where(inputs.mask, w, torch.ones_like(w))
    new = TiltState((state.steps if state else 0) + 1)
    return TokenWeights(
        weights, inputs.mask, stats={"mean_weight": float(masked_mean(weights, inputs.mask))}, state=new
    )


def tilt_arguments(s: SurprisalTiltSettings, step: StepContext) -> dict[str, Any]:
    return {"alpha": s.alpha, "state": step.state}


register_weighting(
    TokenWeighting(
        "surprisal_tilt",
        surprisal_tilt_weights,
        settings=SurprisalTiltSettings,
        arguments=tilt_arguments,
        state=TiltState,
    )
)


def test_the_record_makes_a_method_with_a_settings_section():
    assert METHODS["surprisal_tilt"].weighting == "surprisal_tilt" and "surprisal_tilt" in WEIGHTINGS
    cfg = load_config(None, ["algorithm.name=surprisal_tilt", "algorithm.surprisal_tilt.alpha=0.25"])
    assert cfg.algorithm.surprisal_tilt.alpha == 0.25
    assert cfg.algorithm.loss_agg == "token-mean"  # the GRPO-ds preset, by default
    with pytest.raises(ConfigError, match=r"algorithm\.surprisal_tilt\.alpha must be in \(0, 1\]"):
        load_config(None, ["algorithm.surprisal_tilt.alpha=2"])
    with pytest.raises(ConfigError, match=r"did you mean 'algorithm\.surprisal_tilt\.alpha'"):
        load_config(None, ["algorithm.surprisal_tilt.alpah=0.1"])
    with pytest.raises(ValueError, match="already registered"):
        register_weighting(TokenWeighting("surprisal_tilt", lambda inputs: None))  # type: ignore[arg-type,return-value]


def test_it_trains_two_steps_and_resumes_its_state(tmp_path, tiny_model_dir):
    extra = (
        "algorithm.name=surprisal_tilt",
        "algorithm.surprisal_tilt.alpha=0.8",
        "trainer.checkpoint_every=1",
    )
    trainer = make_trainer(small_config(tmp_path, tiny_model_dir, *extra), log=lambda *_: None)
    history = trainer.train()
    assert len(history) == 2 and all("update/skipped" not in h for h in history)
    assert [h["surprisal_tilt/mean_weight"] for h in history] != [1.0, 1.0]
    assert trainer.learner.weighting_state == TiltState(2)
    episodes = [Episode.from_json(x) for x in lines(tmp_path / "run" / "transcripts.jsonl")]
    weights = [w for e in episodes if e.overlays for w in e.overlays["weight"] if w is not None]
    assert len({round(w, 3) for w in weights}) > 10  # the method's weights reached the loss
    # a resumed run gets the state back from the checkpoint, through the record's state class
    resumed = make_trainer(
        small_config(tmp_path, tiny_model_dir, *extra, "run.resume=true", "trainer.total_steps=3"),
        log=lambda *_: None,
    )
    assert resumed.start_step == 2 and resumed.learner.weighting_state == TiltState(2)
    resumed.train()
    assert resumed.learner.weighting_state == TiltState(3)
    saved = torch.load(tmp_path / "run" / "checkpoints" / "step_3" / "trainer_state.pt", weights_only=False)
    assert json.dumps(saved["weighting_state"]) == json.dumps({"steps": 3})


def test_the_docs_example_runs_as_written():
    """docs/algorithms.md, "Adding a method": its code block, executed as written, makes a method."""

    from agentrl.algorithms import compute_weights

    text = (ROOT / "docs" / "algorithms.md").read_text()
    section = text[text.index("### Adding a method") :]
    code = section[
        section.index("```python") + len("```python") : section.index("```\n", section.index("```python") + 9)
    ]
    module = types.ModuleType("docs_algorithms_example")  # a module of its own, as a user's file is
    sys.modules[module.__name__] = module
    exec(compile(code, "docs/algorithms.md", "exec"), module.__dict__)
    cfg = load_config(None, ["algorithm.name=tilt", "algorithm.tilt.alpha=0.3"])
    record = WEIGHTINGS["tilt"]
    logp = torch.log(torch.tensor([[0.9, 0.1, 0.5]]))
    inputs = WeightingInputs.build(logp, torch.ones(1, 3), torch.tensor([1.0]), torch.ones(1, 3))
    tw = compute_weights("tilt", inputs, **record.kwargs(cfg.algorithm.tilt, None))  # type: ignore[arg-type]
    assert tw.weights[0, 1] > 1 > tw.weights[0, 0]  # the surprising token gets more weight


USER_FILE = (
    one_turn_env("echo_from_user_file")
    + """

import torch
from agentrl.algorithms import TokenWeighting, TokenWeights, register_weighting


def halve(inputs):
    "ω = 0.5 everywhere."
    return TokenWeights(torch.full_like(inputs.logp_old, 0.5), inputs.mask)


register_weighting(TokenWeighting("halve_from_user_file", halve))
"""
)


def test_a_method_registered_in_the_env_module_is_a_valid_name(tmp_path):
    """``env.module`` is imported before the keys are checked, so a method it registers is known to
    ``algorithm.name`` on the command line (the CLI and the study's subprocesses load configs so)."""
    path = tmp_path / "user_env.py"
    path.write_text(USER_FILE)
    cfg = load_config(None, [f"env.module={path}", "env.name=echo_from_user_file",
                             "algorithm.name=halve_from_user_file"])  # fmt: skip
    assert cfg.algorithm.name == "halve_from_user_file" and cfg.algorithm.loss_agg == "token-mean"


def test_a_saved_config_loads_where_other_methods_are_not_registered(tmp_path):
    """config.yaml keeps the selected method's settings only: a method some module registered in the
    saving process (here, this file's) must not make the run unloadable elsewhere."""
    import subprocess

    from agentrl.config import save_config

    save_config(load_config(None, ["algorithm.name=stare", "algorithm.stare.W=2.0"]), tmp_path / "a")
    text = (tmp_path / "a" / "config.yaml").read_text()
    assert "surprisal_tilt" not in text and "steer:" not in text and "W: 2.0" in text
    done = subprocess.run([sys.executable, "-c", f"from agentrl.config import load_config; load_config({str(tmp_path / 'a')!r})"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    save_config(load_config(None, ["algorithm.name=surprisal_tilt"]), tmp_path / "b")
    assert "surprisal_tilt:\n    alpha: 0.5" in (tmp_path / "b" / "config.yaml").read_text()
