"""Building a run from its config: the only place below the CLI that reads the whole ``Config``.

Every part below this floor takes its own config section or a plain settings record; the builders
here read the config once and hand them out (docs/architecture.md)."""

from agentrl.assembly.evaluation import evaluate
from agentrl.assembly.trainer import make_trainer, train

__all__ = ["evaluate", "make_trainer", "train"]
