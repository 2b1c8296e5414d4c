"""The decode path of a model above the lean step's small-model bound, measured on this machine
(engines/decode_probe.py): the rule on kept times, a real measurement kept, and the engine's choice
following it."""

from __future__ import annotations

import json

import pytest

from agentrl.engines import decode_probe, probe_cache
from agentrl.engines.hf import HFEngine
from tests.helpers.llama import small_llama


@pytest.fixture(scope="module")
def wide(tiny_tokenizer):
    return small_llama(len(tiny_tokenizer), 320, 64, heads=5)


def keep(tmp_path, model, times):
    cfg = model.config
    from agentrl.engines.cpu_gemm import layer_shapes

    key = f"decode rows {decode_probe.ROWS} layers {cfg.num_hidden_layers} vocab {cfg.vocab_size} shapes {list(layer_shapes(model))}"
    path = tmp_path / "probes" / "decode_path.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({f"{probe_cache.machine_key()} | {key}": {**times, "measured": "2026-12-04"}}))


@pytest.mark.parametrize(
    "lean,transformers,pack,pick",
    [(0.0785, 0.0881, 1.34, True), (0.090, 0.092, 0.0, False), (0.080, 0.0879, 0.4, False)],
    ids=["1.12x-despite-its-packing", "1.02x", "1.099x"],
)
def test_the_rule_on_kept_times(tmp_path, monkeypatch, wide, lean, transformers, pack, pick):
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))
    keep(tmp_path, wide, {"lean_s": lean, "transformers_s": transformers, "pack_s": pack})
    faster, why = decode_probe.lean_is_faster(wide)
    assert faster is pick
    assert f"{lean * 1e3:.1f} ms lean and {transformers * 1e3:.1f} ms through transformers" in why
    assert "measured 2026-12-04, kept in" in why
    engine = HFEngine(wide, cpu_gemm="mkl")
    assert engine.decode_path == ("lean" if pick else "transformers")
    assert "decode path auto: a decode step at 32 rows" in engine.cpu_gemm_why


def test_a_real_measurement_is_kept(tmp_path, monkeypatch, wide):
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))
    monkeypatch.setattr(decode_probe, "ROWS", 4)
    times = decode_probe.step_times(wide, rows=4, steps=2)
    assert all(times[k] > 0 for k in ("lean_s", "transformers_s", "pack_s"))
    _, why = decode_probe.lean_is_faster(wide)
    assert why.endswith("measured now")
    _, again = decode_probe.lean_is_faster(wide)
    assert "kept in" in again and (tmp_path / "probes" / "decode_path.json").is_file()
