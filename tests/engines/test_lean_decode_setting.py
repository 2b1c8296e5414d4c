"""``rollout.lean_decode``: auto, true and false reach the HF engine; true for a model the lean step
does not reproduce is an error, and the key set for an engine with its own decode step is refused."""

from __future__ import annotations

import pytest

from agentrl.assembly import components
from agentrl.config import ConfigError, load_config
from agentrl.engines.factory import EngineSpec, build_hf
from agentrl.models import load_policy
from tests.helpers.configs import small_config


@pytest.mark.parametrize("setting,path", [("true", "lean"), ("false", "transformers"), ("auto", "lean")])
def test_the_setting_reaches_the_engine(tmp_path, tiny_model_dir, setting, path):
    cfg = small_config(tmp_path, tiny_model_dir, f"rollout.lean_decode={setting}")
    model, tok = load_policy(tiny_model_dir)
    engine = components.local_engine(cfg, model, tok, str(tiny_model_dir))
    assert engine.decode_path == path  # type: ignore[attr-defined]  # auto: a small model takes the lean step


def test_true_for_a_model_the_lean_step_does_not_reproduce_is_an_error(tiny_tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tiny_tokenizer), n_embd=32, n_layer=1, n_head=2))
    spec = EngineSpec(name="hf", model_path="unused", dtype="float32", lean_decode=True)
    with pytest.raises(
        ValueError,
        match=r"rollout\.lean_decode=true: the lean decode step does not reproduce GPT2LMHeadModel",
    ):
        build_hf(spec, tiny_tokenizer, gpt2)
    spec = EngineSpec(name="hf", model_path="unused", dtype="float32", lean_decode=None)
    assert build_hf(spec, tiny_tokenizer, gpt2).decode_path == "transformers"


def test_set_for_an_engine_with_its_own_decode_step_it_is_refused():
    with pytest.raises(ConfigError, match=r"rollout\.lean_decode=false chooses the HF engine's decode step"):
        load_config(None, ["rollout.engine=vllm", "rollout.lean_decode=false"])
