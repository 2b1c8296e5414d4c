"""Measurements that choose a default are taken once per machine and kept (engines/probe_cache.py),
and ``rollout.cpu_gemm: auto`` reads them from there on the next start."""

from __future__ import annotations

import json

import torch

from agentrl.engines import cpu_gemm, probe_cache
from tests.helpers.llama import small_llama


def test_a_measurement_is_taken_once_and_kept_per_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))
    calls = []

    def measure():
        calls.append(1)
        return {"x": 1.5}

    first, where = probe_cache.measured("demo", "k1", measure)
    assert calls == [1] and where is None and first["x"] == 1.5 and first["measured"]
    again, where = probe_cache.measured("demo", "k1", measure)
    assert calls == [1] and again == first and where == tmp_path / "probes" / "demo.json"
    probe_cache.measured("demo", "k2", measure)  # another key: measured too
    assert calls == [1, 1]
    entries = json.loads((tmp_path / "probes" / "demo.json").read_text())
    assert len(entries) == 2
    key = next(iter(entries))
    assert f"torch {torch.__version__}" in key and f"{torch.get_num_threads()} threads" in key
    assert probe_cache.cpu_model() in key


def test_a_broken_cache_is_measured_around(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))
    (tmp_path / "probes").mkdir()
    (tmp_path / "probes" / "demo.json").write_text("{not json")
    value, where = probe_cache.measured("demo", "k", lambda: {"x": 2})
    assert value["x"] == 2 and where is None
    assert json.loads((tmp_path / "probes" / "demo.json").read_text())  # rewritten whole


def test_auto_reads_its_choice_from_the_cache_and_says_so(tmp_path, monkeypatch):
    """A kept measurement decides the next start without measuring again: a faked 3x for oneDNN
    picks it, a faked 1.2x keeps MKL, and the reason names the times and the file."""
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))
    model = small_llama(64, 64, 32, heads=2)
    shapes = cpu_gemm.layer_shapes(model)
    assert shapes is not None
    for mkl_s, pick in ((3e-3, "onednn"), (1.2e-3, "mkl")):
        cpu_gemm.timed.cache_clear()
        key = f"{probe_cache.machine_key()} | cpu_gemm rows {cpu_gemm.MEASURED_ROWS} shapes {list(shapes)}"
        entry = {"mkl_s": mkl_s, "onednn_s": 1e-3, "measured": "2026-12-04"}
        (tmp_path / "probes").mkdir(exist_ok=True)
        (tmp_path / "probes" / "cpu_gemm.json").write_text(json.dumps({key: entry}))
        got = cpu_gemm.resolve("auto", model, torch.device("cpu"))
        if cpu_gemm.onednn_ops() is None:  # a torch build without oneDNN: MKL, and why
            assert got.library == "mkl" and "no oneDNN" in got.why
            continue
        assert got.library == pick
        assert f"{mkl_s * 1e3:.2f} ms through MKL and 1.00 ms through oneDNN" in got.why
        assert "measured 2026-12-04, kept in" in got.why and "cpu_gemm.json" in got.why
    cpu_gemm.timed.cache_clear()
