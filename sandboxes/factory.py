"""Sandboxes by name: one ``SandboxRecord`` per backend in ``SANDBOXES`` (``register_sandbox``; the
config's ``sandbox.backend`` takes its choices from here), ``make_sandbox``, and the process-wide
session pools (``shared_pool``): one sandbox per spec, its warm workers paid for once, not per episode.

Adding a backend: one module with a ``Sandbox`` (``sandboxes/base.py``) that registers its record,
``register_sandbox(SandboxRecord("mine", MySandbox))``."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sandboxes.base import Limits, Sandbox, SandboxSpec, SessionPool


@dataclass(frozen=True)
class SandboxRecord:
    """A backend: ``builder(limits, **options) -> Sandbox``."""

    name: str
    builder: Callable[..., Sandbox]
    isolated: bool = True
    """Keeps model-written code away from this machine's user, files and network; an unisolated
    backend is refused unless ``sandbox.allow_unisolated`` accepts the risk."""
    keys: Mapping[str, str] = field(default_factory=dict)
    """The builder's options it takes from the ``sandbox`` section: option name -> ``sandbox.<key>``
    (a key whose value is None is not passed)."""


SANDBOXES: dict[str, SandboxRecord] = {}


def register_sandbox(record: SandboxRecord) -> SandboxRecord:
    """Add a backend; a second record under a taken name is refused."""
    if record.name in SANDBOXES and SANDBOXES[record.name] != record:
        raise ValueError(f"a sandbox backend named {record.name!r} is already registered")
    SANDBOXES[record.name] = record
    return record


def make_sandbox(
    backend: str = "bwrap", limits: Limits | dict[str, Any] | None = None, **options: Any
) -> Sandbox:
    """Build a sandbox by name. ``limits`` is a ``Limits`` or a dict of its fields; other options go to
    the backend's constructor (see each backend's docstring). Raises ``IsolationUnavailable`` when the
    backend cannot isolate here (e.g. no user namespaces for bwrap): never falls back silently."""
    if backend not in SANDBOXES:
        raise ValueError(f"unknown sandbox backend {backend!r}; valid: {', '.join(sorted(SANDBOXES))}")
    if isinstance(limits, dict):
        limits = Limits(**limits)
    return SANDBOXES[backend].builder(limits, **options)


def _bwrap(limits: Limits | None, **options: Any) -> Sandbox:
    from sandboxes.bwrap import BwrapSandbox

    options.pop("allow_unisolated", None)
    return BwrapSandbox(limits, **options)


def _unisolated(limits: Limits | None, **options: Any) -> Sandbox:
    from sandboxes.bwrap import UnisolatedSandbox

    return UnisolatedSandbox(limits, **options)


def _docker(limits: Limits | None, **options: Any) -> Sandbox:
    from sandboxes.docker import DockerSandbox

    return DockerSandbox(limits, **options)


def _e2b(limits: Limits | None, **options: Any) -> Sandbox:
    from sandboxes.e2b import E2BSandbox

    return E2BSandbox(limits, **options)


register_sandbox(SandboxRecord("bwrap", _bwrap))
register_sandbox(SandboxRecord("docker", _docker, keys={"image": "docker_image"}))
register_sandbox(SandboxRecord("e2b", _e2b, keys={"template": "e2b_template"}))
register_sandbox(
    SandboxRecord("unisolated", _unisolated, isolated=False, keys={"allow_unisolated": "allow_unisolated"})
)

_POOLS: dict[str, SessionPool] = {}
_POOLS_LOCK = threading.Lock()


def shared_pool(spec: SandboxSpec) -> SessionPool:
    """The process-wide session pool for ``spec``: one sandbox per spec, made on first use (warm
    workers, the Docker client and cgroup setup are paid once, not per episode). Closed at exit, or
    by ``close_shared_pools``."""
    key = spec.key()
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None or pool.closed:
            sandbox = make_sandbox(spec.backend, **dict(spec.options))
            pool = _POOLS[key] = SessionPool(sandbox, spec.max_sessions, spec.warm_sessions)
        return pool


def close_shared_pools() -> None:
    """Close every shared pool and its sandbox (their sessions included)."""
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for pool in pools:
        pool.close()
        pool.sandbox.close()
