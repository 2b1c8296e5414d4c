"""A pytest plugin (loaded by tests/conftest.py): the fast tier stays fast.

Every test of the fast tier (marked none of ``OTHER_TIERS``: ``bash scripts/test.sh -m "not slow"``
runs them) must run its body (pytest's ``call`` phase; shared fixtures' setup is not the test's own)
within ``FAST_LIMIT_S`` seconds on a machine of the reference speed; the session fails naming each one
that took longer, so a test that grew heavy moves to the ``slow`` tier or gets lighter.

The limit scales with the machine: before the tests start, the controller times a fixed piece of
interpreter work (``calibrate``), and on a machine slower than the reference the limit grows by the
same factor (never shrinks below ``FAST_LIMIT_S``). A fixed limit in seconds failed CI on a slower
machine where every test passed (2026-11-30: a 2-core AVX-512 EPYC, the whole suite 2.4 times the
time of the AVX2 machine the limit was set on, one fast test at 31.5 s against 30). With
``AGENTRL_TEST_DURATIONS=FILE`` every test's phases are also written to FILE as JSON (nodeid ->
{setup, call, teardown, fast_tier, start, worker}), for finding where the suite's time goes."""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict

import pytest

FAST_LIMIT_S = float(os.environ.get("AGENTRL_FAST_TEST_LIMIT_S", "30"))
"""The most a fast-tier test's body may take, in seconds (``AGENTRL_FAST_TEST_LIMIT_S``)."""
REFERENCE_CALIBRATION_S = 0.034
"""``calibrate()`` on the machine ``FAST_LIMIT_S`` was set on (the 2-core AVX2 EPYC, 2026-11-29).
Estimated, not measured there: 0.081 s measured on the slower machine of 2026-11-30, divided by 2.4,
the ratio of the two machines' suite times (1,857 s at 9adf0b7 against 772 s at 648ded7, both
fresh clones alone). The summary prints each session's calibration, so a log from the reference
machine can replace the estimate."""
OTHER_TIERS = frozenset({"slow", "vllm", "verifiers", "study"})
"""Markers of the tiers outside the fast one (the vLLM and verifiers tiers run in their own
environments, the study's measurements only on request): no limit there."""


def _interpreter_work() -> int:
    d: dict[str, int] = {}
    for i in range(60_000):
        k = f"k{i % 5000}"
        d[k] = d.get(k, 0) + len(k)
    top = sorted(d.items(), key=lambda kv: (-kv[1], kv[0]))[:100]
    return sum(v for _, v in top) + sum(i * i for i in range(100_000))


def calibrate(rounds: int = 7) -> float:
    """Seconds of a fixed piece of interpreter work (dict, string, sort and arithmetic: what a fast
    test's imports and tiny model steps mostly are), the fastest of ``rounds`` (~0.5 s in all on
    the 2026-11-30 machine): the machine's speed, with the noise of a busy moment taken out."""
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        _interpreter_work()
        best = min(best, time.perf_counter() - t)
    return best


def scaled_limit(limit_s: float, calibration_s: float) -> float:
    """``limit_s`` on this machine: as many times longer as the calibration is slower than the
    reference's, never shorter."""
    return limit_s * max(1.0, calibration_s / REFERENCE_CALIBRATION_S)


def _calibration() -> float:
    """``AGENTRL_TEST_CALIBRATION_S`` where set (the reference's value holds the limit at
    ``FAST_LIMIT_S`` on any machine), else ``calibrate()``."""
    fixed = os.environ.get("AGENTRL_TEST_CALIBRATION_S")
    return float(fixed) if fixed else calibrate()


class Durations:
    """Collects every test report's duration on the controller (xdist's workers send theirs)."""

    def __init__(
        self, limit_s: float, out: str | None, calibration_s: float = REFERENCE_CALIBRATION_S
    ) -> None:
        self.base_s, self.calibration_s, self.out = limit_s, calibration_s, out
        self.limit_s = scaled_limit(limit_s, calibration_s)
        self.phases: dict[str, dict[str, float | str]] = defaultdict(dict)
        self.fast: dict[str, bool] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.phases[report.nodeid][report.when] = report.duration
        if report.when == "setup":  # where and when it began: the suite's timeline, for balancing workers
            self.phases[report.nodeid]["start"] = report.start
            node = getattr(report, "node", None)  # xdist's controller adds the worker that ran it
            self.phases[report.nodeid]["worker"] = node.gateway.id if node is not None else "main"
        self.fast[report.nodeid] = not OTHER_TIERS & set(report.keywords)

    def over_limit(self) -> dict[str, float]:
        """The fast-tier tests whose body took longer than the limit, with their seconds."""
        return {
            nodeid: phases["call"]
            for nodeid, phases in self.phases.items()
            if self.fast[nodeid] and phases.get("call", 0.0) > self.limit_s
        }

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.out:
            rows = {k: {**v, "fast_tier": self.fast[k]} for k, v in self.phases.items()}
            with open(self.out, "w") as f:
                json.dump(rows, f, indent=1, sort_keys=True)
        over = self.over_limit()
        if over and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        self.over = over

    def describe(self) -> str:
        return (
            f"fast-tier limit {self.limit_s:.1f} s: {self.base_s:g} s at the reference speed, this machine's "
            f"calibration {self.calibration_s:.3f} s against {REFERENCE_CALIBRATION_S:g} s (tests/helpers/durations.py)"
        )

    def pytest_terminal_summary(self, terminalreporter) -> None:  # type: ignore[no-untyped-def]
        over = getattr(self, "over", {})
        if not over:
            terminalreporter.write_line(self.describe())
        if over:
            terminalreporter.section(f"fast-tier tests over {self.limit_s:.1f} s", sep="=", red=True)
            terminalreporter.write_line(self.describe())
            for nodeid, seconds in sorted(over.items(), key=lambda kv: -kv[1]):
                terminalreporter.write_line(
                    f"{seconds:7.1f} s  {nodeid}: make it lighter or mark it slow (tests/helpers/durations.py)"
                )


def register(config: pytest.Config) -> None:
    """Install the plugin on the process that sees every report (xdist's controller, or the only one)."""
    if hasattr(config, "workerinput"):  # an xdist worker: its reports reach the controller
        return
    config.pluginmanager.register(
        Durations(FAST_LIMIT_S, os.environ.get("AGENTRL_TEST_DURATIONS"), _calibration()), "agentrl-durations"
    )


pytest_configure = register  # `pytest -p tests.helpers.durations` loads it too (tests/test_durations.py)
