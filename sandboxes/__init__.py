"""Code execution behind one contract (see ``sandboxes/base.py``).

    from sandboxes import make_sandbox, Limits
    with make_sandbox("bwrap") as sb, sb.session() as s:
        s.run("x = 2"); print(s.run("x ** 10").value)   # 1024

Backends: ``bwrap`` (embedded default), ``docker``, ``e2b``, and ``unisolated`` (no isolation; refused
unless ``allow_unisolated=True``).
"""

from sandboxes.base import (
    ExecError,
    ExecResult,
    IsolationUnavailable,
    Limits,
    Sandbox,
    SandboxError,
    SandboxSpec,
    Session,
    SessionPool,
    format_result,
)
from sandboxes.factory import (
    SANDBOXES,
    SandboxRecord,
    close_shared_pools,
    make_sandbox,
    register_sandbox,
    shared_pool,
)

__all__ = [
    "SANDBOXES",
    "ExecError",
    "ExecResult",
    "IsolationUnavailable",
    "Limits",
    "Sandbox",
    "SandboxError",
    "SandboxRecord",
    "SandboxSpec",
    "Session",
    "SessionPool",
    "close_shared_pools",
    "format_result",
    "make_sandbox",
    "register_sandbox",
    "shared_pool",
]
