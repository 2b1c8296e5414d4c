"""Shared fixtures: a tiny tokenizer and model built once per session (see helpers/fixtures_models.py), and
an isolated cache directory so tests never touch the user's ~/.cache/agentrl.

scripts/test.sh runs the suite on two pytest-xdist workers (``-n 2 --dist loadgroup``); every
``ray``-marked test joins one xdist group, so one worker runs them in turn and no two local Ray
clusters start at once on the two cores."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# An xdist worker per core (scripts/test.sh: -n 2 on 2 cores): torch's default of one thread per core
# has each worker's OpenMP team wait at every barrier for a core the other worker holds. One thread per
# worker's share of the cores, in the worker and, through OMP_NUM_THREADS, in the processes it starts
# (CLI runs; torchrun ranks and Ray actors already had one). SmolLM2's one-episode rollout test took
# 33.5 s with 2 threads and 16.0 s with 1 on a loaded 2-core machine (issue 51, 2026-11-29). A caller's
# own OMP_NUM_THREADS is kept.
XDIST_THREADS = None
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0) > 0:
    XDIST_THREADS = int(
        os.environ.setdefault(
            "OMP_NUM_THREADS",
            str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))),
        )
    )

from tests.helpers import durations  # noqa: E402  (after OMP_NUM_THREADS, before torch)
from tests.helpers.fixtures_models import *  # noqa: E402, F403


def pytest_configure(config):
    """The fast tier's time check (tests/helpers/durations.py); the xdist worker's torch threads."""
    durations.register(config)
    if XDIST_THREADS:
        import torch

        torch.set_num_threads(XDIST_THREADS)  # in case torch was imported before OMP_NUM_THREADS was set


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """The ``ray`` tests in one xdist group (a no-op without ``--dist loadgroup``).

    xdist 3.8 groups a test by appending ``@GROUP`` to its ``item._nodeid``, which pytest 9.2 no longer
    reads (a node's id is ``item._id``): no group held, the Ray tests ran on both workers at once and a
    module fixture shared by a group was built on each (issue 51). Under ``--dist loadgroup`` (the
    workers' ``loadgroup`` option) the suffix goes into the id here; xdist's own hook, after this one,
    is then a no-op (and where ``_nodeid`` is still read, it appends the same group: the scheduler
    reads the last)."""
    for item in items:
        if item.get_closest_marker("ray") is not None:
            item.add_marker(pytest.mark.xdist_group("ray"))
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        groups = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")})  # fmt: skip
        if groups and not hasattr(item, "_nodeid") and "@" not in item.nodeid:
            item._id = type(item._id).parse(f"{item.nodeid}@{'_'.join(groups)}")


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    """AGENTRL_CACHE for the whole session unless the caller set one (CI sets it to reuse builds)."""
    if "AGENTRL_CACHE" not in os.environ:
        os.environ["AGENTRL_CACHE"] = str(tmp_path_factory.mktemp("agentrl-cache"))
    yield


@pytest.fixture(scope="session")
def _ray_session():
    """Shuts down at the session's end the local Ray the ``ray_local`` tests of this worker shared."""
    yield
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


@pytest.fixture
def ray_local(_ray_session):
    """A local loopback Ray with 2 CPUs (``init_ray(num_cpus=2)``), one per session and xdist worker:
    the first test that asks starts it, the next ones reuse it (a start and stop took ~8 s per test,
    issue 51). Killing workers is fine: they are actors, not the cluster. A cluster started otherwise
    (a test's own, e.g. given GPUs) is replaced; one whose CPUs a test left held (actors, bundles) is
    shut down after it, so the next test starts a fresh one rather than wait for CPUs."""
    ray = pytest.importorskip("ray")
    from agentrl.rollout.ray_workers import init_ray

    if ray.is_initialized():
        resources = ray.cluster_resources()
        if resources.get("CPU") != 2.0 or resources.get("GPU"):
            ray.shutdown()
    init_ray(num_cpus=2)
    yield ray
    deadline = time.monotonic() + 15  # killed actors give their CPUs back asynchronously
    while ray.is_initialized() and ray.available_resources().get("CPU", 0.0) < 2.0:
        if time.monotonic() > deadline:
            ray.shutdown()
            break
        time.sleep(0.2)


@pytest.fixture
def ctrl_c():
    """SIGINT raises KeyboardInterrupt for this test, as in an interactive ``agentrl train``. A test
    run started in the background by a non-interactive shell inherits SIGINT ignored, and Python
    then leaves it ignored: a test that sends itself SIGINT would see nothing happen."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)
