"""Environments from other ecosystems, run unchanged under agentrl (docs/environments.md, "Adapters").

Each adapter imports its package only when it is used, so ``agentrl envs list`` shows every adapter
whether or not its package is installed; using one without it raises an ``ImportError`` that names
the extra to install.
"""

from environments.adapters.packages import require

__all__ = ["require"]
