"""A pytest plugin (loaded by tests/conftest.py): the fast tier stays fast.

Every test of the fast tier (marked none of ``OTHER_TIERS``: ``bash scripts/test.sh -m "not slow"``
runs them) must run its body (pytest's ``call`` phase; shared fixtures' setup is not the test's own)
within ``FAST_LIMIT_S`` seconds; the session fails naming each one that
took longer, so a test that grew heavy moves to the ``slow`` tier or gets lighter. With
``AGENTRL_TEST_DURATIONS=FILE`` every test's phases are also written to FILE as JSON (nodeid ->
{setup, call, teardown, fast_tier, start, worker}), for finding where the suite's time goes."""

from __future__ import annotations

import json
import os
from collections import defaultdict

import pytest

FAST_LIMIT_S = float(os.environ.get("AGENTRL_FAST_TEST_LIMIT_S", "30"))
"""The most a fast-tier test's body may take, in seconds (``AGENTRL_FAST_TEST_LIMIT_S``)."""
OTHER_TIERS = frozenset({"slow", "vllm", "verifiers", "study"})
"""Markers of the tiers outside the fast one (the vLLM and verifiers tiers run in their own
environments, the study's measurements only on request): no limit there."""


class Durations:
    """Collects every test report's duration on the controller (xdist's workers send theirs)."""

    def __init__(self, limit_s: float, out: str | None) -> None:
        self.limit_s, self.out = limit_s, out
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

    def pytest_terminal_summary(self, terminalreporter) -> None:  # type: ignore[no-untyped-def]
        over = getattr(self, "over", {})
        if over:
            terminalreporter.section(f"fast-tier tests over {self.limit_s:g} s", sep="=", red=True)
            for nodeid, seconds in sorted(over.items(), key=lambda kv: -kv[1]):
                terminalreporter.write_line(
                    f"{seconds:7.1f} s  {nodeid}: make it lighter or mark it slow (tests/helpers/durations.py)"
                )


def register(config: pytest.Config) -> None:
    """Install the plugin on the process that sees every report (xdist's controller, or the only one)."""
    if hasattr(config, "workerinput"):  # an xdist worker: its reports reach the controller
        return
    config.pluginmanager.register(
        Durations(FAST_LIMIT_S, os.environ.get("AGENTRL_TEST_DURATIONS")), "agentrl-durations"
    )


pytest_configure = register  # `pytest -p tests.helpers.durations` loads it too (tests/test_durations.py)
