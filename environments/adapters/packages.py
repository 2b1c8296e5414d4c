"""An adapter's package, imported when the adapter is used, or an ``ImportError`` naming the extra."""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, extra: str, env: str) -> ModuleType:
    """Import ``module`` for the ``env`` adapter, or say which ``pip install`` brings it. Call it
    with literal arguments: tests/test_dependencies.py checks each ``extra`` against pyproject."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"environment {env!r} needs the {extra} package, which is not installed: "
            f"pip install 'agentrl[{extra}]' ({type(e).__name__}: {e})"
        ) from e
