"""An engine registered in this file, outside agentrl/: one record makes it a ``rollout.engine`` the
config accepts, ``components`` builds it from the config through ``make_engine``, and it runs the
run's episodes; placement names it by its label, and the preflight asks its install check. A taken
name is refused, a wrong one is told the registered names."""

from __future__ import annotations

import pytest

from agentrl.assembly import components
from agentrl.config import ConfigError, load_config
from agentrl.config.schema import RolloutConfig
from agentrl.dataclass_tree import fields_by_name
from agentrl.engines.factory import EngineSpec, make_engine, weight_dtype
from agentrl.engines.registry import ENGINES, EngineRecord, engine_record, register_engine
from agentrl.engines.scripted import ScriptedEngine
from agentrl.rollout.runner import EpisodeRequest
from tests.helpers.configs import small_config

BUILT: list[tuple[EngineSpec, object]] = []
"""Every (spec, model) the recording engine was built from."""


def build_recording(spec: EngineSpec, tokenizer, model) -> ScriptedEngine:
    """The recording engine: answers every prompt with the same reply, and records what it was built from."""
    BUILT.append((spec, model))
    return ScriptedEngine(lambda prompt, i: f"reply {i}<|im_end|>", tokenizer=tokenizer)


RECORD = EngineRecord("recording", build_recording, label="Recording", cpu_dtype="float32")


@pytest.fixture
def recording():
    BUILT.clear()
    register_engine(RECORD)
    yield RECORD
    del ENGINES[RECORD.name]


def test_a_registered_engine_runs_the_configs_episodes(recording, tmp_path, tiny_model_dir, tiny_tokenizer):
    cfg = small_config(tmp_path, tiny_model_dir, "rollout.engine=recording", "run.seed=3")
    engine = components.local_engine(cfg, None, tiny_tokenizer, str(tiny_model_dir))
    ((spec, model),) = BUILT
    assert (spec.name, spec.model_path, spec.seed, spec.device, model) == (
        "recording",
        str(tiny_model_dir),
        3,
        "cpu",
        None,
    )
    assert spec.max_model_len == cfg.rollout.max_episode_tokens == 64
    tasks = components.load_tasks(cfg, "train")[:2]
    runner = components.local_runner(cfg, engine, tiny_tokenizer, seed=0)
    try:
        episodes = runner.run([EpisodeRequest(t, seed=0, group=t.id) for t in tasks])
    finally:
        runner.close()
    # test_chatter: one turn, the reply is the answer; the engine served the two prompts in order
    assert [[m["content"] for m in e.messages if m["role"] == "assistant"] for e in episodes] == [
        ["reply 0"],
        ["reply 1"],
    ]
    assert [e.failure for e in episodes] == [None, None]
    assert len(engine.calls) == 2


def test_placement_and_the_weight_dtype_ask_the_record(recording, tmp_path, tiny_model_dir):
    cfg = small_config(tmp_path, tiny_model_dir, "rollout.engine=recording", "model.dtype=bfloat16")
    where = components.placement(cfg)
    assert [e.kind for e in where.engines] == ["Recording"]
    assert where.engines[0].name == "Recording engine 0"
    # the record fixes float32 on the CPU (cpu_dtype) over model.dtype, as vLLM's does; HF takes it
    assert str(components.engine_dtype(cfg)) == "torch.float32"
    hf = EngineSpec("hf", "unused", dtype="bfloat16")
    assert str(weight_dtype(hf)) == "torch.bfloat16"


def test_the_preflight_asks_the_records_install_check(tmp_path, tiny_model_dir):
    """An engine's missing package is named by its record's ``install_check``, not by its name."""
    from agentrl.assembly.preflight import setting_problems

    missing = EngineRecord(
        "missing", build_recording, label="Missing", install_check=lambda: "no pkg: pip install pkg"
    )
    register_engine(missing)
    try:
        cfg = small_config(tmp_path, tiny_model_dir, "rollout.engine=missing")
        assert "rollout.engine=missing: no pkg: pip install pkg" in list(setting_problems(cfg))
    finally:
        del ENGINES[missing.name]
    hf = small_config(tmp_path, tiny_model_dir, "rollout.engine=hf")  # no install_check: nothing asked
    assert not [p for p in setting_problems(hf) if p.startswith("rollout.engine=")]


def test_the_configs_choices_list_the_registered_engines(recording):
    choices = fields_by_name(RolloutConfig)["engine"].metadata["choices"]()
    assert set(choices) == {"hf", "vllm", "recording"}
    assert load_config(None, ["rollout.engine=recording"]).rollout.engine == "recording"


def test_a_wrong_name_is_told_the_registered_engines(recording):
    with pytest.raises(ConfigError, match=r"rollout\.engine='mlx'.*Valid: hf, recording, vllm"):
        load_config(None, ["rollout.engine=mlx"])
    with pytest.raises(
        ValueError, match=r"unknown engine 'mlx' \(rollout.engine\); registered: hf, recording, vllm"
    ):
        make_engine(EngineSpec("mlx", "unused"))
    with pytest.raises(ValueError, match="registered: hf, recording, vllm"):
        engine_record("mlx")


def test_a_taken_name_is_refused(recording):
    register_engine(RECORD)  # the same record again (a module imported twice) is no conflict
    with pytest.raises(ValueError, match="an engine named 'recording' is already registered"):
        register_engine(EngineRecord("recording", build_recording, label="Other"))
    with pytest.raises(ValueError, match="an engine named 'hf' is already registered"):
        register_engine(EngineRecord("hf", build_recording, label="HF"))
    assert ENGINES["recording"] is RECORD and ENGINES["hf"].builder == "agentrl.engines.factory:build_hf"


def test_the_engines_settings_section_reaches_its_builder(tmp_path, tiny_model_dir):
    cfg = small_config(tmp_path, tiny_model_dir, "rollout.engine=vllm", "rollout.vllm.kv_cache_space_gib=2.5")
    spec = components.engine_spec(cfg, "some/model")
    assert spec.options["kv_cache_space_gib"] == 2.5 and spec.options["tensor_parallel_size"] == 1
    assert components.engine_spec(small_config(tmp_path, tiny_model_dir), "p").options == {}
