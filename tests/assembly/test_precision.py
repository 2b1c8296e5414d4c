"""``trainer.bf16: auto`` (assembly/precision.py): bf16 only where the device has it, the importance
correction is on, the model is large enough, its products measure faster and the log-prob gap fits
``rollout.sync.probe_atol``; each refusal says which rule; the saved config keeps ``auto``."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from agentrl.assembly import precision
from agentrl.cli import main
from agentrl.config import load_config
from agentrl.engines import probe_cache
from tests.helpers.configs import small_config
from tests.helpers.llama import small_llama

CPU = torch.device("cpu")
AMX = {"avx512f", "amx_bf16"}


@pytest.fixture(scope="module")
def wide_model_dir(tmp_path_factory, tiny_tokenizer):
    """A one-layer Llama of hidden 320 (above the small-model bound) with the tiny tokenizer."""
    out = tmp_path_factory.mktemp("wide")
    small_llama(
        len(tiny_tokenizer), 320, 640, heads=5, pad_token_id=tiny_tokenizer.pad_token_id
    ).save_pretrained(out)
    tiny_tokenizer.save_pretrained(out)
    return out


def cfg_of(model_dir, *extra):
    return load_config(None, [f"model.path={model_dir}", "run.device=cpu", *extra])


def keep(tmp_path, name, key, value):
    """Write a kept measurement for this machine, as ``probe_cache.measured`` would."""
    path = tmp_path / "probes" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    entries = json.loads(path.read_text()) if path.exists() else {}
    entries[f"{probe_cache.machine_key()} | {key}"] = {**value, "measured": "2026-12-04"}
    path.write_text(json.dumps(entries))


def test_the_refusals_without_measuring_come_first_and_say_why(tiny_model_dir, wide_model_dir):
    tis = "algorithm.is_correction=tis"
    no_bf16 = precision.choose(cfg_of(wide_model_dir, tis), CPU, flags={"avx2"})
    assert not no_bf16.on and "no bf16 instructions" in no_bf16.why
    no_tis = precision.choose(cfg_of(wide_model_dir), CPU, flags=AMX)
    assert not no_tis.on and "algorithm.is_correction=none" in no_tis.why and "set it to tis" in no_tis.why
    small = precision.choose(cfg_of(tiny_model_dir, tis), CPU, flags=AMX)
    assert not small.on and "a small model (hidden 128 <= 256)" in small.why


def test_speed_and_gap_decide_from_kept_measurements(tmp_path, monkeypatch, wide_model_dir):
    """A kept 2x speed-up and a gap of 0.02 take bf16; a 1.1x speed-up, or a gap past probe_atol,
    keep float32, each with the numbers in the reason."""
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))
    from agentrl.training.lora import identity

    products = f"rows {precision.PROBE_ROWS} hidden 320 inter 640"
    gap = f"bf16 gap {identity(str(wide_model_dir))['fingerprint']} on cpu"
    cfg = cfg_of(wide_model_dir, "algorithm.is_correction=tis")
    keep(tmp_path, "bf16_products", products, {"fp32_s": 0.2, "bf16_s": 0.1})
    keep(tmp_path, "bf16_gap", gap, {"max": 0.02})
    on = precision.choose(cfg, CPU, flags=AMX)
    assert on.on and "2.00x faster in bf16, measured 2026-12-04, kept in" in on.why
    assert "gap to float32 on the model 0.020 (rollout.sync.probe_atol 0.5)" in on.why
    tight = precision.choose(
        cfg_of(wide_model_dir, "algorithm.is_correction=tis", "rollout.sync.probe_atol=0.01"), CPU, flags=AMX
    )
    assert not tight.on and "0.020 (rollout.sync.probe_atol 0.01): outside it" in tight.why
    keep(tmp_path, "bf16_products", products, {"fp32_s": 0.11, "bf16_s": 0.1})
    slow = precision.choose(cfg, CPU, flags=AMX)
    assert not slow.on and "1.10x faster in bf16" in slow.why and "below 1.3x" in slow.why


def test_measured_for_real_the_gap_is_small_and_kept(tmp_path, monkeypatch, wide_model_dir):
    """The gap and the products measured on this machine (no kept values): a random model's bf16
    log-probs stay within a few hundredths of float32's, and both measurements are kept."""
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))
    gap = precision.logprob_gap(str(wide_model_dir), CPU)
    assert 0 < gap < 0.5
    times, where = precision.product_times(320, 640, rows=256)
    assert times["fp32_s"] > 0 and times["bf16_s"] > 0 and where == "measured now"
    assert precision.product_times(320, 640, rows=256)[1].startswith("measured ")
    assert (tmp_path / "probes" / "bf16_products.json").is_file()


def test_a_run_says_its_choice_and_keeps_auto_in_its_config(tmp_path, tiny_model_dir, capsys):
    cfg = small_config(tmp_path, tiny_model_dir, "trainer.total_steps=1")
    assert cfg.trainer.bf16 == "auto"  # the default
    args = [f"{k}={v}" for k, v in (("model.path", tiny_model_dir), ("run.output_dir", tmp_path / "run"))]
    common = [
        "env.name=test_chatter",
        "run.device=cpu",
        "rollout.prompts_per_step=2",
        "rollout.group_size=4",
        "rollout.max_tokens_per_turn=8",
        "rollout.max_episode_tokens=64",
        "trainer.total_steps=1",
    ]
    assert main(["train", *args, *common]) == 0
    out = capsys.readouterr().out
    assert "trainer.bf16: auto -> float32 (" in out
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["trainer"]["bf16"] == "auto"


def test_an_undecided_auto_is_an_error_where_compute_reads_it():
    cfg = load_config(None, [])
    with pytest.raises(RuntimeError, match=r"trainer\.bf16=auto reached the trainer undecided"):
        _ = cfg.trainer.computes_bf16
    with pytest.raises(Exception, match=r"trainer\.bf16"):
        load_config(None, ["trainer.bf16=maybe"])
