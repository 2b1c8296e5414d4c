"""Shared helpers for the sandbox tests: which backends can run here (with the reason when not), and
leak checks (no process, cgroup, container or context left behind)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandboxes import IsolationUnavailable, Limits, make_sandbox
from sandboxes.base import owner_tag, process_start_time

FAST = Limits(
    wall_s=2.0, cpu_s=2.0, memory_bytes=256 << 20, processes=32, output_bytes=4096, file_bytes=1 << 20
)
DOCKER_SOCK = "/tmp/agentrl-docker/docker.sock"


def docker_options() -> dict:
    """Docker options for tests: ``DOCKER_HOST`` if set, else the private engine of .ci/docker_setup.sh."""
    if os.environ.get("DOCKER_HOST"):
        return {}
    if Path(DOCKER_SOCK).exists():
        return {"base_url": f"unix://{DOCKER_SOCK}"}
    return {}


def make_or_skip(backend: str, limits: Limits = FAST, **options):
    """A sandbox, or ``pytest.skip`` with the reason it cannot run here (never a silent pass)."""
    if backend == "docker":
        options = {**docker_options(), **options}
    try:
        return make_sandbox(backend, limits=limits, **options)
    except IsolationUnavailable as e:
        pytest.skip(f"{backend} sandbox unavailable here: {e}")


def our_children() -> list[tuple[int, str]]:
    """(pid, cmdline) of sandbox processes descended from this test process."""
    from sandboxes.process import descendants

    out = []
    for pid in descendants(os.getpid()):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if "bwrap" in cmd or "agentrl-end" in cmd or "Drain" in cmd:
            out.append((pid, cmd[:120]))
    return out


def our_cgroups() -> list[str]:
    tag = f"{os.getpid()}-{process_start_time(os.getpid())}-"
    found = []
    for ctl in ("memory", "pids"):
        base = Path("/sys/fs/cgroup") / ctl / "agentrl"
        if base.is_dir():
            found += [str(d) for d in base.iterdir() if d.name.startswith(tag)]
    return found


def our_containers() -> list[str]:
    try:
        from sandboxes.docker import OWNER_LABEL, connect

        client = connect(docker_options().get("base_url"))
    except Exception:
        return []
    cs = client.api.containers(all=True, filters={"label": f"{OWNER_LABEL}={owner_tag()}"})
    return [c["Id"][:12] for c in cs]


def assert_nothing_left() -> None:
    assert our_children() == []
    assert our_cgroups() == []
    assert our_containers() == []
