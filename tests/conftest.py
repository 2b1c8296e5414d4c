"""Shared fixtures: a tiny tokenizer and model built once per session (see helpers/fixtures_models.py), and
an isolated cache directory so tests never touch the user's ~/.cache/agentrl.

scripts/test.sh runs the suite on two pytest-xdist workers (``-n 2 --dist loadgroup``); every
``ray``-marked test joins one xdist group, so one worker runs them in turn and no two local Ray
clusters start at once on the two cores."""

from __future__ import annotations

import os
import signal

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from tests.helpers import durations
from tests.helpers.fixtures_models import *  # noqa: F403


def pytest_configure(config):
    """The fast tier's time check (tests/helpers/durations.py)."""
    durations.register(config)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """The ``ray`` tests in one xdist group (a no-op without ``--dist loadgroup``)."""
    for item in items:
        if item.get_closest_marker("ray") is not None:
            item.add_marker(pytest.mark.xdist_group("ray"))


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    """AGENTRL_CACHE for the whole session unless the caller set one (CI sets it to reuse builds)."""
    if "AGENTRL_CACHE" not in os.environ:
        os.environ["AGENTRL_CACHE"] = str(tmp_path_factory.mktemp("agentrl-cache"))
    yield


@pytest.fixture
def ctrl_c():
    """SIGINT raises KeyboardInterrupt for this test, as in an interactive ``agentrl train``. A test
    run started in the background by a non-interactive shell inherits SIGINT ignored, and Python
    then leaves it ignored: a test that sends itself SIGINT would see nothing happen."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)
