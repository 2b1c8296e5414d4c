"""Sandboxes by name (``make_sandbox``) and the process-wide session pools (``shared_pool``): one
sandbox per spec, its warm workers paid for once, not per episode."""

from __future__ import annotations

import threading
from typing import Any

from sandboxes.base import Limits, Sandbox, SandboxSpec, SessionPool

BACKENDS = ("bwrap", "docker", "e2b", "unisolated")


def make_sandbox(
    backend: str = "bwrap", limits: Limits | dict[str, Any] | None = None, **options: Any
) -> Sandbox:
    """Build a sandbox by name. ``limits`` is a ``Limits`` or a dict of its fields; other options go to
    the backend's constructor (see each backend's docstring). Raises ``IsolationUnavailable`` when the
    backend cannot isolate here (e.g. no user namespaces for bwrap): never falls back silently."""
    if isinstance(limits, dict):
        limits = Limits(**limits)
    if backend == "bwrap":
        from sandboxes.bwrap import BwrapSandbox

        options.pop("allow_unisolated", None)
        return BwrapSandbox(limits, **options)
    if backend == "unisolated":
        from sandboxes.bwrap import UnisolatedSandbox

        return UnisolatedSandbox(limits, **options)
    if backend == "docker":
        from sandboxes.docker import DockerSandbox

        return DockerSandbox(limits, **options)
    if backend == "e2b":
        from sandboxes.e2b import E2BSandbox

        return E2BSandbox(limits, **options)
    raise ValueError(f"unknown sandbox backend {backend!r}; valid: {', '.join(BACKENDS)}")


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
