"""Code execution behind one contract (see ``sandboxes/base.py``).

    from sandboxes import make_sandbox, Limits
    with make_sandbox("bwrap") as sb, sb.session() as s:
        s.run("x = 2"); print(s.run("x ** 10").value)   # 1024

Backends: ``bwrap`` (embedded default), ``docker``, ``e2b``, and ``unisolated`` (no isolation; refused
unless ``allow_unisolated=True``).
"""

from __future__ import annotations

from typing import Any

from sandboxes.base import (
    ExecError,
    ExecResult,
    IsolationUnavailable,
    Limits,
    Sandbox,
    SandboxError,
    Session,
    SessionPool,
    format_result,
)

BACKENDS = ("bwrap", "docker", "e2b", "unisolated")

__all__ = [
    "BACKENDS",
    "ExecError",
    "ExecResult",
    "IsolationUnavailable",
    "Limits",
    "Sandbox",
    "SandboxError",
    "Session",
    "SessionPool",
    "format_result",
    "make_sandbox",
]


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
