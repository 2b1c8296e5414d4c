"""The fast tier's time check (tests/helpers/durations.py) fails a session whose fast test ran too long."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.durations import REFERENCE_CALIBRATION_S, calibrate, scaled_limit

ROOT = Path(__file__).resolve().parents[1]

SLOW_AND_FAST = """
import time
import pytest

def test_quick():
    pass

def test_heavy():
    time.sleep(1.0)

@pytest.mark.slow
def test_heavy_but_slow_tier():
    time.sleep(1.0)

@pytest.mark.vllm
def test_heavy_in_the_vllm_tier():
    time.sleep(1.0)
"""


def run_pytest(
    tmp_path: Path, limit_s: float, *selected: str, calibration_s: float = REFERENCE_CALIBRATION_S
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_timed.py").write_text(SLOW_AND_FAST)
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nmarkers =\n    slow: a slow test\n    vllm: the vLLM tier\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "AGENTRL_FAST_TEST_LIMIT_S": str(limit_s),
        "AGENTRL_TEST_CALIBRATION_S": str(calibration_s),
        "AGENTRL_TEST_DURATIONS": str(tmp_path / "durations.json"),
    }
    cmd = [sys.executable, "-m", "pytest", "-p", "tests.helpers.durations", "-p", "no:cacheprovider"]
    cmd += ["-c", str(tmp_path / "pytest.ini"), "-q", *[f"{tmp_path}/test_timed.py::{t}" for t in selected]]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_a_fast_tier_test_over_the_limit_fails_the_session_and_is_named(tmp_path):
    proc = run_pytest(
        tmp_path, 0.5, "test_quick", "test_heavy", "test_heavy_but_slow_tier", "test_heavy_in_the_vllm_tier"
    )
    assert proc.returncode == 1, proc.stdout
    assert "4 passed" in proc.stdout, proc.stdout  # every test passed: the limit alone failed it
    assert "fast-tier tests over 0.5 s" in proc.stdout and "test_timed.py::test_heavy:" in proc.stdout
    assert "test_heavy_but_slow_tier:" not in proc.stdout  # the slow tier has no limit
    assert "test_heavy_in_the_vllm_tier:" not in proc.stdout  # nor the vLLM tier
    rows = json.loads((tmp_path / "durations.json").read_text())
    heavy = next(v for k, v in rows.items() if k.endswith("::test_heavy"))
    assert heavy["call"] >= 1.0 and heavy["fast_tier"] is True


def test_within_the_limit_or_in_the_slow_tier_the_session_passes(tmp_path):
    proc = run_pytest(tmp_path, 0.5, "test_quick", "test_heavy_but_slow_tier", "test_heavy_in_the_vllm_tier")
    assert proc.returncode == 0, proc.stdout
    assert "fast-tier tests over" not in proc.stdout


def test_on_a_slower_machine_the_limit_grows_by_its_calibration(tmp_path):
    """A machine whose calibration takes 3 times the reference's gives a fast test 3 times the limit:
    the 1 s test passes under 0.5 s x 3 and the summary says why; at the reference it failed above."""
    proc = run_pytest(tmp_path, 0.5, "test_quick", "test_heavy", calibration_s=3 * REFERENCE_CALIBRATION_S)
    assert proc.returncode == 0, proc.stdout
    assert "fast-tier limit 1.5 s: 0.5 s at the reference speed" in proc.stdout, proc.stdout
    assert scaled_limit(30.0, REFERENCE_CALIBRATION_S / 2) == 30.0  # a faster machine: never stricter
    assert scaled_limit(30.0, 2.4 * REFERENCE_CALIBRATION_S) == pytest.approx(72.0)
    assert 0.0 < calibrate(rounds=2) < 10.0  # it measures (the interpreter work takes ~0.08 s here)
