"""``agentrl`` command line (``cli/main.py``): train | sft | eval | rollout | serve | export | plan |
study | models | plot | envs | replay | inspect | doctor."""

from agentrl.cli.main import EXIT_GRACE_S, build_parser, entry, exit_past_stuck_threads, main, train_config

__all__ = ["EXIT_GRACE_S", "build_parser", "entry", "exit_past_stuck_threads", "main", "train_config"]
