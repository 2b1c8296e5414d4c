"""``agentrl`` command line (``cli/main.py``, the parser and the commands): train | sft | eval | rollout | serve | export | plan |
study | models | plot | envs | replay | inspect | doctor."""

from agentrl.cli.args import train_config
from agentrl.cli.exits import EXIT_GRACE_S, entry, exit_past_stuck_threads
from agentrl.cli.main import build_parser, main

__all__ = ["EXIT_GRACE_S", "build_parser", "entry", "exit_past_stuck_threads", "main", "train_config"]
