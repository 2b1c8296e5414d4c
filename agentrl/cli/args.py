"""A command's config from its arguments: the CONFIG file or run directory and the dotted overrides,
and the inputs checked before the command's work."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def only_overrides(args: argparse.Namespace) -> None:
    """``agentrl train a.b=1 c=2``: the first override landed in ``config``; move it back."""
    if args.config and "=" in args.config and not os.path.exists(args.config):
        args.overrides, args.config = [args.config, *args.overrides], None


def command_config(args: argparse.Namespace, extra: list[str] = ()):  # type: ignore[assignment]
    from agentrl.config import load_config

    only_overrides(args)
    return load_config(args.config, list(args.overrides) + list(extra))


def train_config(args: argparse.Namespace):
    """The config ``agentrl train`` runs: with ``--resume RUN`` and no config file, the run's own
    resolved config, then any overrides (e.g. a larger ``trainer.total_steps``)."""
    only_overrides(args)
    extra = []
    if args.resume:
        from agentrl.config import ConfigError

        if args.overwrite:
            raise ConfigError(
                "--resume continues the run in RUN_DIR and --overwrite moves it aside: give one of them"
            )
        if not Path(args.resume).is_dir():
            what = "a file" if Path(args.resume).exists() else "no such directory"
            raise ConfigError(
                f"--resume {args.resume}: {what}; --resume takes a run directory (run.output_dir)"
            )
        extra = ["run.resume=true", f"run.output_dir={args.resume}"]
        if args.config is None:
            args.config = args.resume  # a run directory holds its resolved config
    return command_config(args, extra)


def checked_inputs(cfg, **what):  # type: ignore[no-untyped-def]
    """``preflight.check_inputs`` (every input checked before any work), its notes printed."""
    from agentrl.assembly.components import apply_threads
    from agentrl.assembly.preflight import check_inputs

    checked = check_inputs(cfg, **what)
    for note in checked.notes:
        print(note, file=sys.stderr)
    apply_threads(cfg, lambda line: print(line, file=sys.stderr))
    return checked
