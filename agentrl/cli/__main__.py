"""``python -m agentrl.cli``: the same as the ``agentrl`` command (torchrun launches it this way)."""

from agentrl.cli import entry

entry()
